package nsbtimeout

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/cron"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/wire"
)

// TestParseRecurring: x-delaybridge-cron makes a recurring schedule named
// by the message id, first firing at the next fire time in its zone; the
// forwarded message has no schedule or due-time headers; what cannot make
// a schedule is refused with a reason that names the header.
func TestParseRecurring(t *testing.T) {
	now := time.Date(2026, 3, 29, 0, 30, 0, 0, time.UTC)
	d := &amqp.Delivery{MessageId: "daily", Body: []byte("b"), Headers: amqp.Table{
		wire.HeaderDestination: "q", wire.HeaderCron: "30 2 * * *", wire.HeaderTimeZone: "Europe/Berlin",
		wire.HeaderMisfire: "Skip", wire.HeaderEnd: "2026-12-31T00:00:00Z", wire.HeaderDueAt: "2026-01-01T00:00:00Z", "keep": "me"}}
	it := ParseHeaders(d, now)
	if it.Op != intake.OpRecur || it.ID != "daily" || it.Destination != "q" || it.Recur == nil {
		t.Fatalf("intake = %+v", it)
	}
	// 02:30 does not exist in Berlin that day: it fires at 03:30 CEST.
	if want := time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC); !it.DueAt.Equal(want) || !it.Recur.First.Equal(want) {
		t.Fatalf("first fire = %v, want %v", it.DueAt, want)
	}
	if it.Recur.Misfire != cron.MisfireSkip || it.Recur.Zone != "Europe/Berlin" || !it.Recur.End.Equal(time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("recurrence = %+v", it.Recur)
	}
	for _, h := range append(append([]string{}, wire.ScheduleHeaders...), wire.DueTimeHeaders...) {
		if _, ok := it.Msg.Headers[h]; ok {
			t.Fatalf("forwarded message keeps header %s", h)
		}
	}
	if it.Msg.Headers["keep"] != "me" {
		t.Fatalf("forwarded headers = %v", it.Msg.Headers)
	}
	if err := it.Validate(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		id      string
		headers amqp.Table
		reason  string
	}{
		{"bad cron", "x", amqp.Table{wire.HeaderCron: "61 * * * *"}, "header x-delaybridge-cron \"61 * * * *\": cron: minute"},
		{"unknown zone", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderTimeZone: "Mars/Olympus"}, "header x-delaybridge-timezone"},
		{"no id", "", amqp.Table{wire.HeaderCron: "* * * * *"}, "needs a message id"},
		{"bad misfire", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderMisfire: "Later"}, "header x-delaybridge-misfire"},
		{"bad start", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderStart: "tomorrow"}, "header x-delaybridge-start \"tomorrow\" is not an RFC 3339"},
		{"over", "x", amqp.Table{wire.HeaderCron: "* * * * *", wire.HeaderEnd: "2020-01-01T00:00:00Z"}, "has no fire time left"},
		{"no destination", "x", amqp.Table{wire.HeaderCron: "* * * * *"}, "no destination"},
	} {
		h := amqp.Table{wire.HeaderDestination: "q"}
		if tc.name == "no destination" {
			h = amqp.Table{}
		}
		for k, v := range tc.headers {
			h[k] = v
		}
		it := ParseHeaders(&amqp.Delivery{MessageId: tc.id, Headers: h}, now)
		if it.Op != intake.OpReject || !strings.Contains(it.Reason, tc.reason) {
			t.Errorf("%s: intake %v %q, want a rejection containing %q", tc.name, it.Op, it.Reason, tc.reason)
		}
	}
}
