package bench

import (
	"testing"

	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// The bench's chain is the transport's under its own names: quorum queues
// for v2, classic lazy ones for v1.
func TestTTLTopologyNames(t *testing.T) {
	q := newTTLTopology("bench-x-ttl", "quorum")
	if q.chain.Level(5) != "bench-x-ttl-L05" || q.chain.Delivery != "bench-x-ttl-deliver" || q.chain.Next(0) != q.chain.Delivery {
		t.Errorf("names: %q, %q", q.chain.Level(5), q.chain.Delivery)
	}
	want := nsbdelay.V2.QueueArgs(3)
	for k, v := range q.chain.QueueArgs(3) {
		if k != "x-dead-letter-exchange" && want[k] != v {
			t.Errorf("quorum arg %s = %v, want %v", k, v, want[k])
		}
	}
	if args := newTTLTopology("p", "classic").chain.QueueArgs(0); args["x-queue-mode"] != "lazy" || args["x-queue-type"] != nil {
		t.Errorf("classic args = %v", args)
	}
}
