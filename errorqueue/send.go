package errorqueue

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/wire"
)

// Metrics counts the copies the broker confirmed, by stage
// (*metrics.Metrics implements it).
type Metrics interface {
	ErrorQueued(stage string, n int)
}

// Options configure a Sender.
type Options struct {
	Queue string
	// Processing names the endpoint and host on every copy.
	Processing Processing
	// Declare, MinBackoff, MaxBackoff and WarnInterval are the gate's
	// (GateOptions).
	Declare                              func(ctx context.Context) error
	MinBackoff, MaxBackoff, WarnInterval time.Duration
	// Metrics, when set, counts the confirmed copies.
	Metrics Metrics
	Now     func() time.Time
	Logger  zerolog.Logger
}

// Sender puts copies of failed messages on the error queue, for every stage
// that sends them: it makes each copy (Copy), publishes it through the gate
// (Gate), sends it again in another form when AMQP cannot carry it, and
// counts what the broker confirmed. It is safe for concurrent use.
type Sender struct {
	opts Options
	gate *Gate
}

// New returns a Sender; it starts nothing.
func New(opts Options) *Sender {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Sender{opts: opts, gate: NewGate(GateOptions{Queue: opts.Queue, Declare: opts.Declare,
		MinBackoff: opts.MinBackoff, MaxBackoff: opts.MaxBackoff, WarnInterval: opts.WarnInterval,
		Now: opts.Now, Logger: opts.Logger})}
}

// Queue is the error queue's name.
func (s *Sender) Queue() string { return s.opts.Queue }

// Failure is one message to copy to the error queue.
type Failure struct {
	// Msg is the message as it failed: as it came in, or as it was stored.
	Msg amqp.Publishing
	// Facts say why and where it failed; FailedAt and Processing are the
	// Sender's.
	Facts Facts
	// ID is the message id a copy in another form keeps (when it is a
	// valid one); empty: Msg's.
	ID string
	// Record, when set, is the message's stored record (package message's
	// encoding): the body of a copy in another form. Empty: Msg encoded so.
	Record []byte
}

// sendTimeout bounds the publish and confirm of one Send.
const sendTimeout = 30 * time.Second

// Send copies each failure to the error queue through the gate and returns,
// index for index, nil for each copy the broker confirmed, or why it was not
// published (ErrRefusing while the queue refuses copies) or not confirmed
// (broker.ErrReturned, broker.ErrNacked, broker.ErrNotConfirmed,
// broker.ErrUnpublishable). A copy AMQP cannot carry (the message's own
// headers or properties, with the failure headers added, exceed what a
// frame or the client can hold) is sent again with the message's whole
// record as its body, so that nothing is lost and the message does not come
// back forever; its reason says so. Each failure's Facts are left as its
// copy carries them: FailedAt and Processing filled in, and the Reason of a
// copy sent whole.
func (s *Sender) Send(ctx context.Context, pub Publisher, fs []Failure) []error {
	if len(fs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	now := s.opts.Now()
	out := make([]broker.Outgoing, len(fs))
	for i := range fs {
		f := &fs[i]
		f.Facts.FailedAt, f.Facts.Processing = now, s.opts.Processing
		out[i] = s.outgoing(Copy(f.Msg, f.Facts))
	}
	results := s.gate.Publish(ctx, pub, out)
	var again []broker.Outgoing
	var at []int
	for i, err := range results {
		if errors.Is(err, broker.ErrUnpublishable) {
			again = append(again, s.outgoing(fs[i].whole(err)))
			at = append(at, i)
		}
	}
	if len(again) > 0 {
		for k, err := range s.gate.Publish(ctx, pub, again) {
			results[at[k]] = err
		}
	}
	confirmed := map[string]int{}
	for i, err := range results {
		if err == nil {
			confirmed[fs[i].Facts.Stage]++
		}
	}
	for stage, n := range confirmed {
		s.count(stage, n)
	}
	return results
}

// whole is the copy of f in another form, for a copy that AMQP could not
// carry (why): no headers or properties of the message's own, its record as
// the body, and its id when the id is valid.
func (f *Failure) whole(why error) amqp.Publishing {
	facts := &f.Facts
	raw := amqp.Publishing{Body: f.Record}
	if f.Record != nil {
		facts.Reason += "; the message itself " + why.Error() + ", so this copy's body is its stored record (package message's encoding)"
	} else {
		note := "its body is the original body only (its headers could not be encoded either)"
		raw.Body = f.Msg.Body
		if enc, err := message.Encode(nil, &f.Msg); err == nil {
			raw.Body, note = enc, "its body is the whole original message in delaybridge's message encoding"
		}
		facts.Reason += "; the copy itself " + why.Error() + ", so " + note
	}
	id := f.ID
	if id == "" {
		id = f.Msg.MessageId
	}
	if wire.ValidateID("message id", id) == nil {
		raw.MessageId = id
	}
	return Copy(raw, *facts)
}

// SendUnreadable copies a message the AMQP client cannot read (swept off its
// queue, docs/contract.md §4.5) to the error queue with publish, which
// returns nil once the broker confirmed it. The copy has the properties
// that could be read, the body, and the original property bytes in a
// header (a byte array is opaque to every client); when they do not fit a
// frame beside the failure headers, the body carries them instead (a 4-byte
// length, the property bytes, the original body), or the message would stay
// at the head of its queue and be swept again forever. It does not pass
// the gate: the sweep stops at a copy that fails, and tries again later.
func (s *Sender) SendUnreadable(ctx context.Context, publish func(context.Context, amqp.Publishing) error, m broker.Unreadable) error {
	facts := Facts{Reason: m.Reason.Error(), Stage: wire.StageIngest, FailedAt: s.opts.Now(), FailedQ: m.Queue, Processing: s.opts.Processing}
	p := m.Msg
	p.Headers = amqp.Table{wire.HeaderOriginalProperties: append([]byte(nil), m.Props...)}
	err := publish(ctx, Copy(p, facts))
	if errors.Is(err, broker.ErrUnpublishable) {
		body := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(m.Props)+len(m.Msg.Body)), uint32(len(m.Props)))
		body = append(append(body, m.Props...), m.Msg.Body...)
		facts.Reason += "; the copy with its properties " + err.Error() +
			", so its body is the original property bytes (after a 4-byte length) followed by the original body"
		facts.FailedAt = s.opts.Now()
		err = publish(ctx, Copy(amqp.Publishing{MessageId: p.MessageId, ContentType: wire.ContentTypeUnreadable, Body: body}, facts))
	}
	if err != nil {
		return err
	}
	s.count(wire.StageIngest, 1)
	return nil
}

func (s *Sender) outgoing(p amqp.Publishing) broker.Outgoing {
	return broker.Outgoing{RoutingKey: s.opts.Queue, Mandatory: true, Msg: p}
}

func (s *Sender) count(stage string, n int) {
	if s.opts.Metrics != nil && n > 0 {
		s.opts.Metrics.ErrorQueued(stage, n)
	}
}

// RetryIn is how long until the gate publishes again: 0 while the queue
// takes copies.
func (s *Sender) RetryIn(now time.Time) time.Duration { return s.gate.RetryIn(now) }

// Refusing reports whether the queue refuses copies, and since when and
// why; for readiness and metrics.
func (s *Sender) Refusing() (refusing bool, since time.Time, cause string) { return s.gate.Refusing() }

// Flush writes what the gate's refusal summary holds (when the bridge stops).
func (s *Sender) Flush() { s.gate.Flush() }
