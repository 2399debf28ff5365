package amqptest

import (
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// unchecked is an Acker whose problems the test reads itself.
func unchecked() *Acker { return &Acker{outcomes: map[uint64]Outcome{}} }

func TestMultipleAckSettlesOnlyWhatIsOutstanding(t *testing.T) {
	a := unchecked()
	for range 4 {
		a.Deliver(amqp.Delivery{})
	}
	_ = a.Nack(2, false, true)
	_ = a.Ack(3, true) // settles 1 and 3; 2 was requeued already
	want := map[uint64]Outcome{1: Acked, 2: Requeued, 3: Acked, 4: Unsettled}
	for tag, o := range want {
		if got := a.Outcome(tag); got != o {
			t.Errorf("tag %d %s, want %s", tag, got, o)
		}
	}
	if got := a.Problems(); !slices.Equal(got, []string{"tag 4 never settled"}) {
		t.Errorf("problems %q", got)
	}
	if got := a.Multiple(); !slices.Equal(got, []uint64{3}) {
		t.Errorf("multiple acks %v", got)
	}
}

func TestSettlingTwiceOrUnknownTagsIsAProblem(t *testing.T) {
	a := unchecked()
	d := a.Deliver(amqp.Delivery{})
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if err := d.Nack(false, false); err == nil {
		t.Error("a second settlement was accepted")
	}
	if err := a.Reject(9, true); err == nil {
		t.Error("an unknown tag was accepted")
	}
	want := []string{"tag 1 settled twice: acked, then dropped", "tag 9 settled (requeued) but never delivered"}
	if got := a.Problems(); !slices.Equal(got, want) {
		t.Errorf("problems %q, want %q", got, want)
	}
}
