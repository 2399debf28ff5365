package nsbtimeout

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// Due times after storage.MaxDueAt (2262) are refused at ingest, from every
// due-time header (docs/contract.md §2.3): bbolt cannot keep them in order,
// and they used to be accepted up to year 9999.
func TestParseRefusesDueTimesAfterMaxDueAt(t *testing.T) {
	received := time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		h    amqp.Table
		ok   bool
	}{
		{"x-due-at at the limit", amqp.Table{wire.HeaderDueAt: "2262-04-11T23:47:16.854775807Z"}, true},
		{"x-due-at after it", amqp.Table{wire.HeaderDueAt: "2262-04-11T23:47:16.854775808Z"}, false},
		{"x-due-at year 9999", amqp.Table{wire.HeaderDueAt: "9999-12-31T23:59:59Z"}, false},
		{"x-due-at timestamp 2300", amqp.Table{wire.HeaderDueAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{"Expire year 9999", amqp.Table{wire.HeaderNSBExpire: "9999-12-31 23:59:59:000000 Z"}, false},
		{"Expire 2262", amqp.Table{wire.HeaderNSBExpire: "2262-01-01 00:00:00:000000 Z"}, true},
		{"x-delay 200 years", amqp.Table{wire.HeaderDelay: int64(200 * 365 * 24 * time.Hour / time.Millisecond)}, true},
		{"x-delay 290 years", amqp.Table{wire.HeaderDelay: int64(290 * 365 * 24 * time.Hour / time.Millisecond)}, false},
	} {
		c.h[wire.HeaderDestination] = "orders"
		p, err := Parse(&amqp.Delivery{MessageId: "m", Headers: c.h}, received)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.ok && p.DueAt.After(storage.MaxDueAt):
			t.Errorf("%s: accepted due %s after the limit", c.name, p.DueAt)
		case !c.ok && err == nil:
			t.Errorf("%s: accepted with due %s, want it refused", c.name, p.DueAt)
		case !c.ok && !strings.Contains(err.Error(), "outside years 0000 to 2262 (the latest due time is 2262-04-11T23:47:16.854775807Z)"):
			t.Errorf("%s: reason %q does not say the range", c.name, err)
		}
	}
}
