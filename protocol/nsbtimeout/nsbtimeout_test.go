package nsbtimeout

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/wire"
)

// An NServiceBus timeout (due at NServiceBus.Timeout.Expire) is stored
// marked, and forwarded as NServiceBus's timeout manager dispatches it:
// NServiceBus.TimeSent the time of the forward, NServiceBus.RelatedToTimeoutId
// the id it was stored under, the mark gone, everything else as stored.
// Messages due at x-due-at or x-delay are neither marked nor touched.
func TestNSBTimeoutForward(t *testing.T) {
	now := time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)
	timeout := func(extra amqp.Table) *amqp.Delivery {
		h := amqp.Table{
			wire.HeaderNSBExpire:               "2026-11-21 20:00:05:000000 Z",
			wire.HeaderNSBDestination:          "Shop",
			wire.HeaderNSBMessageID:            "t-1",
			wire.HeaderNSBTimeSent:             "2026-11-21 19:59:00:000000 Z",
			"NServiceBus.IsSagaTimeoutMessage": "True",
		}
		for k, v := range extra {
			h[k] = v
		}
		return &amqp.Delivery{MessageId: "t-1", Headers: h, Body: []byte("<OrderTimeout/>")}
	}
	it := ParseHeaders(timeout(nil), now)
	if it.Op != intake.OpSchedule || it.Msg.Headers[wire.HeaderNSBTimeoutStamp] == nil {
		t.Fatalf("an NServiceBus timeout was not marked: %+v", it)
	}
	sentAt := now.Add(5*time.Second + 123456789)
	got := Stamper{}.Stamp(it.Msg, "t-1", sentAt)
	want := amqp.Table{
		wire.HeaderNSBDestination:          "Shop",
		wire.HeaderNSBMessageID:            "t-1",
		"NServiceBus.IsSagaTimeoutMessage": "True",
		wire.HeaderNSBTimeSent:             "2026-11-21 20:00:05:123456 Z",
		wire.HeaderNSBRelatedToTimeoutID:   "t-1",
	}
	if diff := cmp.Diff(want, got.Headers); diff != "" {
		t.Errorf("forwarded headers (-want +got):\n%s", diff)
	}
	if got.MessageId != "t-1" || string(got.Body) != "<OrderTimeout/>" {
		t.Errorf("forward %+v", got)
	}
	if _, ok := it.Msg.Headers[wire.HeaderNSBRelatedToTimeoutID]; ok {
		t.Errorf("the stored message was changed")
	}
	for name, d := range map[string]*amqp.Delivery{
		"x-due-at wins": timeout(amqp.Table{wire.HeaderDueAt: "2026-11-21T20:00:05Z"}),
		"x-delay":       {MessageId: "d-1", Headers: amqp.Table{wire.HeaderDestination: "Shop", wire.HeaderDelay: int32(5000), wire.HeaderNSBTimeSent: "x"}},
	} {
		it := ParseHeaders(d, now)
		if it.Op != intake.OpSchedule {
			t.Fatalf("%s: %+v", name, it)
		}
		if _, ok := it.Msg.Headers[wire.HeaderNSBTimeoutStamp]; ok {
			t.Errorf("%s: marked as an NServiceBus timeout", name)
		}
		if got := (Stamper{}).Stamp(it.Msg, "d-1", sentAt); !cmp.Equal(got.Headers, it.Msg.Headers) {
			t.Errorf("%s: stamped: %v", name, got.Headers)
		}
	}
}
