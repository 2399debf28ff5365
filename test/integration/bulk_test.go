package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage/postgres"
)

// TestBulkCancelWithLeasedRows: a bridge on PostgreSQL holds 60 timeouts
// for one queue and 5 for another; another instance (here the test, through
// the store) holds leases on 5 of the first queue's. DELETE
// /api/v1/timeouts?destination=Q cancels the 55 others and reports the 5;
// the CLI's cancel --destination then finds only those 5, still leased.
// Once the leases end, a bulk dispatch delivers exactly those 5: no
// cancelled message is ever delivered, no leased one lost.
func TestBulkCancelWithLeasedRows(t *testing.T) {
	t.Parallel()
	pg := requirePostgres(t)
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ADMIN_TOKEN":     adminToken,
		"DELAYBRIDGE_POLL_INTERVAL":   "200ms",
		"DELAYBRIDGE_STORE":           "postgres",
		"DELAYBRIDGE_POSTGRES_URL":    pg.URL,
		"DELAYBRIDGE_POSTGRES_SCHEMA": pg.Schema,
	})
	dest, other := b.Endpoint+".bulk", b.Endpoint+".keep"
	got := declareAndConsume(t, conn, dest)
	declareQueue(t, conn, other)
	deleteQueuesOnCleanup(t, dest, other)

	now := time.Now().UTC()
	publish := func(prefix, to string, n int, due time.Time) {
		var msgs []amqp.Publishing
		for i := range n {
			msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("%s-%02d", prefix, i), Body: []byte("x"),
				Headers: amqp.Table{"x-destination": to, "x-due-at": due.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano)}})
		}
		pub.PublishAll(b.TimeoutsQueue(), msgs)
	}
	publish("bulk", dest, 60, now.Add(time.Hour))
	publish("keep", other, 5, now.Add(3*time.Hour))
	deadline := time.Now().Add(livenessBound)
	for len(listIDs(t, b)) < 65 {
		if time.Now().After(deadline) {
			t.Fatalf("the timeouts never showed in ls: %d of 65", len(listIDs(t, b)))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Another instance leases bulk-00..bulk-04 (due first) for an hour.
	ctx := context.Background()
	st, err := postgres.Open(ctx, pg.URL, postgres.Options{Schema: pg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	leases, err := st.Lease(ctx, "other-instance", now.Add(time.Hour+30*time.Minute), 5, time.Hour)
	if err != nil || len(leases) != 5 {
		t.Fatalf("lease: %v %v", leases, err)
	}
	leased := map[string]string{}
	for _, l := range leases {
		if !strings.HasPrefix(l.ID, "bulk-0") {
			t.Fatalf("leased %q, want bulk-00..bulk-04", l.ID)
		}
		leased[l.ID] = l.Lock
	}

	code, body := adminDo(t, b, http.MethodDelete, "/api/v1/timeouts")
	if code != http.StatusBadRequest {
		t.Fatalf("DELETE /api/v1/timeouts without a filter: %d %s", code, body)
	}
	code, body = adminDo(t, b, http.MethodDelete, "/api/v1/timeouts?destination="+dest)
	var res struct {
		Cancelled *int `json:"cancelled"`
		Leased    *int `json:"leased"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &res) != nil || res.Cancelled == nil || res.Leased == nil ||
		*res.Cancelled != 55 || *res.Leased != 5 {
		t.Fatalf("DELETE ?destination=: %d %s; want 200 {cancelled 55, leased 5}", code, body)
	}
	out := mustCLI(t, b, "cancel", "--destination", dest)
	if out != "cancelled 0 timeouts\n5 more were being dispatched and were left alone\n" {
		t.Fatalf("cancel --destination after the bulk cancel: %q", out)
	}
	left := listIDs(t, b)
	if len(left) != 10 {
		t.Fatalf("%d timeouts left, want the 5 leased and the 5 of %s: %v", len(left), other, left)
	}
	for id := range leased {
		if _, ok := left[id]; !ok {
			t.Errorf("leased %s was cancelled", id)
		}
	}

	// The other instance gives its leases back; a bulk dispatch sends them.
	for id, lock := range leased {
		if err := st.Release(ctx, id, lock, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	out = mustCLI(t, b, "dispatch", "--destination", dest)
	if out != "dispatching 5 timeouts\n" {
		t.Fatalf("dispatch --destination: %q", out)
	}
	arr := got.WaitFor(5, livenessBound)
	arr = got.Quiet(2 * time.Second)
	if len(arr) != 5 {
		t.Fatalf("%d messages delivered, want the 5 that were leased", len(arr))
	}
	for _, a := range arr {
		if _, ok := leased[a.MessageId]; !ok {
			t.Errorf("cancelled %s was delivered", a.MessageId)
		}
	}
	if n := len(listIDs(t, b, "--destination", other)); n != 5 {
		t.Errorf("%d timeouts of %s left, want 5", n, other)
	}
	// Reschedule in bulk: the other queue's, by a shift.
	out = mustCLI(t, b, "reschedule", "--destination", other, "--shift", "-1h")
	if out != "rescheduled 5 timeouts\n" {
		t.Fatalf("reschedule --shift: %q", out)
	}
	for id, r := range listIDs(t, b, "--destination", other) {
		if d := r.DueAt.Sub(now); d < 2*time.Hour-time.Second || d > 2*time.Hour+5*time.Second {
			t.Errorf("%s due %s after a shift of -1h, want about 2h from the start", id, d)
		}
	}
}
