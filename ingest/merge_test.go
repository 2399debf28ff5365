package ingest

import (
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/intake"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Sources of one queue become one: the queue's own source (no Exchanges),
// wherever it stands, reading each delivery with the parser of the source
// that names its exchange, and every other with its own. Other queues keep
// their sources and their order.
func TestMergeSources(t *testing.T) {
	reads := func(name string) intake.Parser {
		return intake.ParserFunc(func(*amqp.Delivery, time.Time) intake.Intake {
			return intake.Intake{Op: intake.OpReject, Reason: name}
		})
	}
	srcs := intake.MergeSources([]intake.Source{
		{Name: "x", Queue: "q", Exchanges: []string{"x1", "x2"}, Parser: reads("x")},
		{Name: "other", Queue: "r", Parser: reads("other")},
		{Name: "own", Queue: "q", Parser: reads("own")},
		{Name: "y", Queue: "q", Exchanges: []string{"y1"}, Parser: reads("y")},
	})
	if len(srcs) != 2 || srcs[0].Name != "own" || srcs[0].Queue != "q" || srcs[0].Exchanges != nil || srcs[1].Name != "other" {
		t.Fatalf("merged %+v", srcs)
	}
	for exchange, want := range map[string]string{"x1": "x", "x2": "x", "y1": "y", "": "own", "z": "own"} {
		if got := srcs[0].Parser.Parse(&amqp.Delivery{Exchange: exchange}, time.Time{}).Reason; got != want {
			t.Errorf("through %q: read by %q, want %q", exchange, got, want)
		}
	}
	if got := srcs[1].Parser.Parse(&amqp.Delivery{Exchange: "x1"}, time.Time{}).Reason; got != "other" {
		t.Errorf("another queue's delivery read by %q", got)
	}
	if one := intake.MergeSources([]intake.Source{{Name: "own", Queue: "q", Parser: reads("own")}}); len(one) != 1 || one[0].Name != "own" {
		t.Errorf("a lone source: %+v", one)
	}
}
