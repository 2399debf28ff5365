package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
)

// cancel, dispatch and reschedule with filters act on every match through
// the admin API's bulk actions and print their counts.
func TestCLIBulk(t *testing.T) {
	srv, st := cliServer(t) // a/1 and b 2, queue q, due in 1 and 2 hours
	ctx := context.Background()
	var rows []storage.Timeout
	base := time.Now()
	for i := range 30 {
		tenant := "acme"
		if i%2 == 1 {
			tenant = "other"
		}
		enc, err := message.Encode(nil, &amqp.Publishing{Headers: amqp.Table{"tenant": tenant}})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, storage.Timeout{ID: fmt.Sprintf("bulk-%02d", i), Destination: "orders", Message: enc,
			DueAt: base.Add(time.Duration(i+1) * time.Hour)})
	}
	if _, err := st.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	due := func(id string) time.Time {
		t.Helper()
		r, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return r.DueAt
	}

	before := due("bulk-04")
	code, out, errOut := cli(t, srv, "reschedule", "--id-prefix", "bulk-0", "--shift", "30m")
	if code != 0 || out != "rescheduled 10 timeouts\n" {
		t.Fatalf("reschedule --shift: %d %q %q", code, out, errOut)
	}
	if got := due("bulk-04"); !got.Equal(before.Add(30 * time.Minute)) {
		t.Fatalf("bulk-04 due %s after a shift of 30m from %s", got, before)
	}
	if due("bulk-10").Sub(due("bulk-09")) != 30*time.Minute {
		t.Fatal("the shift moved bulk-10, outside the id prefix")
	}
	at := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	code, out, _ = cli(t, srv, "reschedule", "--destination", "orders", "--from", "19h30m", "--at", at.Format(time.RFC3339), "--json")
	var res admin.BulkJSON
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Rescheduled == nil || *res.Rescheduled != 11 {
		t.Fatalf("reschedule --from --at --json: %d %s", code, out)
	}
	code, out, errOut = cli(t, srv, "dispatch", "--header", "tenant:acme", "--to", "5h")
	if code != 0 || out != "dispatching 2 timeouts\n" { // bulk-00 (1h30m), bulk-02 (3h30m); bulk-04 is due 5h30m
		t.Fatalf("dispatch --header: %d %q %q", code, out, errOut)
	}
	if time.Until(due("bulk-02")) > time.Minute {
		t.Fatalf("bulk-02 not dispatched: due %s", due("bulk-02"))
	}
	code, out, errOut = cli(t, srv, "ls", "--header", "tenant:other", "--id-prefix", "bulk-1", "--json", "--all")
	var page admin.ListJSON
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timeouts) != 5 {
		t.Fatalf("ls --header --id-prefix: %d %s %s", code, out, errOut)
	}
	// One lease: reported, not silently skipped.
	if ls, err := st.Lease(ctx, "o", time.Time{}, 1, time.Minute); err != nil || len(ls) != 1 {
		t.Fatalf("lease: %v %v", ls, err)
	}
	code, out, errOut = cli(t, srv, "cancel", "--destination", "orders")
	if code != 0 || out != "cancelled 29 timeouts\n1 more were being dispatched and were left alone\n" {
		t.Fatalf("cancel --destination: %d %q %q", code, out, errOut)
	}
	code, out, _ = cli(t, srv, "cancel", "--destination", "orders", "--json")
	if code != 0 || !strings.Contains(out, `"cancelled": 0`) || !strings.Contains(out, `"leased": 1`) {
		t.Fatalf("cancel --destination --json: %d %s", code, out)
	}
	for _, id := range []string{"a/1", "b 2"} {
		if _, err := st.Get(ctx, id); err != nil {
			t.Fatalf("%s (queue q) was touched: %v", id, err)
		}
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"cancel", "a/1", "--destination", "q"}, exitConfig, "not both"},
		{[]string{"cancel", "--saga-id", "s", "--destination", "q"}, exitConfig, "give one of"},
		{[]string{"dispatch", "a/1", "--destination", "q"}, exitConfig, "not both"},
		{[]string{"dispatch"}, exitConfig, "give exactly one timeout ID, or filters"},
		{[]string{"reschedule", "--destination", "q"}, exitConfig, "exactly one of --at, --in or --shift"},
		{[]string{"reschedule", "--destination", "q", "--shift", "1m", "--in", "1m"}, exitConfig, "exactly one of --at, --in or --shift"},
		{[]string{"reschedule", "a/1", "--shift", "1m"}, exitConfig, "--shift moves"},
		{[]string{"reschedule", "--destination", "q", "--shift", "0s"}, exitConfig, "non-zero duration"},
		{[]string{"cancel", "--header", "nocolon"}, 1, "must be name:value"},
		{[]string{"cancel", "--destination", "q", "--from", "soon"}, exitConfig, "--from"},
	} {
		code, out, errOut := cli(t, srv, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}
