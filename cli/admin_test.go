package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
)

func cliServer(t *testing.T) (*httptest.Server, *boltstore.Store) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", admin.New(admin.Options{Store: st, Token: "tok",
		Replay: func(context.Context, int) (admin.ReplayResult, error) {
			return admin.ReplayResult{Replayed: 2, Skipped: 1, Details: []admin.ReplaySkipped{{MessageID: "m", Reason: "ingest"}}}, nil
		}}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for i, id := range []string{"a/1", "b 2"} {
		p := amqp.Publishing{MessageId: id, Headers: amqp.Table{"k": "v"}, Body: []byte("hello " + id)}
		enc, _ := message.Encode(nil, &p)
		if _, err := st.Insert(context.Background(), []storage.Timeout{{ID: id, Destination: "q", DueAt: time.Now().Add(time.Duration(i+1) * time.Hour), ReceivedAt: time.Now(), Message: enc}}); err != nil {
			t.Fatal(err)
		}
	}
	return srv, st
}

func cli(t *testing.T, srv *httptest.Server, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN", "tok")
	full := append([]string{"--url", srv.URL}, args[1:]...)
	code := runAdmin(args[0], full, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCLICommands(t *testing.T) {
	srv, st := cliServer(t)

	code, out, errOut := cli(t, srv, "ls")
	if code != 0 || !strings.Contains(out, "DESTINATION") || !strings.Contains(out, "a/1") || !strings.Contains(out, "b 2") {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}
	code, out, _ = cli(t, srv, "ls", "--json", "--limit", "1")
	var page admin.ListJSON
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timeouts) != 1 || page.Next == "" {
		t.Fatalf("ls --json --limit 1: %d %s", code, out)
	}
	code, out, _ = cli(t, srv, "ls", "--json", "--limit", "1", "--all")
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timeouts) != 2 {
		t.Fatalf("ls --all: %d %s", code, out)
	}

	code, out, _ = cli(t, srv, "show", "a/1")
	if code != 0 || !strings.Contains(out, "hello a/1") || !strings.Contains(out, "header k") {
		t.Fatalf("show: %d %s", code, out)
	}
	code, out, _ = cli(t, srv, "show", "b 2", "--json")
	if code != 0 || !strings.Contains(out, `"body_base64"`) {
		t.Fatalf("show --json: %d %s", code, out)
	}

	at := time.Now().Add(5 * time.Hour).UTC().Truncate(time.Second)
	if code, out, errOut = cli(t, srv, "reschedule", "a/1", "--at", at.Format(time.RFC3339)); code != 0 {
		t.Fatalf("reschedule: %d %s %s", code, out, errOut)
	}
	if got, _ := st.Get(context.Background(), "a/1"); !got.DueAt.Equal(at) {
		t.Errorf("rescheduled to %s, want %s", got.DueAt, at)
	}
	if code, _, errOut = cli(t, srv, "reschedule", "a/1", "--in", "2h"); code != 0 {
		t.Fatalf("reschedule --in: %d %s", code, errOut)
	}
	if code, _, errOut = cli(t, srv, "dispatch", "b 2"); code != 0 {
		t.Fatalf("dispatch: %d %s", code, errOut)
	}
	if got, _ := st.Get(context.Background(), "b 2"); time.Until(got.DueAt) > time.Second {
		t.Errorf("dispatch: due %s, want now", got.DueAt)
	}
	code, out, _ = cli(t, srv, "stats")
	if code != 0 || !strings.Contains(out, "pending:") || !strings.Contains(out, "2") {
		t.Fatalf("stats: %d %s", code, out)
	}
	if code, out, _ = cli(t, srv, "cancel", "a/1"); code != 0 || !strings.Contains(out, "cancelled a/1") {
		t.Fatalf("cancel: %d %s", code, out)
	}
	code, _, errOut = cli(t, srv, "cancel", "a/1")
	if code != 1 || !strings.Contains(errOut, `no pending timeout with id "a/1"`) || !strings.Contains(errOut, "404") {
		t.Fatalf("cancel again: %d %q", code, errOut)
	}
	code, out, _ = cli(t, srv, "replay-errors", "--limit", "5")
	if code != 0 || !strings.Contains(out, "replayed 2, skipped 1") || !strings.Contains(out, "ingest") {
		t.Fatalf("replay-errors: %d %s", code, out)
	}
}

// cancel --saga-id cancels a saga's pending timeouts through the admin API.
func TestCLICancelSaga(t *testing.T) {
	srv, st := cliServer(t)
	enc, err := message.Encode(nil, &amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	rows := []storage.Timeout{
		{ID: "t1", Destination: "q", DueAt: time.Now().Add(time.Hour), SagaID: "7d3e", Message: enc},
		{ID: "t2", Destination: "q", DueAt: time.Now().Add(time.Hour), SagaID: "7d3e", Message: enc},
		{ID: "t3", Destination: "q", DueAt: time.Now().Add(time.Hour), SagaID: "other", Message: enc},
	}
	if _, err := st.Insert(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	code, out, _ := cli(t, srv, "show", "t1")
	if code != 0 || !strings.Contains(out, "saga id:") || !strings.Contains(out, "7d3e") {
		t.Fatalf("show: %d %s", code, out)
	}
	code, out, errOut := cli(t, srv, "ls", "--json", "--saga-id", "7d3e")
	var page admin.ListJSON
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil || len(page.Timeouts) != 2 ||
		page.Timeouts[0].ID != "t1" || page.Timeouts[1].ID != "t2" {
		t.Fatalf("ls --saga-id: %d %s %q", code, out, errOut)
	}
	code, out, errOut = cli(t, srv, "cancel", "--saga-id", "7d3e")
	if code != 0 || !strings.Contains(out, "cancelled 2 timeouts of saga 7d3e") {
		t.Fatalf("cancel --saga-id: %d %q %q", code, out, errOut)
	}
	for id, want := range map[string]bool{"t1": false, "t2": false, "t3": true, "a/1": true} {
		if _, err := st.Get(context.Background(), id); (err == nil) != want {
			t.Errorf("%s pending: %v, want %v", id, err == nil, want)
		}
	}
	code, out, _ = cli(t, srv, "cancel", "--json", "--saga-id", "other")
	var res admin.CancelSagaJSON
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res != (admin.CancelSagaJSON{Cancelled: 1}) {
		t.Fatalf("cancel --json --saga-id: %d %s", code, out)
	}
	for _, args := range [][]string{{"cancel"}, {"cancel", "a/1", "--saga-id", "x"}, {"cancel", "a/1", "b 2"}} {
		if code, _, _ := cli(t, srv, args...); code != exitConfig {
			t.Errorf("%v: exit %d, want %d", args, code, exitConfig)
		}
	}
	code, _, errOut = cli(t, srv, "cancel", "--saga-id", "a\x01b")
	if code != 1 || !strings.Contains(errOut, "400") || !strings.Contains(errOut, "invalid saga id") {
		t.Fatalf("cancel of an invalid saga id: %d %q", code, errOut)
	}
}

func TestCLIErrors(t *testing.T) {
	srv, _ := cliServer(t)
	for _, args := range [][]string{
		{"show"}, {"show", "a", "b"}, {"reschedule", "a/1"}, {"reschedule", "a/1", "--at", "x"},
		{"reschedule", "a/1", "--at", "2026-01-01T00:00:00Z", "--in", "1h"}, {"ls", "--limit", "0"}, {"ls", "--from", "soon"},
		{"ls", "--bogus"}, {"stats", "extra"},
	} {
		if code, _, _ := cli(t, srv, args...); code != exitConfig {
			t.Errorf("%v: exit %d, want %d", args, code, exitConfig)
		}
	}
	var out, errOut bytes.Buffer
	code := runAdmin("ls", []string{"--url", srv.URL, "--token", "wrong"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "401") || !strings.Contains(errOut.String(), "bearer token") {
		t.Errorf("wrong token: %d %q", code, errOut.String())
	}
	code = runAdmin("stats", []string{"--url", "http://127.0.0.1:1"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "cannot reach the admin API") {
		t.Errorf("unreachable: %d %q", code, errOut.String())
	}
	// A password in --url never shows, whichever way the request fails.
	for _, u := range []string{"http://admin:pw-s3cr3t@127.0.0.1:1", "http://admin:pw-s3cr3t@127.0.0.1:bad"} {
		errOut.Reset()
		code = runAdmin("stats", []string{"--url", u}, &out, &errOut)
		if code == 0 || strings.Contains(errOut.String(), "pw-s3cr3t") {
			t.Errorf("--url %s: exit %d, %q", u, code, errOut.String())
		}
	}
}

// Ids "." and ".." are dot-segments to a URL path: the CLI must escape them
// so that the API's router does not clean them away, and every command
// reaches the timeout itself (with "/" and "%" too).
func TestCLIDotSegmentIDs(t *testing.T) {
	srv, st := cliServer(t)
	ids := []string{".", "..", "../a", "a/..", "%2E", "..%2F"}
	for _, id := range ids {
		p := amqp.Publishing{MessageId: id, Body: []byte("body of " + id)}
		enc, _ := message.Encode(nil, &p)
		if _, err := st.Insert(context.Background(), []storage.Timeout{{ID: id, Destination: "q", DueAt: time.Now().Add(time.Hour), ReceivedAt: time.Now(), Message: enc}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		code, out, errOut := cli(t, srv, "show", id, "--json")
		var row admin.TimeoutJSON
		if code != 0 || json.Unmarshal([]byte(out), &row) != nil || row.ID != id {
			t.Errorf("show %q: exit %d, id %q, stdout %q, stderr %q", id, code, row.ID, out, errOut)
		}
		at := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
		if code, _, errOut := cli(t, srv, "reschedule", id, "--at", at.Format(time.RFC3339)); code != 0 {
			t.Errorf("reschedule %q: exit %d, stderr %q", id, code, errOut)
		} else if got, _ := st.Get(context.Background(), id); !got.DueAt.Equal(at) {
			t.Errorf("reschedule %q: due %s, want %s", id, got.DueAt, at)
		}
		if code, _, errOut := cli(t, srv, "dispatch", id); code != 0 {
			t.Errorf("dispatch %q: exit %d, stderr %q", id, code, errOut)
		}
		if code, out, errOut := cli(t, srv, "cancel", id); code != 0 || out != "cancelled "+id+"\n" {
			t.Errorf("cancel %q: exit %d, stdout %q, stderr %q", id, code, out, errOut)
		}
		if _, err := st.Get(context.Background(), id); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("after cancel %q: Get = %v, want ErrNotFound", id, err)
		}
	}
	// The two ids the cliServer started with are still there: no command
	// reached another timeout, or the list.
	for _, id := range []string{"a/1", "b 2"} {
		if _, err := st.Get(context.Background(), id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
}

// ls and show word an exchange destination as one, --json passes the API's
// exchange fields through (also when --all re-encodes the pages), and ls
// filters by exchange and routing key. (Needs a store that persists
// Exchange.)
func TestCLIExchangeDestinations(t *testing.T) {
	srv, st := cliServer(t)
	for i, r := range []storage.Timeout{
		{ID: "x/1", Exchange: "events", Destination: "order.created"},
		{ID: "x/2", Exchange: "broadcast"},
	} {
		p := amqp.Publishing{MessageId: r.ID, Body: []byte("body")}
		r.Message, _ = message.Encode(nil, &p)
		r.DueAt, r.ReceivedAt = time.Now().Add(time.Duration(i+3)*time.Hour), time.Now()
		if _, err := st.Insert(context.Background(), []storage.Timeout{r}); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(out string) map[string]string {
		m := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if id, _, ok := strings.Cut(l, "  "); ok { // the table pads with two spaces at least
				m[id] = l
			}
		}
		return m
	}
	code, out, errOut := cli(t, srv, "ls")
	rows := lines(out)
	if code != 0 || !strings.Contains(rows["x/1"], `exchange "events" routing key "order.created"`) ||
		!strings.Contains(rows["x/2"], `exchange "broadcast" routing key ""`) || !strings.Contains(rows["a/1"], " q ") {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}

	code, out, _ = cli(t, srv, "ls", "--exchange", "events")
	if rows := lines(out); code != 0 || len(rows) != 2 || rows["x/1"] == "" { // the header and x/1
		t.Errorf("ls --exchange events: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "ls", "--destination", "q")
	if rows := lines(out); code != 0 || len(rows) != 3 || rows["a/1"] == "" || rows["b 2"] == "" {
		t.Errorf("ls --destination q: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "ls", "--exchange", "events", "--routing-key", "order.created", "--json")
	var page admin.ListJSON
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timeouts) != 1 || page.Timeouts[0].ID != "x/1" ||
		!strings.Contains(out, `"exchange": "events"`) || !strings.Contains(out, `"routing_key": "order.created"`) {
		t.Errorf("ls --exchange --routing-key --json: %d %s", code, out)
	}
	code, out, _ = cli(t, srv, "ls", "--exchange", "events", "--routing-key", "nothing.here")
	if rows := lines(out); code != 0 || len(rows) != 1 {
		t.Errorf("ls with a routing key nothing has: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "ls", "--json", "--all", "--limit", "1")
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Timeouts) != 4 ||
		!strings.Contains(out, `"exchange": "broadcast"`) || !strings.Contains(out, `"routing_key": ""`) {
		t.Errorf("ls --json --all: %d %s", code, out)
	}

	code, out, _ = cli(t, srv, "show", "x/2")
	if code != 0 || !regexpMatch(`(?m)^exchange:\s+"broadcast"$`, out) || !regexpMatch(`(?m)^routing key:\s+""$`, out) ||
		strings.Contains(out, "destination:") {
		t.Errorf("show x/2: %d %s", code, out)
	}
	code, out, _ = cli(t, srv, "show", "a/1")
	if code != 0 || !regexpMatch(`(?m)^destination:\s+q$`, out) || strings.Contains(out, "exchange:") {
		t.Errorf("show a/1: %d %s", code, out)
	}
	code, out, _ = cli(t, srv, "show", "x/1", "--json")
	if code != 0 || !strings.Contains(out, `"exchange": "events"`) || !strings.Contains(out, `"routing_key": "order.created"`) {
		t.Errorf("show --json: %d %s", code, out)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// The exchange filters are checked as the API checks them: combinations
// before any request (usage errors), names by the API (exit 1 with its
// reason).
func TestCLIExchangeFilterErrors(t *testing.T) {
	srv, _ := cliServer(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ls", "--routing-key", "k"}, exitConfig, "--routing-key needs --exchange"},
		{[]string{"ls", "--exchange", "", "--routing-key", "k"}, exitConfig, "--routing-key needs --exchange"},
		{[]string{"ls", "--destination", "q", "--exchange", "x"}, exitConfig, "not both"},
		{[]string{"ls", "--exchange", "x", "--routing-key", ""}, 1, "empty routing key cannot be filtered on"},
		{[]string{"ls", "--exchange", "amq.default"}, 1, "default exchange"},
		{[]string{"ls", "--exchange", "x", "--routing-key", "a\tb"}, 1, "invalid routing_key filter"},
	} {
		code, out, errOut := cli(t, srv, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}
