package errorqueue

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/broker/brokertest"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// stageCounter counts ErrorQueued calls by stage.
type stageCounter struct{ byStage map[string]int }

func (c *stageCounter) ErrorQueued(stage string, n int) {
	if c.byStage == nil {
		c.byStage = map[string]int{}
	}
	c.byStage[stage] += n
}

var failedAt = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func newSender(counted *stageCounter) *Sender {
	return New(Options{Queue: "error", Processing: NewProcessing("E", "h"), Metrics: counted,
		Now: func() time.Time { return failedAt }, Logger: zerolog.Nop()})
}

// A copy AMQP cannot carry goes out again whole, in another form: the
// message's record as the body (the stored one at dispatch, the message
// encoded at ingest), its id when valid, and a reason that says so; every
// confirmed copy is counted at its stage, and nothing else is.
func TestSendUnpublishableCopyGoesWhole(t *testing.T) {
	pub := &brokertest.Publisher{Outcome: func(m broker.Outgoing) error {
		switch {
		case m.Msg.Headers["huge"] != nil:
			return fmt.Errorf("%w: headers exceed the frame size", broker.ErrUnpublishable)
		case m.Msg.MessageId == "refused":
			return fmt.Errorf("%w: 312 NO_ROUTE", broker.ErrReturned)
		}
		return nil
	}}
	counted := &stageCounter{}
	s := newSender(counted)
	huge := amqp.Table{"huge": "x"}
	stored := []byte("the stored record")
	fs := []Failure{
		{Msg: amqp.Publishing{MessageId: "in", Headers: huge, Body: []byte("body")},
			Facts: Facts{Reason: "no destination", Stage: wire.StageIngest, FailedQ: "E.Timeouts"}},
		{Msg: amqp.Publishing{MessageId: "msg-id", Headers: huge, Body: []byte("keep")}, ID: "out", Record: stored,
			Facts: Facts{Reason: "dispatch failed", Stage: wire.StageDispatch, Attempts: 3, FailedQ: "E.Timeouts"}},
		{Msg: amqp.Publishing{MessageId: strings.Repeat("i", 300), Headers: huge}, Record: stored,
			Facts: Facts{Reason: "dispatch failed", Stage: wire.StageDispatch}},
		{Msg: amqp.Publishing{MessageId: "ok"}, Facts: Facts{Reason: "no due time", Stage: wire.StageIngest}},
	}
	results := s.Send(context.Background(), pub, fs)
	if len(results) != 4 || results[0] != nil || results[1] != nil || results[2] != nil || results[3] != nil {
		t.Fatalf("results %v; want nil ×4", results)
	}
	sent := pub.Sent()
	if len(sent) != 7 { // four copies, then three again in another form
		t.Fatalf("%d publishes, want 7", len(sent))
	}
	for _, m := range sent {
		if m.RoutingKey != "error" || !m.Mandatory {
			t.Errorf("published to %q (mandatory %v), want the error queue, mandatory", m.RoutingKey, m.Mandatory)
		}
	}
	in, out, long := sent[4].Msg, sent[5].Msg, sent[6].Msg

	orig, err := message.Decode(in.Body)
	if err != nil || orig.Headers["huge"] != "x" || string(orig.Body) != "body" || orig.MessageId != "in" || in.MessageId != "in" {
		t.Errorf("ingest: the copy's body is not the original message: %+v, %v (id %q)", orig, err, in.MessageId)
	}
	if r := in.Headers[wire.HeaderError]; r != "no destination; the copy itself cannot be published: headers exceed the frame size, "+
		"so its body is the whole original message in delaybridge's message encoding" {
		t.Errorf("ingest: reason %q", r)
	}
	if !bytes.Equal(out.Body, stored) || out.MessageId != "out" || out.Headers["huge"] != nil {
		t.Errorf("dispatch: copy %+v; want the stored record as body and the row's id", out)
	}
	if r := out.Headers[wire.HeaderError]; r != "dispatch failed; the message itself cannot be published: headers exceed the frame size, "+
		"so this copy's body is its stored record (package message's encoding)" {
		t.Errorf("dispatch: reason %q", r)
	}
	for _, m := range []amqp.Publishing{in, out} {
		if m.Headers[wire.HeaderFailedAt] != "2026-11-23T12:00:00Z" || m.Headers[wire.HeaderNSBProcessingEndpoint] != "E" {
			t.Errorf("%s: failed at %v, processing endpoint %v", m.MessageId, m.Headers[wire.HeaderFailedAt], m.Headers[wire.HeaderNSBProcessingEndpoint])
		}
	}
	if fs[1].Facts.Reason != out.Headers[wire.HeaderError] || fs[3].Facts.Reason != "no due time" || !fs[3].Facts.FailedAt.Equal(failedAt) {
		t.Errorf("facts left as sent: %+v, %+v", fs[1].Facts, fs[3].Facts)
	}
	if out.Headers[wire.HeaderAttempts] != int32(3) || out.Headers[wire.HeaderStage] != wire.StageDispatch {
		t.Errorf("dispatch: attempts %v, stage %v", out.Headers[wire.HeaderAttempts], out.Headers[wire.HeaderStage])
	}
	if long.MessageId != "" {
		t.Errorf("an id AMQP cannot carry was kept: %d bytes", len(long.MessageId))
	}
	if counted.byStage[wire.StageIngest] != 2 || counted.byStage[wire.StageDispatch] != 2 || len(counted.byStage) != 2 {
		t.Errorf("counted %v; want ingest 2, dispatch 2", counted.byStage)
	}
	// A copy the queue refused is the caller's to hold, and not counted.
	results = s.Send(context.Background(), pub, []Failure{{Msg: amqp.Publishing{MessageId: "refused"},
		Facts: Facts{Reason: "no due time", Stage: wire.StageIngest}}})
	if len(results) != 1 || !errors.Is(results[0], broker.ErrReturned) || counted.byStage[wire.StageIngest] != 2 {
		t.Errorf("results %v, counted %v; want returned, ingest still 2", results, counted.byStage)
	}
}

// The copy of a message the AMQP client cannot read carries what could be
// read, its body and the original property bytes; when that does not fit a
// frame, its body carries them instead (a 4-byte length, the property
// bytes, the original body), so the message does not stay at the head of
// its queue to be swept again forever.
func TestSendUnreadable(t *testing.T) {
	reason := fmt.Errorf("%w: 8193 entries in one table (limit 8192)", broker.ErrUnreadable)
	props := []byte{0x90, 0x00, 4, 'm', 'a', 'n', 'y'}
	m := broker.Unreadable{Queue: "E.Timeouts", Props: props, Reason: reason,
		Msg: amqp.Publishing{MessageId: "many", ContentType: "text/plain", DeliveryMode: 2, Body: []byte("many body")}}
	for _, tooBig := range []bool{false, true} {
		t.Run(fmt.Sprint("too big ", tooBig), func(t *testing.T) {
			counted := &stageCounter{}
			s := newSender(counted)
			var got []amqp.Publishing
			err := s.SendUnreadable(context.Background(), func(_ context.Context, p amqp.Publishing) error {
				got = append(got, p)
				if _, ok := p.Headers[wire.HeaderOriginalProperties]; ok && tooBig {
					return fmt.Errorf("%w: over the frame size", broker.ErrUnpublishable)
				}
				return nil
			}, m)
			if err != nil || counted.byStage[wire.StageIngest] != 1 || len(counted.byStage) != 1 {
				t.Fatalf("SendUnreadable = %v, counted %v; want nil, 1 at stage ingest", err, counted.byStage)
			}
			c := got[len(got)-1]
			want := reason.Error()
			if tooBig {
				want += "; the copy with its properties cannot be published: over the frame size, " +
					"so its body is the original property bytes (after a 4-byte length) followed by the original body"
			}
			if c.Headers[wire.HeaderError] != want || c.Headers[wire.HeaderNSBException] != want ||
				c.Headers[wire.HeaderStage] != wire.StageIngest || c.Headers[wire.HeaderNSBFailedQ] != "E.Timeouts" ||
				c.Headers[wire.HeaderFailedAt] != "2026-11-23T12:00:00Z" || c.Headers[wire.HeaderAttempts] != int32(0) ||
				c.Headers[wire.HeaderNSBProcessingEndpoint] != "E" {
				t.Errorf("error headers %v", c.Headers)
			}
			if !tooBig {
				if len(got) != 1 || string(c.Body) != "many body" || c.MessageId != "many" ||
					c.ContentType != "text/plain" || c.DeliveryMode != 2 {
					t.Errorf("copy %+v; want the readable properties and the body", c)
				}
				if raw, _ := c.Headers[wire.HeaderOriginalProperties].([]byte); !bytes.Equal(raw, props) {
					t.Errorf("original properties header %v, want %v", raw, props)
				}
				return
			}
			if len(got) != 2 || c.ContentType != wire.ContentTypeUnreadable || c.MessageId != "many" || len(c.Body) < 4 {
				t.Fatalf("copy: content-type %q, id %q, %d bytes after %d publishes", c.ContentType, c.MessageId, len(c.Body), len(got))
			}
			if _, ok := c.Headers[wire.HeaderOriginalProperties]; ok {
				t.Error("the copy in a body still has the properties header")
			}
			n := binary.BigEndian.Uint32(c.Body)
			if p, body := c.Body[4:4+n], c.Body[4+n:]; !bytes.Equal(p, props) || string(body) != "many body" {
				t.Errorf("body does not carry the original: properties %v, body %q", p, body)
			}
		})
	}
	// A copy not confirmed is not counted, and its error is the caller's.
	counted := &stageCounter{}
	refused := errors.New("not confirmed")
	if err := newSender(counted).SendUnreadable(context.Background(), func(context.Context, amqp.Publishing) error { return refused }, m); !errors.Is(err, refused) ||
		len(counted.byStage) != 0 {
		t.Errorf("SendUnreadable = %v, counted %v; want the publish error, nothing counted", err, counted.byStage)
	}
}
