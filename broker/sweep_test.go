package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// unreadableHeaders returns headers amqp091-go writes but cannot read back:
// 8,193 entries (many) or a value of tables nested 33 deep.
func unreadableHeaders(many bool) amqp.Table {
	if many {
		h := amqp.Table{}
		for i := range 8193 {
			h[fmt.Sprintf("h%05d", i)] = nil
		}
		return h
	}
	var v any = "bottom"
	for range 33 {
		v = amqp.Table{"n": v}
	}
	return amqp.Table{"deep": v}
}

// sweepQueues declares a queue and an error queue of type queueType, deleted
// at the end of the test, and returns a confirm-mode channel.
func sweepQueues(t *testing.T, conn *amqp.Connection, queueType string) (q, errQ string, ch *amqp.Channel) {
	t.Helper()
	q = "it-sweep-" + uuid.NewString()
	errQ = q + ".error"
	ch = testenv.ConfirmChannel(t, conn)
	for _, name := range []string{q, errQ} {
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{amqp.QueueTypeArg: queueType}); err != nil {
			t.Fatalf("declare %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		c, err := conn.Channel()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.QueueDelete(q, false, false, false)
		_, _ = c.QueueDelete(errQ, false, false, false)
	})
	return q, errQ, ch
}

// sweepSetup returns the test broker's URL, the queues of sweepQueues, a
// confirm-mode channel and a context ending with the test (at most 1 min).
func sweepSetup(t *testing.T, queueType string) (url, q, errQ string, ch *amqp.Channel, ctx context.Context) {
	t.Helper()
	url = testenv.AMQPURL(t)
	q, errQ, ch = sweepQueues(t, testenv.DialAMQP(t), queueType)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return url, q, errQ, ch, ctx
}

// publishAll publishes msgs to queue with confirms.
func publishAll(ctx context.Context, t *testing.T, ch *amqp.Channel, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	for _, m := range msgs {
		if err := confirmedPublish(ctx, ch, queue, m); err != nil {
			t.Fatalf("publish %s: %v", m.MessageId, err)
		}
	}
}

func confirmedPublish(ctx context.Context, ch *amqp.Channel, queue string, msg amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("not confirmed (acked %v): %v", ok, err)
	}
	return nil
}

// drain takes every message of queue with basic.get and acks it.
func drain(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func TestSweepMovesUnreadableMessagesAndRequeuesTheRest(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			url, q, errQ, ch, ctx := sweepSetup(t, queueType)
			msgs := []amqp.Publishing{
				{MessageId: "v1", Body: []byte("v1")},
				{MessageId: "v2", Body: []byte("v2"), Headers: amqp.Table{"ok": "yes"}},
				{MessageId: "many", Body: []byte("many body"), ContentType: "text/plain", DeliveryMode: 2, Headers: unreadableHeaders(true)},
				{MessageId: "v3", Body: []byte("v3")},
				{MessageId: "deep", Body: []byte("deep body"), Headers: unreadableHeaders(false)},
				{MessageId: "v4", Body: []byte("v4")},
			}
			publishAll(ctx, t, ch, q, msgs...)
			var handed []Unreadable
			s := NewSweeper(SweepOptions{
				Name: "delaybridge sweep test", ErrorQueue: errQ, Limit: 100,
				Move:   moveTo(ch, errQ, &handed),
				Logger: zerolog.New(zerolog.NewTestWriter(t)),
			})
			// The first URL answers nothing: the next one is tried.
			moved, err := s.Sweep(ctx, []string{closedPortURL(t), url}, q)
			if err != nil || moved != 2 || len(handed) != 2 {
				t.Fatalf("Sweep = %d, %v, %d handed over; want 2, nil, 2", moved, err, len(handed))
			}

			copies := drain(t, ch, errQ)
			if len(copies) != 2 {
				t.Fatalf("%d copies on the error queue, want 2", len(copies))
			}
			entries := "8193"
			if queueType == "quorum" { // it adds x-delivery-count to what it delivers
				entries = "8194"
			}
			reasons := map[string]string{
				"many": "message headers exceed what the AMQP client can read: " + entries + " entries in one table (limit 8192)",
				"deep": "message headers exceed what the AMQP client can read: tables or arrays nested more than 32 levels deep (limit 32)",
			}
			// What a copy is made of (errorqueue.Sender.SendUnreadable
			// makes it): the reason, the queue, the body and the original
			// property bytes.
			for _, m := range handed {
				id := m.Msg.MessageId
				want, ok := reasons[id]
				if !ok {
					t.Fatalf("unexpected message %q handed over", id)
				}
				if got := m.Reason.Error(); got != want || !errors.Is(m.Reason, ErrUnreadable) {
					t.Errorf("%s: reason %q, want %q", id, got, want)
				}
				if m.Queue != q {
					t.Errorf("%s: queue %q, want %q", id, m.Queue, q)
				}
				if string(m.Msg.Body) != id+" body" {
					t.Errorf("%s: body %q", id, m.Msg.Body)
				}
				orig, err := decodeProperties(m.Props)
				if !errors.Is(err, ErrUnreadable) || orig.MessageId != id {
					t.Errorf("%s: original properties decode to %+v, %v", id, orig, err)
				}
			}
			byID := map[string]amqp.Delivery{}
			for _, c := range copies {
				byID[c.MessageId] = c
			}
			if m := byID["many"]; m.ContentType != "text/plain" || m.DeliveryMode != 2 {
				t.Errorf("the copy lost its readable properties: content-type %q, delivery-mode %d", m.ContentType, m.DeliveryMode)
			}

			var ids []string
			for _, d := range drain(t, ch, q) {
				ids = append(ids, d.MessageId)
			}
			want := []string{"v1", "v2", "v3", "v4"}
			if queueType == "quorum" { // returned messages: order not promised
				slices.Sort(ids)
			}
			if !slices.Equal(ids, want) {
				t.Errorf("left on the queue: %v, want %v", ids, want)
			}
		})
	}
}

func TestSweepLooksAtMostLimitMessages(t *testing.T) {
	url, q, errQ, ch, ctx := sweepSetup(t, "classic")
	publishAll(ctx, t, ch, q, []amqp.Publishing{{MessageId: "v1"}, {MessageId: "v2"}, {MessageId: "many", Headers: unreadableHeaders(true)}}...)
	published := 0
	s := NewSweeper(SweepOptions{ErrorQueue: errQ, Limit: 2, Move: func(context.Context, Unreadable) error {
		published++
		return nil
	}})
	if moved, err := s.Sweep(ctx, []string{url}, q); err != nil || moved != 0 || published != 0 {
		t.Fatalf("Sweep with Limit 2 = %d, %v (%d published); want 0, nil, nothing published", moved, err, published)
	}
	// The two readable messages were requeued in place; a sweep with a
	// larger limit reaches the third.
	s.opts.Limit = 3
	if moved, err := s.Sweep(ctx, []string{url}, q); err != nil || moved != 1 {
		t.Fatalf("Sweep with Limit 3 = %d, %v; want 1, nil", moved, err)
	}
	if n := len(drain(t, ch, q)); n != 2 {
		t.Errorf("%d messages left, want 2", n)
	}
	// An empty queue is a sweep that moves nothing.
	if moved, err := s.Sweep(ctx, []string{url}, q); err != nil || moved != 0 {
		t.Errorf("Sweep of an empty queue = %d, %v; want 0, nil", moved, err)
	}
}

func TestSweepLeavesTheMessageWhenTheCopyFails(t *testing.T) {
	url, q, errQ, ch, ctx := sweepSetup(t, "classic")
	publishAll(ctx, t, ch, q, []amqp.Publishing{{MessageId: "v1"}, {MessageId: "many", Headers: unreadableHeaders(true)}}...)
	refused := errors.New("not confirmed")
	s := NewSweeper(SweepOptions{ErrorQueue: errQ, Move: func(context.Context, Unreadable) error { return refused }})
	moved, err := s.Sweep(ctx, []string{url}, q)
	if moved != 0 || !errors.Is(err, refused) {
		t.Fatalf("Sweep = %d, %v; want 0 and the publish error", moved, err)
	}
	// Both are back (the unreadable one cannot be taken with amqp091-go:
	// count them).
	waitDepth(t, ch, q, 2)
}

func waitDepth(t *testing.T, ch *amqp.Channel, queue string, want int) {
	t.Helper()
	if !testenv.Eventually(10*time.Second, func() bool { return testenv.QueueDepth(t, ch, queue) == want }) {
		t.Fatalf("%s holds %d ready messages, want %d", queue, testenv.QueueDepth(t, ch, queue), want)
	}
}

func TestSweepErrorsHideThePassword(t *testing.T) {
	u, err := neturl.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = neturl.UserPassword(user, "s3cr3t-Pw")
	bad := u.String()
	s := NewSweeper(SweepOptions{ErrorQueue: "unused", Timeout: 10 * time.Second,
		Move: func(context.Context, Unreadable) error { return nil }})
	_, err = s.Sweep(context.Background(), []string{bad}, "unused")
	if err == nil {
		t.Fatal("Sweep with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), "s3cr3t-Pw") {
		t.Errorf("the error shows the password: %v", err)
	}
	if !errors.Is(err, errBrokerClosed) {
		t.Errorf("err %v, want the broker's refusal (errBrokerClosed)", err)
	}
}

func TestSweepStopsWithTheContext(t *testing.T) {
	// A listener that accepts and never answers: the handshake waits until
	// the context ends, not for the 30 s timeout.
	l := newSilentListener(t)
	s := NewSweeper(SweepOptions{Move: func(context.Context, Unreadable) error { return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := s.Sweep(ctx, []string{"amqp://guest:guest@" + l + "/"}, "q")
	if err == nil || time.Since(began) > 5*time.Second {
		t.Fatalf("Sweep = %v after %s; want an error soon after the context ended", err, time.Since(began))
	}
}

// newSilentListener accepts connections and never answers; it returns its
// address.
func newSilentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestConsumeSweepsAfterAnUnreadableMessage: the consumer's connection dies
// once on the unreadable message; Consume sweeps it to the error queue and
// then consumes everything else.
func TestConsumeSweepsAfterAnUnreadableMessage(t *testing.T) {
	url, q, errQ, ch, ctx := sweepSetup(t, "classic")
	msgs := []amqp.Publishing{{MessageId: "v1"}, {MessageId: "many", Headers: unreadableHeaders(true)}, {MessageId: "v2"}}
	publishAll(ctx, t, ch, q, msgs...)
	log := zerolog.New(zerolog.NewTestWriter(t))
	var sweeps sync.WaitGroup
	c := NewConn(ConnOptions{URL: url, Name: "delaybridge consume-sweep test", Logger: log,
		Sweeper: NewSweeper(SweepOptions{ErrorQueue: errQ, Logger: log,
			Move: moveTo(ch, errQ, nil)}),
	})
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	sweeps.Add(2)
	go func() { defer sweeps.Done(); _ = c.Run(runCtx) }()
	var mu sync.Mutex
	got := map[string]int{}
	sessions := 0
	go func() {
		defer sweeps.Done()
		_ = Consume(runCtx, c, ConsumeOptions{Queue: q, Prefetch: 10, Name: "test", Logger: log}, func(ctx context.Context, s *Session) error {
			mu.Lock()
			sessions++
			mu.Unlock()
			for {
				select {
				case <-ctx.Done():
					return nil
				case d, ok := <-s.Deliveries:
					if !ok {
						return errors.New("deliveries closed")
					}
					mu.Lock()
					got[d.MessageId]++
					mu.Unlock()
					_ = d.Ack(false)
				}
			}
		})
	}()
	if !testenv.Eventually(30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["v2"] > 0
	}) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("v2 not consumed within 30 s (got %v)", got)
	}
	stop()
	sweeps.Wait()
	if got["many"] != 0 || got["v1"] < 1 {
		t.Errorf("consumed %v; want v1 and v2, never the unreadable one", got)
	}
	if sessions != 2 {
		t.Errorf("%d sessions, want 2: one ended by the unreadable message, one after the sweep", sessions)
	}
	copies := drain(t, ch, errQ)
	if len(copies) != 1 || copies[0].MessageId != "many" {
		t.Errorf("error queue holds %d copies, want the unreadable one", len(copies))
	}
}

// moveTo is a Sweeper's Move that notes each message handed over in handed
// (when not nil) and publishes it to queue as it is, with confirms.
func moveTo(ch *amqp.Channel, queue string, handed *[]Unreadable) func(context.Context, Unreadable) error {
	return func(ctx context.Context, m Unreadable) error {
		if handed != nil {
			*handed = append(*handed, m)
		}
		return confirmedPublish(ctx, ch, queue, m.Msg)
	}
}
