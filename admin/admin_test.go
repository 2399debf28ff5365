package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

const token = "s3cret-token"

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

type fixture struct {
	t     *testing.T
	store *boltstore.Store
	srv   *httptest.Server
	now   time.Time
	mu    sync.Mutex
	woken []time.Time
	// schedWakes counts the calls of Options.ScheduleWake.
	schedWakes int
}

func newFixture(t *testing.T, tok string) *fixture { return newFixtureOver(t, tok, nil) }

// newFixtureOver serves wrap(the fixture's boltstore); nil wrap serves the
// boltstore itself.
func newFixtureOver(t *testing.T, tok string, wrap func(storage.Store) storage.Store) *fixture {
	f := &fixture{t: t, now: t0}
	clock := func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f.store = st
	var served storage.Store = st
	if wrap != nil {
		served = wrap(st)
	}
	h := New(Options{Store: served, Token: tok, Now: clock, Wake: func(at time.Time) {
		f.mu.Lock()
		f.woken = append(f.woken, at)
		f.mu.Unlock()
	}, ScheduleWake: func() {
		f.mu.Lock()
		f.schedWakes++
		f.mu.Unlock()
	}, Replay: func(ctx context.Context, limit int) (ReplayResult, error) {
		return ReplayResult{Replayed: limit, Skipped: 1}, nil
	}})
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", h) // as httpapi mounts it
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) insert(id, dest string, due time.Time, p amqp.Publishing) {
	f.t.Helper()
	enc, err := message.Encode(nil, &p)
	if err != nil {
		f.t.Fatal(err)
	}
	ins, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: id, Destination: dest, DueAt: due, ReceivedAt: t0, Message: enc}})
	if err != nil || ins[0] != storage.Stored {
		f.t.Fatalf("insert %q: %v %v", id, ins, err)
	}
}

// insertPendingLeased inserts pending, due in an hour, and leased, due
// already and then leased (for a minute), to queue q.
func (f *fixture) insertPendingLeased(pending, leased string) {
	f.t.Helper()
	f.insert(pending, "q", t0.Add(time.Hour), amqp.Publishing{})
	f.insert(leased, "q", t0.Add(-time.Second), amqp.Publishing{})
	if _, err := f.store.Lease(context.Background(), "o", time.Time{}, 10, time.Minute); err != nil {
		f.t.Fatal(err)
	}
}

// insertSend stores another send of id (fingerprint fp), which must land
// under the key of send number n.
func (f *fixture) insertSend(id, dest string, due time.Time, p amqp.Publishing, n string) {
	f.t.Helper()
	enc, err := message.Encode(nil, &p)
	if err != nil {
		f.t.Fatal(err)
	}
	ts := []storage.Timeout{{ID: id, Destination: dest, DueAt: due, ReceivedAt: t0, Message: enc, Fingerprint: []byte("send " + n)}}
	ins, err := f.store.Insert(context.Background(), ts)
	if err != nil || ins[0] != storage.Stored || ts[0].ID != id+"\x1f"+n {
		f.t.Fatalf("insert of send %s of %q: %v %v, key %q", n, id, ins, err, ts[0].ID)
	}
}

// call does a request with the token and returns status, body.
func (f *fixture) call(method, path, body string, hdr ...string) (int, http.Header, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func (f *fixture) want(method, path, body string, code int, into any) []byte {
	f.t.Helper()
	got, h, b := f.call(method, path, body)
	if got != code {
		f.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, got, code, b)
	}
	if code >= 400 {
		var e ErrorJSON
		if err := json.Unmarshal(b, &e); err != nil || e.Error == "" || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
			f.t.Fatalf("%s %s: error body %q (content-type %q) is not a JSON error", method, path, b, h.Get("Content-Type"))
		}
	}
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			f.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
	return b
}

func tpath(id string) string { return "/api/v1/timeouts/" + url.PathEscape(id) }

func TestAuth(t *testing.T) {
	f := newFixture(t, token)
	for _, tc := range []struct{ name, auth string }{
		{"none", ""}, {"wrong", "Bearer nope"}, {"prefix", "Bearer " + token[:5]}, {"basic", "Basic " + token},
		{"longer", "Bearer " + token + "x"},
	} {
		code, h, b := f.call("GET", "/api/v1/stats", "", "Authorization", tc.auth)
		if code != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: status %d, WWW-Authenticate %q; want 401 Bearer", tc.name, code, h.Get("WWW-Authenticate"))
		}
		if strings.Contains(string(b), token) {
			t.Errorf("%s: the answer reveals the token: %s", tc.name, b)
		}
	}
	// Unauthenticated requests learn nothing, not even whether a route exists.
	if code, _, _ := f.call("DELETE", tpath("x"), "", "Authorization", ""); code != http.StatusUnauthorized {
		t.Errorf("unauthenticated DELETE: %d, want 401", code)
	}
	f.want("GET", "/api/v1/stats", "", 200, nil)
	if code, _, _ := f.call("GET", "/api/v1/stats", "", "Authorization", "bearer "+token); code != 200 {
		t.Errorf("lower-case scheme: %d, want 200", code)
	}
}

func TestDisabledWithoutToken(t *testing.T) {
	f := newFixture(t, "")
	for _, auth := range []string{"", "Bearer ", "Bearer x"} {
		code, _, b := f.call("GET", "/api/v1/timeouts", "", "Authorization", auth)
		if code != http.StatusNotFound || !strings.Contains(string(b), "disabled") {
			t.Errorf("auth %q: %d %s, want 404 saying disabled", auth, code, b)
		}
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	f := newFixture(t, token)
	f.want("GET", "/api/v1/nope", "", 404, nil)
	f.want("PUT", tpath("a"), "", 405, nil)
	f.want("POST", "/api/v1/stats", "", 405, nil)
}

func TestListFiltersAndPagination(t *testing.T) {
	f := newFixture(t, token)
	for i := range 7 {
		dest := "q.a"
		if i%2 == 1 {
			dest = "q.b"
		}
		f.insert(fmt.Sprintf("id-%d", i), dest, t0.Add(time.Duration(7-i)*time.Minute), amqp.Publishing{Body: []byte("x")})
	}
	var all ListJSON
	f.want("GET", "/api/v1/timeouts", "", 200, &all)
	if len(all.Timeouts) != 7 || all.Next != "" {
		t.Fatalf("list all: %d rows, next %q", len(all.Timeouts), all.Next)
	}
	for i := 1; i < len(all.Timeouts); i++ {
		if all.Timeouts[i].DueAt.Before(all.Timeouts[i-1].DueAt) {
			t.Fatalf("not in due order: %+v", all.Timeouts)
		}
	}
	if all.Timeouts[0].ID != "id-6" || all.Timeouts[0].Destination != "q.a" || all.Timeouts[0].Leased {
		t.Errorf("first row %+v", all.Timeouts[0])
	}

	var b ListJSON
	f.want("GET", "/api/v1/timeouts?destination=q.b", "", 200, &b)
	if len(b.Timeouts) != 3 {
		t.Errorf("destination filter: %d rows, want 3", len(b.Timeouts))
	}
	q := url.Values{"due_from": {t0.Add(2 * time.Minute).Format(time.RFC3339)}, "due_to": {t0.Add(5 * time.Minute).Format(time.RFC3339)}}
	var r ListJSON
	f.want("GET", "/api/v1/timeouts?"+q.Encode(), "", 200, &r)
	if len(r.Timeouts) != 3 || r.Timeouts[0].ID != "id-5" || r.Timeouts[2].ID != "id-3" {
		t.Errorf("due range [2m,5m): %+v", r.Timeouts)
	}

	// Pages of 3 cover everything once, in order.
	var ids []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		var p ListJSON
		f.want("GET", "/api/v1/timeouts?limit=3&cursor="+url.QueryEscape(cursor), "", 200, &p)
		for _, x := range p.Timeouts {
			ids = append(ids, x.ID)
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if strings.Join(ids, ",") != "id-6,id-5,id-4,id-3,id-2,id-1,id-0" {
		t.Errorf("paged ids %v", ids)
	}

	for _, bad := range []string{"due_from=yesterday", "due_to=2026-13-01T00:00:00Z", "limit=0", "limit=1001", "limit=x",
		"cursor=zz", "due_from=2026-11-21T13:00:00Z&due_to=2026-11-21T12:00:00Z"} {
		f.want("GET", "/api/v1/timeouts?"+bad, "", 400, nil)
	}
}

func TestShow(t *testing.T) {
	f := newFixture(t, token)
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	body := []byte{0, 1, 2, 0xfe, 0xff, 'h', 'i'}
	f.insert("a/b c%d", "q.dest", t0.Add(time.Hour), amqp.Publishing{
		ContentType: "application/octet-stream", MessageId: "a/b c%d", CorrelationId: "corr", DeliveryMode: 2, Priority: 3,
		Timestamp: ts, Type: "T", AppId: "app",
		Headers: amqp.Table{
			"str": "s", "i16": int16(-7), "i64": int64(1) << 40, "f": 1.5, "bool": true, "bytes": []byte("\x00\x01"),
			"time": ts, "dec": amqp.Decimal{Scale: 2, Value: 12345}, "nested": amqp.Table{"inner": []byte("z"), "n": int32(3)},
			"arr": []any{"x", int32(1), []byte("y")}, "nil": nil, "x-destination": "q.dest",
		},
		Body: body,
	})
	var got map[string]any
	f.want("GET", tpath("a/b c%d"), "", 200, &got)
	if got["id"] != "a/b c%d" || got["destination"] != "q.dest" || got["leased"] != false {
		t.Errorf("summary fields %v", got)
	}
	if got["body_base64"] != base64.StdEncoding.EncodeToString(body) {
		t.Errorf("body_base64 %v", got["body_base64"])
	}
	props := got["properties"].(map[string]any)
	if props["content_type"] != "application/octet-stream" || props["correlation_id"] != "corr" || props["delivery_mode"] != 2.0 ||
		props["priority"] != 3.0 || props["timestamp"] != "2026-01-02T03:04:05Z" || props["app_id"] != "app" {
		t.Errorf("properties %v", props)
	}
	h := got["headers"].(map[string]any)
	wantH := map[string]any{
		"str": "s", "i16": -7.0, "i64": float64(int64(1) << 40), "f": 1.5, "bool": true, "bytes": "AAE=",
		"time": "2026-01-02T03:04:05Z", "dec": "123.45", "nil": nil,
	}
	for k, v := range wantH {
		if h[k] != v {
			t.Errorf("header %s = %#v, want %#v", k, h[k], v)
		}
	}
	if n := h["nested"].(map[string]any); n["inner"] != "eg==" || n["n"] != 3.0 {
		t.Errorf("nested %v", n)
	}
	if a := h["arr"].([]any); len(a) != 3 || a[2] != "eQ==" {
		t.Errorf("arr %v", a)
	}
	f.want("GET", tpath("missing"), "", 404, nil)
}

func TestDecimalString(t *testing.T) {
	for _, tc := range []struct {
		d    amqp.Decimal
		want string
	}{{amqp.Decimal{Scale: 0, Value: 5}, "5"}, {amqp.Decimal{Scale: 3, Value: -5}, "-0.005"}, {amqp.Decimal{Scale: 2, Value: 100}, "1.00"}} {
		if got := decimalString(tc.d); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestCancel(t *testing.T) {
	f := newFixture(t, token)
	f.insertPendingLeased("later", "due")
	f.want("DELETE", tpath("due"), "", 409, nil)
	var row TimeoutJSON
	f.want("GET", tpath("due"), "", 200, &row)
	if !row.Leased || row.LockExpiresAt == nil || !row.LockExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("leased row %+v", row)
	}
	if code, _, b := f.call("DELETE", tpath("later"), ""); code != 204 || len(b) != 0 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	f.want("DELETE", tpath("later"), "", 404, nil)
	f.want("GET", tpath("later"), "", 404, nil)
}

// A cancel that finds nothing answers 404 and does not block the id: the
// next message with it is stored (docs/contract.md §6.3). One that removed
// the message blocks its id for the cancel window, as before.
func TestCancelOfNothingDoesNotBlockTheID(t *testing.T) {
	f := newFixture(t, token)
	f.want("DELETE", tpath("typo"), "", 404, nil)
	f.insert("typo", "q", t0.Add(time.Hour), amqp.Publishing{})
	f.want("DELETE", tpath("typo"), "", 204, nil)
	ins, err := f.store.Insert(context.Background(), []storage.Timeout{{ID: "typo", Destination: "q", DueAt: t0, Message: []byte{1}}})
	if err != nil || ins[0] != storage.Cancelled {
		t.Fatalf("insert after a cancel that removed the id = %v, %v; want cancelled", ins, err)
	}
}

// Two sends of one id pending: the list shows both, the later one with its
// send number; show answers the one due first with how many are pending;
// the id filter lists them; a cancel by the id removes both.
func TestSendsOfOneID(t *testing.T) {
	f := newFixture(t, token)
	f.insert("other", "q", t0.Add(time.Minute), amqp.Publishing{})
	f.insert("m", "q", t0.Add(time.Hour), amqp.Publishing{Body: []byte("first")})
	f.insertSend("m", "q", t0.Add(30*time.Minute), amqp.Publishing{Body: []byte("second")}, "2")
	var list ListJSON
	f.want("GET", "/api/v1/timeouts", "", 200, &list)
	if len(list.Timeouts) != 3 || list.Timeouts[1].ID != "m" || list.Timeouts[1].Send != 2 ||
		list.Timeouts[2].ID != "m" || list.Timeouts[2].Send != 0 {
		t.Fatalf("list = %+v; want other, then m send 2, then m", list.Timeouts)
	}
	var show TimeoutJSON
	f.want("GET", tpath("m"), "", 200, &show)
	if show.Send != 2 || show.Sends != 2 || show.BodyBase64 == nil || *show.BodyBase64 != base64.StdEncoding.EncodeToString([]byte("second")) {
		t.Fatalf("show = %+v; want send 2 (due first), 2 sends, its body", show)
	}
	f.want("GET", "/api/v1/timeouts?id=m", "", 200, &list)
	if len(list.Timeouts) != 2 {
		t.Fatalf("list by id = %+v; want both sends", list.Timeouts)
	}
	f.want("GET", "/api/v1/timeouts?id=%1F", "", 400, nil)
	f.want("DELETE", tpath("m"), "", 204, nil)
	f.want("GET", tpath("m"), "", 404, nil)
	f.want("GET", tpath("other"), "", 200, nil)
}

// DELETE /api/v1/timeouts?saga_id=S cancels the saga's pending timeouts,
// reports those being dispatched, and leaves other sagas alone.
func TestCancelSaga(t *testing.T) {
	f := newFixture(t, token)
	enc, err := message.Encode(nil, &amqp.Publishing{})
	if err != nil {
		t.Fatal(err)
	}
	var rows []storage.Timeout
	for _, r := range []struct {
		id, saga string
		due      time.Duration
	}{{"s-due", "S", -time.Second}, {"s-later", "S", time.Hour}, {"s-other", "S2", time.Hour}, {"plain", "", time.Hour}} {
		rows = append(rows, storage.Timeout{ID: r.id, Destination: "q", DueAt: t0.Add(r.due), ReceivedAt: t0, SagaID: r.saga, Message: enc})
	}
	if _, err := f.store.Insert(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Lease(context.Background(), "o", time.Time{}, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	var row TimeoutJSON
	f.want("GET", tpath("s-later"), "", 200, &row)
	if row.SagaID != "S" {
		t.Fatalf("show: saga_id %q, want S", row.SagaID)
	}
	var res CancelSagaJSON
	body := f.want("DELETE", "/api/v1/timeouts?saga_id=S", "", 200, &res)
	if res != (CancelSagaJSON{Cancelled: 1, Leased: 1}) || !strings.Contains(string(body), `"cancelled": 1`) || !strings.Contains(string(body), `"leased": 1`) {
		t.Fatalf("cancel saga: %s", body)
	}
	f.want("GET", tpath("s-later"), "", 404, nil)
	for _, id := range []string{"s-due", "s-other", "plain"} {
		f.want("GET", tpath(id), "", 200, nil)
	}
	f.want("DELETE", "/api/v1/timeouts?saga_id=nobody", "", 200, &res)
	if res != (CancelSagaJSON{}) {
		t.Fatalf("cancel of a saga with nothing pending: %+v", res)
	}
	for _, q := range []string{"", "?saga_id=", "?saga_id=a%00b", "?saga_id=S&saga_id=T", "?saga=S", "?saga_id=S&destination=q"} {
		f.want("DELETE", "/api/v1/timeouts"+q, "", 400, nil)
	}
}

// A failing saga cancel answers 500.
func TestCancelSagaFailing(t *testing.T) {
	var fs *faultstore.Store
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { fs = faultstore.Wrap(s); return fs })
	fs.Fail(faultstore.CancelSaga, errors.New("disk gone"))
	f.want("DELETE", "/api/v1/timeouts?saga_id=S", "", 500, nil)
}

func TestReschedule(t *testing.T) {
	f := newFixture(t, token)
	f.insertPendingLeased("r", "busy")
	newDue := t0.Add(2 * time.Hour).Add(123 * time.Millisecond)
	var row TimeoutJSON
	f.want("PATCH", tpath("r"), `{"due_at": "`+newDue.Format(time.RFC3339Nano)+`"}`, 200, &row)
	if !row.DueAt.Equal(newDue) || row.ID != "r" {
		t.Errorf("after reschedule %+v", row)
	}
	got, _ := f.store.Get(context.Background(), "r")
	if !got.DueAt.Equal(newDue) {
		t.Errorf("stored due %s, want %s", got.DueAt, newDue)
	}
	for _, bad := range []string{``, `{}`, `{"due_at": "tomorrow"}`, `{"due_at": 5}`, `{"due_at": "2026-11-21T12:00:00Z", "x": 1}`,
		`{"due_at": "2026-11-21T12:00:00Z"} {}`, `[`, `{"due_at": "3000-01-01T00:00:00Z"}`} {
		f.want("PATCH", tpath("r"), bad, 400, nil)
	}
	f.want("PATCH", tpath("nope"), `{"due_at": "2026-11-21T12:00:00Z"}`, 404, nil)
	f.want("PATCH", tpath("busy"), `{"due_at": "2026-11-21T12:00:00Z"}`, 409, nil)
}

func TestDispatchNow(t *testing.T) {
	f := newFixture(t, token)
	f.insert("d", "q", t0.Add(time.Hour), amqp.Publishing{})
	var row TimeoutJSON
	f.want("POST", tpath("d")+"/dispatch", "", 200, &row)
	if !row.DueAt.Equal(t0) {
		t.Errorf("due %s, want now %s", row.DueAt, t0)
	}
	leases, err := f.store.Lease(context.Background(), "o", time.Time{}, 10, time.Minute)
	if err != nil || len(leases) != 1 || leases[0].ID != "d" {
		t.Fatalf("after dispatch-now the row is not leasable: %v %v", leases, err)
	}
	f.mu.Lock()
	woken := len(f.woken)
	f.mu.Unlock()
	if woken != 1 {
		t.Errorf("poller woken %d times, want 1", woken)
	}
	f.want("POST", tpath("d")+"/dispatch", "", 409, nil)
	f.want("POST", tpath("zz")+"/dispatch", "", 404, nil)
}

func TestStats(t *testing.T) {
	f := newFixture(t, token)
	var s StatsJSON
	f.want("GET", "/api/v1/stats", "", 200, &s)
	if s.Pending == nil || *s.Pending != 0 || s.NextDue != nil {
		t.Errorf("empty stats %+v", s)
	}
	f.insert("a", "q", t0.Add(time.Minute), amqp.Publishing{})
	f.insert("b", "q", t0.Add(-time.Minute), amqp.Publishing{})
	if _, err := f.store.Lease(context.Background(), "o", time.Time{}, 10, time.Minute); err != nil {
		t.Fatal(err)
	}
	f.want("GET", "/api/v1/stats", "", 200, &s)
	if *s.Pending != 2 || *s.Leased != 1 || s.NextDue == nil || !s.NextDue.Equal(t0.Add(time.Minute)) {
		t.Errorf("stats %+v (next %v)", s, s.NextDue)
	}
}

// A failing Stats is a store error.
func TestStatsFailing(t *testing.T) {
	var fs *faultstore.Store
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { fs = faultstore.Wrap(s); return fs })
	fs.Fail(faultstore.Stats, errors.New("disk gone"))
	f.want("GET", "/api/v1/stats", "", 500, nil)
	fs.Heal()
	var s StatsJSON
	f.want("GET", "/api/v1/stats", "", 200, &s)
	if s.Pending == nil || *s.Pending != 0 || s.Leased == nil || *s.Leased != 0 {
		t.Errorf("stats after Heal %+v", s)
	}
}

func TestEscapedIDs(t *testing.T) {
	f := newFixture(t, token)
	ids := []string{"a/b", "x/dispatch", "100%", "with space", "q?x=1#f", "ünï", "a%2Fb", "/lead", "trail/"}
	for _, id := range ids {
		f.insert(id, "q", t0.Add(time.Hour), amqp.Publishing{})
	}
	for _, id := range ids {
		var row TimeoutJSON
		f.want("GET", tpath(id), "", 200, &row)
		if row.ID != id {
			t.Errorf("GET %q returned %q", id, row.ID)
		}
		f.want("PATCH", tpath(id), `{"due_at":"2027-01-01T00:00:00Z"}`, 200, &row)
		f.want("POST", tpath(id)+"/dispatch", "", 200, &row)
		if row.ID != id {
			t.Errorf("dispatch %q returned %q", id, row.ID)
		}
	}
	for _, id := range ids {
		if code, _, b := f.call("DELETE", tpath(id), ""); code != 204 {
			t.Errorf("DELETE %q: %d %s", id, code, b)
		}
	}
}

func TestReplayEndpoint(t *testing.T) {
	f := newFixture(t, token)
	var r ReplayResult
	f.want("POST", "/api/v1/replay-errors?limit=7", "", 200, &r)
	if r.Replayed != 7 || r.Skipped != 1 {
		t.Errorf("replay %+v", r)
	}
	f.want("POST", "/api/v1/replay-errors", "", 200, &r)
	if r.Replayed != DefaultLimit {
		t.Errorf("default limit %d", r.Replayed)
	}
	f.want("POST", "/api/v1/replay-errors?limit=0", "", 400, nil)
	f.want("GET", "/api/v1/replay-errors", "", 405, nil)
}
