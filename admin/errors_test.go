package admin

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/wire"
)

// newErrorsFixture serves the admin API over a Replayer on the test broker
// (an error queue of the test's own) and a boltstore.
func newErrorsFixture(t *testing.T) (*fixture, *replayEnv) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := newReplayEnv(t, st)
	e.rp.Rules.Allowed = e.rp.Rules.Allowed.WithExchanges("ok.x")
	f := &fixture{t: t, store: st, now: t0}
	h := New(Options{Store: st, Token: token, Now: func() time.Time { return t0 },
		Wake:   func(at time.Time) { f.mu.Lock(); f.woken = append(f.woken, at); f.mu.Unlock() },
		Errors: e.rp.Errors})
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", h)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f, e
}

// order reads the error queue's message ids head first, leaving it as it
// was (a classic queue puts requeued messages back in their places).
func (e *replayEnv) order() []string {
	e.t.Helper()
	var ids []string
	var tags []uint64
	for {
		d, ok, err := e.ch.Get(e.errorQ, false)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			break
		}
		ids, tags = append(ids, d.MessageId), append(tags, d.DeliveryTag)
	}
	for _, tag := range tags {
		if err := e.ch.Nack(tag, false, true); err != nil {
			e.t.Fatal(err)
		}
	}
	e.waitDepth(len(ids))
	return ids
}

func epath(id, suffix string) string { return "/api/v1/errors/" + url.PathEscape(id) + suffix }

func TestErrorQueueView(t *testing.T) {
	f, e := newErrorsFixture(t)
	foreign := e.dispatchCopy("d1", "ok.other")
	foreign.Headers = withHeader(foreign.Headers, wire.HeaderNSBFailedQ, "Other.Timeouts")
	ingestCopy := errorqueue.Copy(amqp.Publishing{MessageId: "i1", Body: []byte("x"), Headers: amqp.Table{wire.HeaderDestination: "ok.in"}},
		errorqueue.Facts{Reason: "no due time", Stage: wire.StageIngest, FailedAt: t0, FailedQ: wire.TimeoutsQueue(e.endpoint)})
	exDest := wire.Destination{Exchange: "ok.x", Key: "rk"}
	exCopy := errorqueue.Copy(amqp.Publishing{MessageId: "d3", Body: []byte("body of d3")},
		errorqueue.Facts{Reason: "nack", Stage: wire.StageDispatch, Attempts: 6, FailedAt: t0.Add(time.Minute),
			FailedQ: wire.TimeoutsQueue(e.endpoint), Forward: &exDest})
	forbidden := e.dispatchCopy("d4", "not.allowed")
	e.publish(e.dispatchCopy("d1", "ok.one"), foreign, ingestCopy, e.dispatchCopy("d2", "ok.two"), exCopy, forbidden)
	all := []string{"d1", "d1", "i1", "d2", "d3", "d4"}

	// List: this endpoint's copies, in queue order, and the queue as it was.
	var l ErrorListJSON
	f.want("GET", "/api/v1/errors", "", 200, &l)
	var ids []string
	for _, c := range l.Errors {
		ids = append(ids, c.ID)
	}
	if !slices.Equal(ids, []string{"d1", "i1", "d2", "d3", "d4"}) || l.Scanned != 6 || l.OtherEndpoints != 1 || l.Next != "" {
		t.Fatalf("list %v scanned %d other %d next %q", ids, l.Scanned, l.OtherEndpoints, l.Next)
	}
	if c := l.Errors[3]; c.Position != 4 || c.Stage != "dispatch" || c.Exchange != "ok.x" || c.RoutingKey == nil || *c.RoutingKey != "rk" ||
		c.Destination != "" || c.Attempts != 6 || c.Reason != "nack" || c.ExceptionType != wire.ExceptionTypeDispatch ||
		c.FailedAt == nil || !c.FailedAt.Equal(t0.Add(time.Minute)) || c.Headers != nil {
		t.Errorf("exchange copy %+v", c)
	}
	if c := l.Errors[1]; c.Stage != "ingest" || c.Destination != "ok.in" || c.ExceptionType != wire.ExceptionTypeIngest {
		t.Errorf("ingest copy %+v", c)
	}
	if got := e.order(); !slices.Equal(got, all) {
		t.Fatalf("queue after list %v, want %v", got, all)
	}

	// Pages: limit 2, then from the cursor.
	f.want("GET", "/api/v1/errors?limit=2", "", 200, &l)
	if len(l.Errors) != 2 || l.Errors[1].ID != "i1" || l.Next != "3" {
		t.Fatalf("page 1 %+v next %q", l.Errors, l.Next)
	}
	f.want("GET", "/api/v1/errors?limit=2&cursor="+l.Next, "", 200, &l)
	if len(l.Errors) != 2 || l.Errors[0].ID != "d2" || l.Errors[1].ID != "d3" || l.Next != "5" {
		t.Fatalf("page 2 %+v next %q", l.Errors, l.Next)
	}
	// scan bounds the read: a page that reads 2 messages and stops.
	f.want("GET", "/api/v1/errors?scan=2", "", 200, &l)
	if len(l.Errors) != 1 || l.Scanned != 2 || l.Next != "2" {
		t.Fatalf("scan=2: %+v scanned %d next %q", l.Errors, l.Scanned, l.Next)
	}

	// Filters.
	for q, want := range map[string][]string{
		"stage=dispatch":                  {"d1", "d2", "d3", "d4"},
		"stage=ingest":                    {"i1"},
		"destination=ok.two":              {"d2"},
		"exchange=ok.x":                   {"d3"},
		"exchange=ok.x&routing_key=other": nil,
		"exception_type=" + url.QueryEscape(wire.ExceptionTypeIngest):              {"i1"},
		"failed_from=" + url.QueryEscape(t0.Add(time.Second).Format(time.RFC3339)): {"d3"},
		"id=d1": {"d1"},
	} {
		f.want("GET", "/api/v1/errors?"+q, "", 200, &l)
		ids = nil
		for _, c := range l.Errors {
			ids = append(ids, c.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("%s: %v, want %v", q, ids, want)
		}
	}
	for _, q := range []string{"stage=x", "limit=0", "scan=0", "cursor=-1", "routing_key=a", "failed_from=x"} {
		f.want("GET", "/api/v1/errors?"+q, "", 400, nil)
	}

	// Show: message, headers, body; another endpoint's copy is not shown.
	f.want("GET", epath("d2", ""), "", 200, &l)
	if len(l.Errors) != 1 || l.Errors[0].Headers["custom"] != "kept" || l.Errors[0].BodyBase64 == nil || l.Errors[0].Properties.MessageID != "d2" {
		t.Errorf("show d2 %+v", l.Errors)
	}
	f.want("GET", epath("nope", ""), "", 404, nil)

	// Replay checks the allow-list: d4's destination is not allowed.
	var r ErrorReplayJSON
	f.want("POST", epath("d4", "/replay"), "", 200, &r)
	if r.Replayed != 0 || r.Skipped != 1 || len(r.Details) != 1 || !strings.Contains(r.Details[0].Reason, "DELAYBRIDGE_ALLOWED_DESTINATIONS") {
		t.Errorf("replay d4 %+v", r)
	}
	if _, err := f.store.Get(context.Background(), "d4"); err == nil {
		t.Error("d4 stored")
	}
	// Replay one: only this endpoint's d1, not the other's.
	f.want("POST", epath("d1", "/replay"), "", 200, &r)
	if r.Replayed != 1 || r.Skipped != 0 {
		t.Errorf("replay d1 %+v", r)
	}
	if row, err := f.store.Get(context.Background(), "d1"); err != nil || row.Destination != "ok.one" || !row.DueAt.Equal(t0) {
		t.Errorf("d1 stored %+v %v", row, err)
	}
	// Filtered replay: the exchange copy.
	f.want("POST", "/api/v1/errors/replay?exchange=ok.x", "", 200, &r)
	if r.Replayed != 1 {
		t.Errorf("replay exchange=ok.x %+v", r)
	}
	if row, err := f.store.Get(context.Background(), "d3"); err != nil || row.Exchange != "ok.x" || row.Destination != "rk" {
		t.Errorf("d3 stored %+v %v", row, err)
	}
	if got := e.order(); !slices.Equal(got, []string{"d1", "i1", "d2", "d4"}) {
		t.Fatalf("queue after replays %v", got)
	}
	if len(f.woken) != 2 {
		t.Errorf("woken %d times, want 2", len(f.woken))
	}

	// Delete: one id, then a filter; no filter needs all=true.
	var del ErrorDeleteJSON
	f.want("DELETE", epath("d2", ""), "", 200, &del)
	if del.Deleted != 1 {
		t.Errorf("delete d2 %+v", del)
	}
	f.want("DELETE", epath("d2", ""), "", 404, nil)
	f.want("DELETE", "/api/v1/errors", "", 400, nil)
	f.want("DELETE", "/api/v1/errors?stage=ingest", "", 200, &del)
	if del.Deleted != 1 {
		t.Errorf("delete stage=ingest %+v", del)
	}
	if got := e.order(); !slices.Equal(got, []string{"d1", "d4"}) {
		t.Fatalf("queue after deletes %v", got)
	}
	f.want("DELETE", "/api/v1/errors?all=true", "", 200, &del)
	if del.Deleted != 1 { // d4; the other endpoint's d1 stays
		t.Errorf("delete all %+v", del)
	}
	if got := e.order(); !slices.Equal(got, []string{"d1"}) {
		t.Fatalf("queue after delete all %v", got)
	}
}

func withHeader(h amqp.Table, k string, v any) amqp.Table {
	out := maps.Clone(h)
	out[k] = v
	return out
}

// A copy the AMQP client cannot read neither ends a list nor a delete: it is
// reported, held aside during the pass, and left on the queue.
func TestErrorQueueViewAroundAnUnreadableCopy(t *testing.T) {
	f, e := newErrorsFixture(t)
	e.passConns(e.holdOn)
	e.publish(e.dispatchCopy("a", "ok.q"), unreadableCopy("poison"), e.dispatchCopy("b", "ok.q"))
	var l ErrorListJSON
	f.want("GET", "/api/v1/errors", "", 200, &l)
	if len(l.Errors) != 2 || l.Errors[0].ID != "a" || l.Errors[1].ID != "b" || len(l.Unreadable) != 1 || l.Unreadable[0].MessageID != "poison" {
		t.Fatalf("list %+v unreadable %+v", l.Errors, l.Unreadable)
	}
	e.waitDepth(3)
	var del ErrorDeleteJSON
	f.want("DELETE", "/api/v1/errors?stage=dispatch", "", 200, &del)
	if del.Deleted != 2 {
		t.Errorf("delete %+v", del)
	}
	e.waitDepth(1)
}
