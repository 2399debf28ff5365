package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/protocol/masstransit"
	"github.com/delaybridge/delaybridge/protocol/nsbtimeout"
	"github.com/delaybridge/delaybridge/wire"
)

// benchHeaders checks that a message forwarded as h carries bench-due =
// due and bench-seq = seq, which the consumer measures by.
func benchHeaders(t *testing.T, h amqp.Table, due time.Time, seq int) {
	t.Helper()
	if got, ok := headerInt(h, hdrDue); !ok || got != due.UnixNano() {
		t.Errorf("bench-due = %v (%v), want %d", got, ok, due.UnixNano())
	}
	if got, ok := headerInt(h, hdrSeq); !ok || got != int64(seq) {
		t.Errorf("bench-seq = %v (%v), want %d", got, ok, seq)
	}
}

// The bridge's own parser takes the bench's ScheduleMessage as the schedule
// it means, and the message it forwards keeps the bench's headers.
func TestMTScheduleParses(t *testing.T) {
	token := uuid.New()
	want := time.Date(2026, 11, 23, 20, 0, 0, 123456789, time.FixedZone("", 3600))
	pub, due := mtSchedule(token, want, "quartz", "bench-x-dest", []byte{0, 1, 2}, 7)
	if !due.Equal(want.Truncate(100)) || due.After(want) {
		t.Fatalf("due %v, want %v in 100 ns ticks", due, want)
	}
	d := &amqp.Delivery{ContentType: pub.ContentType, MessageId: pub.MessageId, DeliveryMode: pub.DeliveryMode, Headers: pub.Headers, Body: pub.Body}
	in := masstransit.Options{Queue: "quartz"}.Parse(d, time.Now())
	if in.Op != intake.OpReplace {
		t.Fatalf("op %v (%s), want a replace", in.Op, in.Reason)
	}
	if in.Exchange != "bench-x-dest" || in.Destination != "" || !in.DueAt.Equal(due) || in.SagaID != token.String() {
		t.Errorf("intake to %q/%q at %v, saga %q; want exchange bench-x-dest at %v, saga %s", in.Exchange, in.Destination, in.DueAt, in.SagaID, due, token)
	}
	benchHeaders(t, in.Msg.Headers, due, 7)
	var env struct {
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(in.Msg.Body, &env); err != nil || string(env.Message) != `{"data":"AAEC","seq":7}` {
		t.Errorf("forwarded message %s (%v), want the payload", env.Message, err)
	}
}

// The bridge reads the bench's NServiceBus timeout as due at the time it
// returns, for the queue it names.
func TestNSBTimeoutParses(t *testing.T) {
	want := time.Date(2026, 11, 23, 20, 0, 0, 123456789, time.UTC)
	pub, due := nsbTimeout("m-3", "bench-x-dest", want, want.Add(-time.Minute), nil, 3)
	if !due.Equal(want.Truncate(time.Microsecond)) {
		t.Fatalf("due %v, want %v in microseconds", due, want)
	}
	d := &amqp.Delivery{MessageId: pub.MessageId, ReplyTo: pub.ReplyTo, Headers: pub.Headers}
	p, err := nsbtimeout.Parse(d, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p.Destination != wire.Queue("bench-x-dest") || !p.DueAt.Equal(due) || p.ID != "m-3" {
		t.Errorf("parsed %+v, want bench-x-dest at %v, id m-3", p, due)
	}
	benchHeaders(t, pub.Headers, due, 3)
}

func TestProtocolRows(t *testing.T) {
	ok := Lateness{Expected: 10, Received: 10, Percentiles: Percentiles{P99Ms: 5, MaxMs: 9}}
	late := Lateness{Expected: 10, Received: 10, Percentiles: Percentiles{P99Ms: 25, MaxMs: 50}}
	r := &Results{NSBTimeouts: &Protocol{Framework: notRunDotNet,
		Plain: &Punctual{N: 10, WindowMs: 10000, Lateness: ok},
		Via:   &Punctual{N: 10, WindowMs: 10000, Lateness: late}}}
	rows := BuildRows(r)
	var verdicts []string
	for _, row := range rows {
		if row.Step != StepNSBTimeouts {
			t.Errorf("row of step %q", row.Step)
		}
		if row.Metric == "lateness p99" {
			verdicts = append(verdicts, row.Result)
		}
	}
	if len(verdicts) != 2 || verdicts[0] != Pass || verdicts[1] != Miss {
		t.Errorf("p99 verdicts plain, protocol = %q, want PASS, MISS", verdicts)
	}
	if last := rows[len(rows)-1]; last.Metric != "NServiceBus's timeout manager" || last.Value != notRunDotNet || last.Result != "" {
		t.Errorf("last row %+v, want the timeout manager not run", last)
	}
	// Without its protocol round (it failed) the plain one still shows.
	r.NSBTimeouts.Via = nil
	if got := result(BuildRows(r), StepNSBTimeouts, "lateness p99"); got != Pass {
		t.Errorf("plain p99 alone: %s", got)
	}
}
