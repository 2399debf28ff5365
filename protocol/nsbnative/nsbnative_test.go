package nsbnative

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// nsbReceivedAt is when the bridge takes the messages of these tests.
var nsbReceivedAt = time.Date(2026, 11, 21, 20, 0, 0, 250e6, time.UTC)

// asDelivered is s as a consumer of a level queue receives it, with
// deaths (x-death entries, newest first) when it was dead-lettered on the
// way. The dead-letter headers are the broker's (rabbit_dead_letter.erl):
// x-death entries with count, reason, queue, time, exchange and
// routing-keys, and x-first-death-* of the first.
func asDelivered(s nsbendpoint.Send, deaths ...amqp.Table) amqp.Delivery {
	p := s.Publishing()
	key, _ := s.Key()
	h := amqp.Table{}
	maps.Copy(h, p.Headers)
	if len(deaths) > 0 {
		list := make([]any, len(deaths))
		for i, d := range deaths {
			list[i] = d
		}
		first := deaths[len(deaths)-1]
		h["x-death"] = list
		h["x-first-death-queue"] = first["queue"]
		h["x-first-death-exchange"] = first["exchange"]
		h["x-first-death-reason"] = "expired"
	}
	return amqp.Delivery{Headers: h, MessageId: p.MessageId, DeliveryMode: p.DeliveryMode, CorrelationId: p.CorrelationId,
		Type: p.Type, ContentType: p.ContentType, ReplyTo: p.ReplyTo, Body: p.Body, RoutingKey: key, Exchange: "nsb.v2.delay-level-03"}
}

// death is one x-death entry of level queue q, dead-lettered at at.
func death(q string, at time.Time, key string) amqp.Table {
	return amqp.Table{"count": int64(1), "reason": "expired", "queue": q, "time": at, "exchange": q, "routing-keys": []any{key}}
}

func nsbSend(id string, delay int32, sent time.Time) nsbendpoint.Send {
	return nsbendpoint.Send{MessageID: id, Address: "Sales.Orders", Delay: delay, TimeSent: sent,
		Body: []byte(`{"OrderId":"42"}`), SeqNo: 7}
}

// What the bridge stores for an NServiceBus message: the message as the
// endpoint sent it (the dead-letter headers gone, the delay header kept:
// the chain delivers it and the receiving endpoint drops it), its id, the
// chain's delivery exchange with the message's own routing key, and the
// time the sender asked for (NServiceBus.DeliverAt).
func TestNSBNativeStoresTheMessageAsSent(t *testing.T) {
	sent := nsbReceivedAt.Add(-20 * time.Millisecond)
	s := nsbSend("b7a1c9e2-0001", 10, sent)
	s.DeliverAt = sent.Add(10 * time.Second)
	for _, c := range []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1} {
		d := asDelivered(s)
		_, level := s.Key()
		it := parseNSBNative(&d, nsbReceivedAt, c, level)
		key, _ := s.Key()
		if it.Op != intake.OpSchedule || it.ID != "b7a1c9e2-0001" || it.Exchange != c.Delivery || it.Destination != key {
			t.Fatalf("%s: %+v", c.Version, it)
		}
		if want := s.DeliverAt.Truncate(time.Microsecond); !it.DueAt.Equal(want) {
			t.Errorf("%s: due %v, want %v (NServiceBus.DeliverAt)", c.Version, it.DueAt, want)
		}
		if diff := cmp.Diff(s.Publishing(), it.Msg); diff != "" {
			t.Errorf("%s: stored message (-sent +stored):\n%s", c.Version, diff)
		}
		if err := it.Validate(); err != nil {
			t.Errorf("%s: %v", c.Version, err)
		}
	}
}

// The fixture is what the transport writes: the delay an AMQP int, the
// times in NServiceBus's wire format, the sequence number an AMQP long, the
// properties Fill derives.
func TestNSBEndpointFixture(t *testing.T) {
	s := nsbSend("m", 10, time.Date(2026, 11, 21, 19, 59, 58, 123456789, time.UTC))
	p := s.Publishing()
	if v, ok := p.Headers[nsbdelay.HeaderDelay].(int32); !ok || v != 10 {
		t.Errorf("delay header %#v", p.Headers[nsbdelay.HeaderDelay])
	}
	if v := p.Headers[nsbdelay.HeaderTimeSent]; v != "2026-11-21 19:59:58:123456 Z" {
		t.Errorf("time sent %#v", v)
	}
	if v, ok := p.Headers[nsbdelay.HeaderPublishSeqNo].(int64); !ok || v != 7 {
		t.Errorf("sequence number %#v", p.Headers[nsbdelay.HeaderPublishSeqNo])
	}
	if p.DeliveryMode != amqp.Persistent || p.Type != "Sales.Messages.OrderTimeout" || p.ContentType != "application/json" ||
		p.ReplyTo != "Sales" || p.CorrelationId != "m" || p.MessageId != "m" {
		t.Errorf("properties %+v", p)
	}
	if key, level := s.Key(); key != "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.0.Sales.Orders" || level != 3 {
		t.Errorf("key %q level %d", key, level)
	}
}

// The due time, per case, and the bounds of what the chain could do: it
// delivers between receipt plus the key's digits below the level and
// receipt plus the level's TTL more.
func TestNSBNativeDueTime(t *testing.T) {
	r := nsbReceivedAt
	sec := func(n float64) time.Duration { return time.Duration(n * float64(time.Second)) }
	level := func(s nsbendpoint.Send) int { _, k := s.Key(); return k }
	// RequestTimeout(at T0 + 60 s) at T0 = r - 3 s, in a handler that took
	// 3 s more: dispatched at r, the transport's delay is 57 s.
	handler := nsbSend("handler", 57, r.Add(-3*time.Second))
	handler.DeliverAt = r.Add(-3*time.Second + 60*time.Second)
	handlerBefore77 := nsbSend("handler-7.6", 57, r.Add(-3*time.Second))
	// A delayed retry keeps the failed message's time sent and DeliverAt,
	// hours old; its retries timestamp is its own.
	retry := nsbSend("retry", 10, r.Add(-2*time.Hour))
	retry.Retried = r.Add(-5 * time.Millisecond)
	retry.DeliverAt = r.Add(-2*time.Hour + time.Minute)
	// From NServiceBus 8 a retry of a message that had no DeliverAt gets
	// one of its own, stamped after the retries timestamp.
	retry8 := nsbSend("retry-8", 10, r.Add(-2*time.Hour))
	retry8.Retried = r.Add(-5 * time.Millisecond)
	retry8.DeliverAt = r.Add(-4*time.Millisecond + 10*time.Second)
	// DeliverAt not after the time sent: no send stamps that.
	stale := nsbSend("stale", 10, r.Add(-time.Second))
	stale.DeliverAt = r.Add(-time.Minute)
	drained := nsbSend("drained", 1000, r.Add(-100*time.Second))
	drained.DeliverAt = r.Add(-100*time.Second + 1000*time.Second)
	raw := nsbSend("raw", 10, r)
	rekeyed := nsbSend("rekeyed", 600, r.Add(-3010*time.Second)) // the key spells 600, the header 3600
	for _, c := range []struct {
		name  string
		d     amqp.Delivery
		level int
		want  time.Time
	}{
		// The time the sender asked for, not the time sent plus the delay
		// (3 s early); the chain delivers it at r + 57 s too.
		{"DeliverAt of this send", asDelivered(handler), level(handler), r.Add(57 * time.Second)},
		// NServiceBus before 7.7 sends no DeliverAt: what the key says is
		// left from receipt, never the time sent plus the delay.
		{"no DeliverAt", asDelivered(handlerBefore77), level(handlerBefore77), r.Add(57 * time.Second)},
		// Sent 100 s before it is taken (a queue drained at start-up):
		// still the time asked for.
		{"drained", asDelivered(drained), 9, r.Add(-100*time.Second + 1000*time.Second)},
		// ... and, without DeliverAt, the latest the chain would deliver
		// it: late by the time it waited, never early.
		{"drained without DeliverAt", func() amqp.Delivery {
			d := asDelivered(drained)
			delete(d.Headers, nsbdelay.HeaderDeliverAt)
			return d
		}(), 9, r.Add(1000 * time.Second)},
		// A delayed retry's DeliverAt is the failed message's: ignored,
		// so not delivered at once (its lower bound, r + 2 s, is no due
		// time either).
		{"delayed retry", asDelivered(retry), level(retry), r.Add(10 * time.Second)},
		{"delayed retry with a DeliverAt of its own", asDelivered(retry8), level(retry8), r.Add(-4*time.Millisecond + 10*time.Second)},
		{"DeliverAt before the time sent", asDelivered(stale), level(stale), r.Add(10 * time.Second)},
		// A DeliverAt further out than the chain could deliver (the
		// sender's clock ahead) cannot make it later than the chain would.
		{"DeliverAt ahead", func() amqp.Delivery {
			s := nsbSend("ahead", 10, r)
			s.DeliverAt = r.Add(time.Hour)
			return asDelivered(s)
		}(), 3, r.Add(10 * time.Second)},
		// Nothing to tell: the latest the chain could deliver.
		{"no NServiceBus headers", func() amqp.Delivery {
			d := asDelivered(raw)
			for _, h := range []string{nsbdelay.HeaderDelay, nsbdelay.HeaderTimeSent} {
				delete(d.Headers, h)
			}
			return d
		}(), level(raw), r.Add(10 * time.Second)},
		// Re-published by the transport's tools for what was left: the
		// time sent plus the original delay.
		{"re-keyed", func() amqp.Delivery {
			d := asDelivered(rekeyed)
			d.Headers[nsbdelay.HeaderDelay] = int32(3600)
			return d
		}(), 9, r.Add(-3010*time.Second + 3600*time.Second)},
		// 13 s = 8 + 4 + 1: dead-lettered from level 3 at 19:59:59 (whole
		// seconds) into level 2, taken 1.25 s later; the end of that
		// second plus 4 + 1 s.
		{"dead-lettered from level 3", asDelivered(nsbSend("dl", 13, r.Add(-9*time.Second)),
			death("nsb.v2.delay-level-03", r.Add(-sec(1.25)), "")), 2, r.Add(-sec(0.25) + 5*time.Second)},
		// ... dead-lettered at 20:00:00, taken 0.25 s after: what is left
		// cannot exceed 4 + 1 s from receipt.
		{"dead-lettered just now", asDelivered(nsbSend("dl2", 13, r.Add(-8*time.Second)),
			death("nsb.v2.delay-level-03", r.Add(-sec(0.25)), "")), 2, r.Add(5 * time.Second)},
		// The newest entry of this chain counts: 13 s reach level 0 after
		// levels 3 and 2; the end of 19:59:59 plus 1 s.
		{"two deaths", asDelivered(nsbSend("dl3", 13, r.Add(-20*time.Second)),
			death("nsb.v2.delay-level-02", r.Add(-sec(1.25)), ""), death("nsb.v2.delay-level-03", r.Add(-sec(5.25)), "")),
			0, r.Add(-sec(1.25) + 2*time.Second)},
		// Deaths elsewhere say nothing about the chain.
		{"a death in another queue", asDelivered(nsbSend("other", 10, r.Add(-time.Second)),
			death("Sales.Orders", r.Add(-time.Hour), "")), 3, r.Add(10 * time.Second)},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, ch := range []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1} {
				d := c.d
				if ch == nsbdelay.V1 {
					d = v1Deaths(d)
				}
				it := parseNSBNative(&d, r, ch, c.level)
				if it.Op != intake.OpSchedule {
					t.Fatalf("%s: %+v", ch.Version, it)
				}
				if want := c.want.Truncate(time.Microsecond); !it.DueAt.Truncate(time.Microsecond).Equal(want) {
					t.Errorf("%s: due %v after receipt, want %v", ch.Version, it.DueAt.Sub(r), want.Sub(r))
				}
				for _, h := range nsbdelay.DeadLetterHeaders {
					if _, ok := it.Msg.Headers[h]; ok {
						t.Errorf("%s: header %s kept", ch.Version, h)
					}
				}
			}
		})
	}
}

// v1Deaths renames the v2 level queues of d's deaths to v1's.
func v1Deaths(d amqp.Delivery) amqp.Delivery {
	d.Headers = maps.Clone(d.Headers)
	if deaths, ok := d.Headers["x-death"].([]any); ok {
		renamed := make([]any, len(deaths))
		for i, e := range deaths {
			entry := maps.Clone(e.(amqp.Table))
			entry["queue"] = strings.Replace(entry["queue"].(string), "nsb.v2.", "nsb.", 1)
			renamed[i] = entry
		}
		d.Headers["x-death"] = renamed
	}
	return d
}

// What no NServiceBus endpoint writes goes to the error queue, the reason
// saying why.
func TestNSBNativeRefuses(t *testing.T) {
	good := nsbSend("m", 10, nsbReceivedAt)
	with := func(name string, v any) amqp.Delivery {
		d := asDelivered(good)
		d.Headers[name] = v
		return d
	}
	for _, c := range []struct {
		name   string
		d      amqp.Delivery
		reason string
	}{
		{"key without digits", func() amqp.Delivery { d := asDelivered(good); d.RoutingKey = "Sales.Orders"; return d }(), "not an NServiceBus delay routing key"},
		{"key without address", func() amqp.Delivery {
			d := asDelivered(good)
			d.RoutingKey = d.RoutingKey[:56]
			return d
		}(), "not an NServiceBus delay routing key"},
		{"delay a boolean", with(nsbdelay.HeaderDelay, true), nsbdelay.HeaderDelay + " must be a whole number of seconds"},
		{"delay a word", with(nsbdelay.HeaderDelay, "ten"), nsbdelay.HeaderDelay + ` "ten" is not a whole number`},
		{"delay a float", with(nsbdelay.HeaderDelay, 1.5), nsbdelay.HeaderDelay + " must be a whole number"},
		{"time sent in ISO 8601", with(nsbdelay.HeaderTimeSent, "2026-11-21T20:00:00Z"), nsbdelay.HeaderTimeSent + ` "2026-11-21T20:00:00Z" is not in the NServiceBus wire format`},
		{"time sent a number", with(nsbdelay.HeaderTimeSent, int64(5)), nsbdelay.HeaderTimeSent + " must be a string"},
		{"retries timestamp garbled", with(nsbdelay.HeaderRetriesTimestamp, "yesterday"), nsbdelay.HeaderRetriesTimestamp},
		{"DeliverAt garbled", with(nsbdelay.HeaderDeliverAt, "2026-11-21T20:00:00Z"), nsbdelay.HeaderDeliverAt + ` "2026-11-21T20:00:00Z" is not in the NServiceBus wire format`},
		{"message id with NUL", func() amqp.Delivery { d := asDelivered(good); d.MessageId = "a\x00b"; return d }(), "message-id property contains control characters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			it := parseNSBNative(&c.d, nsbReceivedAt, nsbdelay.V2, 3)
			if it.Op != intake.OpReject || !strings.Contains(it.Reason, c.reason) {
				t.Errorf("got %v %q, want a rejection saying %q", it.Op, it.Reason, c.reason)
			}
		})
	}
	// A delay as a decimal string, or any integer type, is read.
	for _, v := range []any{"10", []byte("10"), int8(10), int16(10), int64(10), uint32(10)} {
		d := with(nsbdelay.HeaderDelay, v)
		if it := parseNSBNative(&d, nsbReceivedAt, nsbdelay.V2, 3); it.Op != intake.OpSchedule || !it.DueAt.Equal(nsbReceivedAt.Add(10*time.Second)) {
			t.Errorf("delay %#v: %v %q due %v", v, it.Op, it.Reason, it.DueAt)
		}
	}
}

// One source per level queue of each chain, waiting for the queues to
// exist, level 00 first.
func TestNSBNativeSources(t *testing.T) {
	srcs := Sources(nsbdelay.V2, nsbdelay.V1)
	if len(srcs) != 2*nsbdelay.Levels {
		t.Fatalf("%d sources", len(srcs))
	}
	seen := map[string]bool{}
	for _, s := range srcs {
		c := nsbdelay.V2
		if !strings.HasPrefix(s.Queue, c.LevelPrefix) {
			c = nsbdelay.V1
		}
		if _, ok := c.LevelOf(s.Queue); !ok || !s.MustExist || s.Gate != c.Level(0) || s.Setup != nil || seen[s.Name] {
			t.Errorf("source %+v", s)
		}
		seen[s.Name] = true
	}
}

// On, the protocol is both chains: their level queues consumed and no
// destination, their delivery exchanges allowed. Off, nothing of any.
func TestProtocol(t *testing.T) {
	on := Protocol{On: true}
	if n := len(on.Sources()); n != 2*nsbdelay.Levels {
		t.Fatalf("%d sources", n)
	}
	reserved := on.Reserved()
	for _, c := range []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1} {
		for k := range nsbdelay.Levels {
			if !slices.Contains(reserved, c.Level(k)) {
				t.Errorf("level queue %s is a destination", c.Level(k))
			}
		}
	}
	if len(reserved) != 2*nsbdelay.Levels {
		t.Errorf("reserved %q", reserved)
	}
	if got := on.Routes(); !slices.Equal(got, []string{nsbdelay.V2.Delivery, nsbdelay.V1.Delivery}) {
		t.Errorf("routes %q", got)
	}
	off := Protocol{}
	if off.Sources() != nil || off.Reserved() != nil || off.Routes() != nil {
		t.Errorf("off: sources %v, reserved %q, routes %q", off.Sources(), off.Reserved(), off.Routes())
	}
}
