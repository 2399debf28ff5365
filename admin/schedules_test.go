package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

func (f *fixture) scheduleWakes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.schedWakes
}

// The schedule endpoints end to end over a boltstore: create (201) and
// replace (200), list, show with the coming fire times in the zone, pause
// and resume (changed, the firer woken), fire now (a row due now, the
// poller woken, the schedule not moved), cancel (204, then 404).
func TestScheduleEndpoints(t *testing.T) {
	f := newFixture(t, token)
	const create = `{"id": "tick", "cron": "*/10 * * * * ?", "timezone": "Europe/Berlin", "destination": "q",
		"body": "hi", "content_type": "text/plain", "headers": {"tenant": "acme", "n": 3, "ok": true, "r": 1.5},
		"misfire": "skip", "description": "every ten seconds"}`
	var s ScheduleJSON
	f.want("POST", "/api/v1/schedules", create, 201, &s)
	if s.Key != "admin:tick" || s.ID != "tick" || s.Source != "admin" || s.State != "active" || s.Generation != 1 ||
		s.Misfire != "Skip" || s.Destination != "q" || s.NextFireAt == nil || !s.NextFireAt.Equal(t0) {
		t.Fatalf("create answered %+v", s)
	}
	want := []string{"2026-11-21T13:00:00+01:00", "2026-11-21T13:00:10+01:00", "2026-11-21T13:00:20+01:00",
		"2026-11-21T13:00:30+01:00", "2026-11-21T13:00:40+01:00"}
	if strings.Join(s.NextFireTimes, " ") != strings.Join(want, " ") {
		t.Fatalf("next fire times %v, want %v", s.NextFireTimes, want)
	}
	if s.Headers["tenant"] != "acme" || s.Headers["n"] != float64(3) || s.Headers["ok"] != true || s.Headers["r"] != 1.5 ||
		s.Properties == nil || s.Properties.ContentType != "text/plain" || s.Properties.MessageID != "tick" {
		t.Fatalf("create's message: headers %v, properties %+v", s.Headers, s.Properties)
	}
	if f.scheduleWakes() != 1 {
		t.Fatalf("create woke the firer %d times, want 1", f.scheduleWakes())
	}
	f.want("POST", "/api/v1/schedules", strings.Replace(create, `"q"`, `"q2"`, 1), 200, &s)
	if s.Generation != 2 || s.Destination != "q2" {
		t.Fatalf("replace answered generation %d destination %q", s.Generation, s.Destination)
	}

	var l SchedulesJSON
	f.want("GET", "/api/v1/schedules", "", 200, &l)
	if len(l.Schedules) != 1 || l.Schedules[0].Key != "admin:tick" || l.Schedules[0].NextFireTimes != nil || l.Schedules[0].Headers != nil {
		t.Fatalf("list = %+v", l)
	}
	s = ScheduleJSON{}
	f.want("GET", "/api/v1/schedules/admin:tick", "", 200, &s)
	if len(s.NextFireTimes) != 5 || s.BodyBase64 == nil {
		t.Fatalf("show = %+v", s)
	}
	b := f.want("GET", "/api/v1/schedules/admin:none", "", 404, nil)
	if !strings.Contains(string(b), `no schedule with key \"admin:none\"`) {
		t.Fatalf("show of a missing key: %s", b)
	}

	f.want("POST", "/api/v1/schedules/admin:tick/pause", "", 200, &s)
	if s.State != "paused" || s.Changed == nil || !*s.Changed {
		t.Fatalf("pause answered %+v", s)
	}
	f.want("POST", "/api/v1/schedules/admin:tick/pause", "", 200, &s)
	if *s.Changed {
		t.Fatalf("second pause answered %+v", s)
	}
	wakes := f.scheduleWakes()
	f.want("POST", "/api/v1/schedules/admin:tick/resume", "", 200, &s)
	if s.State != "active" || !*s.Changed || f.scheduleWakes() != wakes+1 {
		t.Fatalf("resume answered %+v, firer wakes %d (were %d)", s, f.scheduleWakes(), wakes)
	}

	var fire FireJSON
	f.want("POST", "/api/v1/schedules/admin:tick/fire", "", 200, &fire)
	id := storage.FireNowID("admin:tick", 2, t0)
	if fire.ID != id || !fire.Stored || !fire.DueAt.Equal(t0) || fire.Key != "admin:tick" {
		t.Fatalf("fire answered %+v, want id %q stored", fire, id)
	}
	row, err := f.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	p, err := message.Decode(row.Message)
	if err != nil {
		t.Fatal(err)
	}
	if row.Destination != "q2" || !row.DueAt.Equal(t0) || p.MessageId != id || string(p.Body) != "hi" ||
		p.Headers[wire.HeaderScheduleID] != "tick" || p.Headers[wire.HeaderFireTime] != "2026-11-21T12:00:00Z" || p.Headers["tenant"] != "acme" {
		t.Fatalf("fire row %+v, message %+v", row, p)
	}
	f.mu.Lock()
	woken := f.woken
	f.mu.Unlock()
	if len(woken) == 0 || !woken[len(woken)-1].Equal(t0) {
		t.Fatalf("fire now woke the poller with %v", woken)
	}
	s = ScheduleJSON{}
	f.want("GET", "/api/v1/schedules/admin:tick", "", 200, &s)
	if s.Fires != 1 || !s.NextFireAt.Equal(t0) {
		t.Fatalf("after fire now: fires %d, next %v; want 1, unmoved", s.Fires, s.NextFireAt)
	}

	f.want("DELETE", "/api/v1/schedules/admin:tick", "", 204, nil)
	f.want("DELETE", "/api/v1/schedules/admin:tick", "", 404, nil)
	for _, path := range []string{"/api/v1/schedules/admin:tick/fire", "/api/v1/schedules/admin:tick/pause", "/api/v1/schedules/admin:tick/resume"} {
		f.want("POST", path, "", 404, nil)
	}
	if _, err := f.store.Get(context.Background(), id); err == nil {
		t.Fatal("the extra fire survived the cancel")
	}
	l = SchedulesJSON{}
	f.want("GET", "/api/v1/schedules", "", 200, &l)
	if len(l.Schedules) != 0 {
		t.Fatalf("list after cancel = %+v", l)
	}
}

// A create is refused with 400 and a message naming what is wrong.
func TestScheduleCreateRefused(t *testing.T) {
	f := newFixture(t, token)
	for _, tc := range []struct{ body, want string }{
		{`{"cron": "* * * * *", "destination": "q"}`, "id is required"},
		{`{"id": "a\u0000b", "cron": "* * * * *", "destination": "q"}`, "id"},
		{`{"id": "x", "destination": "q"}`, "cron is required"},
		{`{"id": "x", "cron": "*/5 99 * * *", "destination": "q"}`, `cron \"*/5 99 * * *\": cron: hour field \"99\"`},
		{`{"id": "x", "cron": "* * *", "destination": "q"}`, `cron \"* * *\"`},
		{`{"id": "x", "cron": "* * * * *", "timezone": "Mars/Olympus", "destination": "q"}`, "timezone"},
		{`{"id": "x", "cron": "* * * * *", "misfire": "later", "destination": "q"}`, "misfire"},
		{`{"id": "x", "cron": "* * * * *", "start": "tomorrow", "destination": "q"}`, "start"},
		{`{"id": "x", "cron": "* * * * *", "end": "2020-01-01T00:00:00Z", "destination": "q"}`, "no fire time left"},
		{`{"id": "x", "cron": "* * * * *"}`, "destination (a queue) or exchange"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "exchange": "x"}`, "exclude each other"},
		{`{"id": "x", "cron": "* * * * *", "routing_key": "k"}`, "routing_key goes with exchange"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "body": "a", "body_base64": "YQ=="}`, "body and body_base64"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "body_base64": "!!"}`, "body_base64"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "headers": {"x-delaybridge-cron": "* * * * *"}}`, "bridge's own header"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "headers": {"h": {"a": 1}}}`, "string, number or boolean"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q", "nope": 1}`, "unknown field"},
		{`{"id": "x", "cron": "* * * * *", "destination": "q"} {}`, "exactly one JSON object"},
	} {
		code, _, b := f.call("POST", "/api/v1/schedules", tc.body)
		if code != 400 || !strings.Contains(string(b), tc.want) {
			t.Errorf("POST %s: %d %s; want 400 containing %q", tc.body, code, b, tc.want)
		}
	}
	var l SchedulesJSON
	f.want("GET", "/api/v1/schedules", "", 200, &l)
	if len(l.Schedules) != 0 {
		t.Fatalf("refused creates stored %+v", l.Schedules)
	}
	f.want("GET", "/api/v1/schedules?limit=0", "", 400, nil)
	f.want("GET", "/api/v1/schedules?after=x", "", 400, nil)
	f.want("GET", "/api/v1/schedules/"+strings.Repeat("k", 600), "", 400, nil)
}

// An exchange destination is taken and answered as exchange and
// routing_key; a cancelled id is 409; list pages with cursor and limit.
func TestScheduleExchangeTombstonePaging(t *testing.T) {
	f := newFixture(t, token)
	var s ScheduleJSON
	f.want("POST", "/api/v1/schedules", `{"id": "a", "cron": "0 * * * *", "exchange": "x", "routing_key": "k", "body_base64": "AAE="}`, 201, &s)
	if s.Exchange != "x" || s.RoutingKey == nil || *s.RoutingKey != "k" || s.Destination != "" || s.TimeZone != "UTC" || s.BodyBytes == nil || *s.BodyBytes != 2 {
		t.Fatalf("exchange schedule answered %+v", s)
	}
	f.want("POST", "/api/v1/schedules", `{"id": "b", "cron": "0 * * * *", "destination": "q"}`, 201, nil)
	var l SchedulesJSON
	f.want("GET", "/api/v1/schedules?limit=1", "", 200, &l)
	if len(l.Schedules) != 1 || l.Schedules[0].Key != "admin:a" || l.Next != "admin:a" {
		t.Fatalf("first page %+v", l)
	}
	var l2 SchedulesJSON
	f.want("GET", "/api/v1/schedules?limit=1&cursor="+l.Next, "", 200, &l2)
	if len(l2.Schedules) != 1 || l2.Schedules[0].Key != "admin:b" || l2.Next != "" {
		t.Fatalf("second page %+v", l2)
	}
	if err := f.store.Cancel(context.Background(), "late", storage.CancelOrdered); err == nil {
		t.Fatal("cancel of nothing succeeded")
	}
	b := f.want("POST", "/api/v1/schedules", `{"id": "late", "cron": "0 * * * *", "destination": "q"}`, 409, nil)
	if !strings.Contains(string(b), "cancelled within the cancel window") {
		t.Fatalf("409 body %s", b)
	}
}

// noScheduler is a store that keeps no schedules.
type noScheduler struct{ storage.Store }

// A store that keeps no schedules answers 501 on every schedule endpoint;
// without the token the endpoints answer 401.
func TestScheduleEndpointsUnavailable(t *testing.T) {
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { return noScheduler{s} })
	for _, c := range [][2]string{{"GET", "/api/v1/schedules"}, {"POST", "/api/v1/schedules"}, {"GET", "/api/v1/schedules/amqp:a"},
		{"DELETE", "/api/v1/schedules/amqp:a"}, {"POST", "/api/v1/schedules/amqp:a/pause"}, {"POST", "/api/v1/schedules/amqp:a/fire"}} {
		b := f.want(c[0], c[1], "", 501, nil)
		if !strings.Contains(string(b), "keeps no recurring schedules") {
			t.Errorf("%s %s: %s", c[0], c[1], b)
		}
	}
	code, _, _ := f.call("GET", "/api/v1/schedules", "", "Authorization", "")
	if code != 401 {
		t.Fatalf("without the token: %d, want 401", code)
	}
	_ = time.Second
}
