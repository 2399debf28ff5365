package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

// POST /api/v1/destinations/{name}/pause holds the destination's timeouts
// (listed and shown as paused, not leased), GET /api/v1/destinations lists
// it, and …/resume makes them leasable again and wakes the poller.
func TestPauseResume(t *testing.T) {
	f := newFixture(t, token)
	f.insert("q-1", "q", t0.Add(-time.Minute), amqp.Publishing{})
	f.insert("q2-1", "q2", t0.Add(-time.Minute), amqp.Publishing{})

	var d DestinationJSON
	f.want("POST", "/api/v1/destinations/q/pause", `{"by": "alice"}`, 200, &d)
	if !d.Paused || d.Destination != "q" || d.By != "alice" || d.Since == nil || !d.Since.Equal(t0) || d.Changed == nil || !*d.Changed {
		t.Fatalf("pause answered %+v", d)
	}
	f.want("POST", "/api/v1/destinations/q/pause", "", 200, &d)
	if !d.Paused || d.By != "alice" || *d.Changed {
		t.Fatalf("second pause answered %+v", d)
	}
	d = DestinationJSON{}
	f.want("POST", "/api/v1/destinations/r/pause?exchange=x", "", 200, &d)
	if d.Exchange != "x" || d.RoutingKey == nil || *d.RoutingKey != "r" || d.Destination != "" {
		t.Fatalf("pause of an exchange destination answered %+v", d)
	}
	var ds DestinationsJSON
	f.want("GET", "/api/v1/destinations", "", 200, &ds)
	if len(ds.Destinations) != 2 || ds.Destinations[0].Destination != "q" || ds.Destinations[1].Exchange != "x" {
		t.Fatalf("destinations = %+v", ds)
	}

	var l ListJSON
	f.want("GET", "/api/v1/timeouts", "", 200, &l)
	if len(l.Timeouts) != 2 || !l.Timeouts[0].Paused || l.Timeouts[1].Paused {
		t.Fatalf("list while q is paused: %+v", l.Timeouts)
	}
	var one TimeoutJSON
	f.want("GET", tpath("q-1"), "", 200, &one)
	if !one.Paused {
		t.Fatal("show: not paused")
	}
	ls, err := f.store.Lease(context.Background(), "o", time.Time{}, 10, time.Minute)
	if err != nil || len(ls) != 1 || ls[0].ID != "q2-1" {
		t.Fatalf("Lease while q is paused = %v, %v", ls, err)
	}

	f.mu.Lock()
	f.woken = nil
	f.mu.Unlock()
	d = DestinationJSON{}
	f.want("POST", "/api/v1/destinations/q/resume", "", 200, &d)
	if d.Paused || !*d.Changed || d.Since != nil {
		t.Fatalf("resume answered %+v", d)
	}
	f.want("POST", "/api/v1/destinations/q/resume", "", 200, &d)
	if *d.Changed {
		t.Fatalf("second resume answered %+v", d)
	}
	f.mu.Lock()
	woken := len(f.woken)
	f.mu.Unlock()
	if woken == 0 {
		t.Fatal("resume did not wake the poller")
	}
	if ls, err := f.store.Lease(context.Background(), "o", time.Time{}, 10, time.Minute); err != nil || len(ls) != 1 || ls[0].ID != "q-1" {
		t.Fatalf("Lease after resume = %v, %v", ls, err)
	}
	f.want("GET", "/api/v1/destinations", "", 200, &ds)
	if len(ds.Destinations) != 1 {
		t.Fatalf("destinations after resume = %+v", ds)
	}

	for _, p := range []string{"/api/v1/destinations/q/pause?bogus=1", "/api/v1/destinations/q/pause?exchange=amq.default",
		"/api/v1/destinations/q%00x/pause"} {
		f.want("POST", p, "", 400, nil)
	}
	f.want("POST", "/api/v1/destinations/q/pause", `{"reason": 1}`, 400, nil)
	f.want("GET", "/api/v1/destinations/q/pause", "", 405, nil)
}

// A pause needs the admin token, as every write.
func TestPauseNeedsToken(t *testing.T) {
	f := newFixture(t, token)
	req, _ := http.NewRequest("POST", f.srv.URL+"/api/v1/destinations/q/pause", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("pause without a token: %d", resp.StatusCode)
	}
	if ps, err := f.store.Paused(context.Background()); err != nil || len(ps) != 0 {
		t.Fatalf("paused without a token: %v, %v", ps, err)
	}
}

// A failing pause, resume or list of pauses answers 500 with the error.
func TestPauseFailing(t *testing.T) {
	var fs *faultstore.Store
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { fs = faultstore.Wrap(s); return fs })
	for _, op := range []faultstore.Op{faultstore.Pause, faultstore.Resume, faultstore.Paused} {
		fs.Fail(op, errors.New("disk gone"))
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/api/v1/destinations/q/pause"},
		{"POST", "/api/v1/destinations/q/resume"},
		{"GET", "/api/v1/destinations"},
	} {
		if b := f.want(c.method, c.path, "", 500, nil); !strings.Contains(string(b), "disk gone") {
			t.Errorf("%s %s: %s, want the store's error", c.method, c.path, b)
		}
	}
	// A pause that went through but whose listing failed is a failure too.
	fs.Fail(faultstore.Pause, nil)
	f.want("POST", "/api/v1/destinations/q/pause", "", 500, nil)
}
