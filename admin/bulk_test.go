package admin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

// DELETE /api/v1/timeouts?destination=Q cancels every match that is not
// leased and says how many it cancelled and how many were leased.
func TestBulkCancel(t *testing.T) {
	f := newFixture(t, token)
	for i := range 25 {
		f.insert(fmt.Sprintf("q-%02d", i), "q", t0.Add(time.Duration(i-3)*time.Second), amqp.Publishing{})
	}
	f.insert("other", "q2", t0.Add(-time.Hour), amqp.Publishing{})
	// other, q-00, q-01 leased (due, in due order).
	if ls, err := f.store.Lease(context.Background(), "o", time.Time{}, 3, time.Minute); err != nil || len(ls) != 3 {
		t.Fatalf("lease: %v %v", ls, err)
	}
	body := f.want("DELETE", "/api/v1/timeouts?destination=q", "", 200, nil)
	if want := "{\n  \"cancelled\": 23,\n  \"leased\": 2\n}\n"; string(body) != want {
		t.Fatalf("bulk cancel answered %q, want %q", body, want)
	}
	f.want("GET", tpath("q-05"), "", 404, nil)
	for _, id := range []string{"q-00", "q-01", "other"} {
		f.want("GET", tpath(id), "", 200, nil)
	}
	// Cancelled ids stay cancelled (a tombstone each).
	ins, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: "q-05", Destination: "q", DueAt: t0, Message: []byte{1}}})
	if err != nil || ins[0] != storage.Cancelled {
		t.Fatalf("insert of a bulk-cancelled id: %v %v", ins, err)
	}
	var res BulkJSON
	f.want("DELETE", "/api/v1/timeouts?due_to="+t0.Add(-time.Minute).Format(time.RFC3339), "", 200, &res)
	if *res.Cancelled != 0 || res.Leased != 1 {
		t.Fatalf("bulk cancel by due range: %+v", res)
	}
	for _, q := range []string{"", "?cursor=x&destination=q", "?limit=5&destination=q", "?destination=q&bogus=1",
		"?header=nocolon", "?header=:v", "?id_prefix=", "?due_from=2026-01-02T00:00:00Z&due_to=2026-01-01T00:00:00Z",
		"?routing_key=k"} {
		f.want("DELETE", "/api/v1/timeouts"+q, "", 400, nil)
	}
}

// POST /api/v1/timeouts/dispatch makes every match due now; a header
// selects a tenant's messages.
func TestBulkDispatch(t *testing.T) {
	f := newFixture(t, token)
	f.insert("a1", "q", t0.Add(time.Hour), amqp.Publishing{Headers: amqp.Table{"tenant": "acme"}})
	f.insert("a2", "q2", t0.Add(2*time.Hour), amqp.Publishing{Headers: amqp.Table{"tenant": []byte("acme")}})
	f.insert("b1", "q", t0.Add(time.Hour), amqp.Publishing{Headers: amqp.Table{"tenant": "other"}})
	body := f.want("POST", "/api/v1/timeouts/dispatch?header=tenant:acme", "", 200, nil)
	if want := "{\n  \"dispatched\": 2,\n  \"leased\": 0\n}\n"; string(body) != want {
		t.Fatalf("bulk dispatch answered %q, want %q", body, want)
	}
	var row TimeoutJSON
	for _, id := range []string{"a1", "a2"} {
		f.want("GET", tpath(id), "", 200, &row)
		if !row.DueAt.Equal(t0) {
			t.Fatalf("%s due %s after dispatch, want now %s", id, row.DueAt, t0)
		}
	}
	f.want("GET", tpath("b1"), "", 200, &row)
	if !row.DueAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("b1 was moved to %s", row.DueAt)
	}
	f.mu.Lock()
	woken := len(f.woken)
	f.mu.Unlock()
	if woken == 0 {
		t.Fatal("a bulk dispatch did not wake the poller")
	}
	// The list takes the same filters.
	var list ListJSON
	f.want("GET", "/api/v1/timeouts?header=tenant:acme&id_prefix=a", "", 200, &list)
	if len(list.Timeouts) != 2 || list.Timeouts[0].ID != "a1" || list.Timeouts[1].ID != "a2" {
		t.Fatalf("list by header: %+v", list.Timeouts)
	}
	f.want("POST", "/api/v1/timeouts/dispatch", "", 400, nil)
}

// POST /api/v1/timeouts/reschedule shifts by a duration or sets a time.
func TestBulkReschedule(t *testing.T) {
	f := newFixture(t, token)
	for i := range 5 {
		f.insert(fmt.Sprintf("x-%d", i), "q", t0.Add(time.Duration(i)*time.Minute), amqp.Publishing{})
	}
	f.insert("y", "q", t0, amqp.Publishing{})
	body := f.want("POST", "/api/v1/timeouts/reschedule?id_prefix=x-", `{"shift":"10m"}`, 200, nil)
	if want := "{\n  \"rescheduled\": 5,\n  \"leased\": 0,\n  \"out_of_range\": 0\n}\n"; string(body) != want {
		t.Fatalf("bulk shift answered %q, want %q", body, want)
	}
	var row TimeoutJSON
	f.want("GET", tpath("x-3"), "", 200, &row)
	if !row.DueAt.Equal(t0.Add(13 * time.Minute)) {
		t.Fatalf("x-3 due %s after a shift of 10m", row.DueAt)
	}
	var res BulkJSON
	at := t0.Add(24 * time.Hour)
	f.want("POST", "/api/v1/timeouts/reschedule?destination=q", `{"due_at":"`+at.Format(time.RFC3339)+`"}`, 200, &res)
	if *res.Rescheduled != 6 || res.OutOfRange != nil {
		t.Fatalf("bulk set due: %+v", res)
	}
	f.want("GET", tpath("y"), "", 200, &row)
	if !row.DueAt.Equal(at) {
		t.Fatalf("y due %s, want %s", row.DueAt, at)
	}
	for _, b := range []string{``, `{}`, `{"shift":"10m","due_at":"2026-01-01T00:00:00Z"}`, `{"shift":"0s"}`, `{"shift":"soon"}`,
		`{"due_at":"tomorrow"}`, `{"due_at":"2300-01-01T00:00:00Z"}`, `{"delay":"1m"}`, `{"shift":"1m"}{}`} {
		f.want("POST", "/api/v1/timeouts/reschedule?destination=q", b, 400, nil)
	}
	f.want("POST", "/api/v1/timeouts/reschedule", `{"shift":"1m"}`, 400, nil)
	// One timeout's dispatch still works (id "dispatch" included).
	f.insert("dispatch", "q", t0.Add(time.Hour), amqp.Publishing{})
	f.want("POST", tpath("dispatch")+"/dispatch", "", 200, &row)
	if !row.DueAt.Equal(t0) {
		t.Fatalf("dispatch of one timeout: due %s", row.DueAt)
	}
}

// A failing bulk action answers 500 with the error.
func TestBulkFailing(t *testing.T) {
	var fs *faultstore.Store
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { fs = faultstore.Wrap(s); return fs })
	fs.Fail(faultstore.Bulk, fmt.Errorf("disk gone"))
	b := f.want("DELETE", "/api/v1/timeouts?destination=q", "", 500, nil)
	if !strings.Contains(string(b), "disk gone") {
		t.Fatalf("failing bulk: %s", b)
	}
}
