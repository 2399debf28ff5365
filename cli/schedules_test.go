package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
)

// The schedules commands against a real admin handler over a boltstore:
// list, show, pause, resume, fire and cancel, their output, and the exit
// codes of an unknown key (1) and a usage error (2).
func TestCLISchedules(t *testing.T) {
	srv, st := cliServer(t)
	p := amqp.Publishing{Headers: amqp.Table{"tenant": "acme"}, Body: []byte("tick body")}
	enc, _ := message.Encode(nil, &p)
	next := time.Now().Add(time.Hour).Truncate(time.Minute).UTC()
	if _, err := st.PutSchedule(context.Background(), storage.Schedule{Key: "amqp:tick", Source: "amqp", Expr: "*/5 * * * *",
		Zone: "Europe/Berlin", Destination: "q", Message: enc, NextFireAt: next}); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{{"schedules"}, {"schedules", "ls"}} {
		code, out, errOut := cli(t, srv, args...)
		if code != 0 || !strings.Contains(out, "amqp:tick") || !strings.Contains(out, "active") || !strings.Contains(out, "*/5 * * * *") ||
			!strings.Contains(out, "Europe/Berlin") || !strings.Contains(out, "NEXT FIRE") {
			t.Fatalf("%v: %d %q %q", args, code, out, errOut)
		}
	}
	code, out, _ := cli(t, srv, "schedules", "ls", "--json")
	var l admin.SchedulesJSON
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Schedules) != 1 {
		t.Fatalf("ls --json: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "schedules", "show", "amqp:tick")
	if code != 0 || !strings.Contains(out, "next fires:") || strings.Count(out, "+01:00") < 5 || !strings.Contains(out, "header tenant") ||
		!strings.Contains(out, "tick body") {
		t.Fatalf("show: %d %q", code, out)
	}
	if code, out, _ = cli(t, srv, "schedules", "pause", "amqp:tick"); code != 0 || out != "paused amqp:tick\n" {
		t.Fatalf("pause: %d %q", code, out)
	}
	if code, out, _ = cli(t, srv, "schedules", "pause", "amqp:tick"); code != 0 || out != "amqp:tick was paused already\n" {
		t.Fatalf("pause again: %d %q", code, out)
	}
	if code, out, _ = cli(t, srv, "schedules"); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("ls while paused: %d %q", code, out)
	}
	if code, out, _ = cli(t, srv, "schedules", "resume", "amqp:tick"); code != 0 || out != "resumed amqp:tick\n" {
		t.Fatalf("resume: %d %q", code, out)
	}
	if code, out, _ = cli(t, srv, "schedules", "resume", "amqp:tick"); code != 0 || out != "amqp:tick was not paused\n" {
		t.Fatalf("resume again: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "schedules", "fire", "amqp:tick")
	if code != 0 || !strings.HasPrefix(out, "fired amqp:tick: amqp:tick#1@now") {
		t.Fatalf("fire: %d %q", code, out)
	}
	id := strings.Fields(out)[2]
	if row, err := st.Get(context.Background(), id); err != nil || row.Destination != "q" {
		t.Fatalf("the fire's row: %+v, %v", row, err)
	}
	if sc, err := st.GetSchedule(context.Background(), "amqp:tick"); err != nil || !sc.NextFireAt.Equal(next) || sc.Fires != 1 {
		t.Fatalf("schedule after fire: %+v, %v; want next %s unmoved, 1 fire", sc, err, next)
	}
	if code, out, _ = cli(t, srv, "schedules", "cancel", "amqp:tick"); code != 0 || out != "cancelled amqp:tick\n" {
		t.Fatalf("cancel: %d %q", code, out)
	}
	for _, verb := range []string{"show", "pause", "resume", "cancel", "fire"} {
		code, _, errOut := cli(t, srv, "schedules", verb, "amqp:tick")
		if code != exitCritical || !strings.Contains(errOut, `no schedule with key "amqp:tick"`) || !strings.Contains(errOut, "HTTP 404") {
			t.Errorf("%s of a cancelled key: %d %q; want exit 1 and the API's 404", verb, code, errOut)
		}
	}
	code, _, errOut := cli(t, srv, "schedules", "cancel", "amqp:tick", "--json")
	if code != exitCritical || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("cancel --json of a missing key: %d %q", code, errOut)
	}
	for _, args := range [][]string{{"schedules", "nope"}, {"schedules", "show"}, {"schedules", "fire", "a", "b"}, {"schedules", "ls", "--limit", "0"}} {
		if code, _, errOut := cli(t, srv, args...); code != exitConfig || errOut == "" {
			t.Errorf("%v: %d %q; want a usage error (2)", args, code, errOut)
		}
	}
	var out2, errOut2 strings.Builder
	if code := Run([]string{"schedules", "--help"}, &out2, &errOut2); code != 0 || !strings.Contains(out2.String(), "fire KEY") {
		t.Fatalf("schedules --help: %d %q %q", code, out2.String(), errOut2.String())
	}
	out2.Reset()
	if code := Run([]string{"help"}, &out2, &errOut2); code != 0 || !strings.Contains(out2.String(), "delaybridge schedules") {
		t.Fatalf("help does not list schedules: %q", out2.String())
	}
}
