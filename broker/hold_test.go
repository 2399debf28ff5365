package broker

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// rawTake takes every message of queue with the raw reader, with its
// property bytes and body, and acks them all when ack is set (else they go
// back when the connection closes).
func rawTake(ctx context.Context, t *testing.T, url, queue string, ack bool) []rawMessage {
	t.Helper()
	rc, err := dialRaw(ctx, url, nil, "delaybridge raw take test", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.close() }()
	var out []rawMessage
	for {
		m, ok, err := rc.get(queue, func([]byte) bool { return true })
		if err != nil {
			t.Fatalf("raw get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		m.props = append([]byte(nil), m.props...)
		out = append(out, m)
		if ack {
			if err := rc.ack(m.tag); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func rawIDs(ms []rawMessage) []string {
	var ids []string
	for _, m := range ms {
		p, _ := decodeProperties(m.props)
		ids = append(ids, p.MessageId)
	}
	return ids
}

// While HoldUnreadable holds them, a reader with amqp091-go meets none of
// the unreadable messages and reads every readable one; after Release they
// are back on the queue as they were.
func TestHoldUnreadableKeepsThemAsideAndPutsThemBack(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			url, q, _, ch, ctx := sweepSetup(t, queueType)
			publishAll(ctx, t, ch, q, []amqp.Publishing{
				{MessageId: "v1", Body: []byte("v1")},
				{MessageId: "many", Body: []byte("many body"), ContentType: "text/plain", Headers: unreadableHeaders(true)},
				{MessageId: "v2", Body: []byte("v2")},
				{MessageId: "deep", Body: []byte("deep body"), Headers: unreadableHeaders(false)},
				{MessageId: "v3", Body: []byte("v3")},
			}...)
			before := rawTake(ctx, t, url, q, false) // all requeued
			waitDepth(t, ch, q, 5)

			// The first URL answers nothing: the next one is tried.
			h, err := HoldUnreadable(ctx, HoldOptions{URLs: []string{closedPortURL(t), url}, Name: "delaybridge hold test"}, q, 100)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Release()
			if h.Readable != 3 || len(h.Unreadable) != 2 || h.Unreadable[0].MessageID != "many" || h.Unreadable[1].MessageID != "deep" {
				t.Fatalf("held %+v, %d readable; want many and deep, 3 readable", h.Unreadable, h.Readable)
			}
			for _, u := range h.Unreadable {
				if !errors.Is(u.Reason, ErrUnreadable) {
					t.Errorf("%s: reason %v, want ErrUnreadable", u.MessageID, u.Reason)
				}
			}

			// Read as the replay pass does, on a connection of its own; the
			// readable ones are back by the time HoldUnreadable returned.
			conn := testenv.DialAMQP(t)
			rch := testenv.Channel(t, conn)
			var got []string
			for range h.Readable + 1 {
				d, ok, err := rch.Get(q, false)
				if err != nil {
					t.Fatalf("get while the unreadable ones are held: %v", err)
				}
				if !ok {
					break
				}
				got = append(got, d.MessageId)
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			if queueType == "quorum" { // returned messages: order not promised
				slices.Sort(got)
			}
			if !slices.Equal(got, []string{"v1", "v2", "v3"}) {
				t.Fatalf("read %v while held, want v1 v2 v3", got)
			}
			if conn.IsClosed() {
				t.Fatal("the reader's connection dropped")
			}

			if err := h.Release(); err != nil {
				t.Fatal(err)
			}
			if err := h.Release(); err != nil {
				t.Errorf("second Release: %v", err)
			}
			waitDepth(t, ch, q, 2)
			after := rawTake(ctx, t, url, q, true)
			if ids := rawIDs(after); !slices.Equal(ids, []string{"many", "deep"}) {
				t.Fatalf("back on the queue: %v, want many, deep", ids)
			}
			for i, m := range after {
				orig := before[2*i+1]
				if !bytes.Equal(m.body, orig.body) {
					t.Errorf("%d: body %q, want %q", i, m.body, orig.body)
				}
				if _, err := decodeProperties(m.props); !errors.Is(err, ErrUnreadable) {
					t.Errorf("%d: no longer unreadable: %v", i, err)
				}
				// A quorum queue adds x-delivery-count to what it
				// redelivers; a classic one delivers the bytes as published.
				if queueType == "classic" && !bytes.Equal(m.props, orig.props) {
					t.Errorf("%d: properties changed", i)
				}
			}
		})
	}
}

func TestHoldUnreadableLooksAtMostLimitMessages(t *testing.T) {
	url, q, _, ch, ctx := sweepSetup(t, "classic")
	publishAll(ctx, t, ch, q, []amqp.Publishing{{MessageId: "v1"}, {MessageId: "many", Headers: unreadableHeaders(true)},
		{MessageId: "v2"}, {MessageId: "deep", Headers: unreadableHeaders(false)}}...)
	h, err := HoldUnreadable(ctx, HoldOptions{URLs: []string{url}}, q, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if h.Readable != 2 || len(h.Unreadable) != 1 || h.Unreadable[0].MessageID != "many" {
		t.Fatalf("held %+v, %d readable; want many, 2 readable", h.Unreadable, h.Readable)
	}
	waitDepth(t, ch, q, 3) // v1, v2 and deep, which it did not take
}

func TestHoldUnreadableFailsCleanly(t *testing.T) {
	url, q, _, ch, ctx := sweepSetup(t, "classic")
	if _, err := HoldUnreadable(ctx, HoldOptions{URLs: []string{closedPortURL(t)}}, q, 10); err == nil {
		t.Error("HoldUnreadable with no broker answering succeeded")
	}
	if _, err := HoldUnreadable(ctx, HoldOptions{URLs: []string{url}}, q+".missing", 10); !errors.Is(err, errBrokerClosed) {
		t.Errorf("HoldUnreadable of a missing queue: %v, want the broker's refusal", err)
	}
	// A failure part-way leaves what it took on the queue.
	publishAll(ctx, t, ch, q, amqp.Publishing{MessageId: "many", Headers: unreadableHeaders(true)})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := HoldUnreadable(cctx, HoldOptions{URLs: []string{url}}, q, 10); err == nil {
		t.Error("HoldUnreadable with an ended context succeeded")
	}
	waitDepth(t, ch, q, 1)
	var nilHeld *Held
	if err := nilHeld.Release(); err != nil {
		t.Errorf("Release of nil: %v", err)
	}
}
