package bench

import (
	"strings"
	"testing"
	"time"
)

func TestTTLRoutingKeyMatchesNServiceBus(t *testing.T) {
	// Cases from NServiceBus.Transport.RabbitMQ's routing key tests.
	for _, c := range []struct {
		delay     int
		dest      string
		key       string
		levelWant int
	}{
		{0, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.some-address", 0},
		{1, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.some-address", 0},
		{10, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.0.some-address", 3},
		{15, "small-delay", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.1.1.small-delay", 3},
		{28, "short-delay", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.1.0.0.short-delay", 4},
		{MaxTTLDelay, "some-address", "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.some-address", 27},
		{-123, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.some-address", 0},
		{MaxTTLDelay + 5, "x", "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.x", 27},
	} {
		key, level := TTLRoutingKey(c.delay, c.dest)
		if key != c.key || level != c.levelWant {
			t.Errorf("TTLRoutingKey(%d, %q) = %q, %d; want %q, %d", c.delay, c.dest, key, level, c.key, c.levelWant)
		}
	}
}

func TestTTLBindings(t *testing.T) {
	if got, want := TTLQueueBinding(27), "1.#"; got != want {
		t.Errorf("TTLQueueBinding(27) = %q, want %q", got, want)
	}
	if got, want := TTLSkipBinding(0), strings.Repeat("*.", 27)+"0.#"; got != want {
		t.Errorf("TTLSkipBinding(0) = %q, want %q", got, want)
	}
	if got, want := TTLQueueBinding(3), "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.1.#"; got != want {
		t.Errorf("TTLQueueBinding(3) = %q, want %q", got, want)
	}
	if got := TTLDeliverBinding("orders"); got != "#.orders" {
		t.Errorf("TTLDeliverBinding = %q", got)
	}
}

func TestTTLDelaySecondsRoundsUp(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1},
		{time.Second, 1}, {1001 * time.Millisecond, 2}, {10 * time.Second, 10},
		{time.Duration(MaxTTLDelay+10) * time.Second, MaxTTLDelay},
	} {
		if got := TTLDelaySeconds(now.Add(c.d), now); got != c.want {
			t.Errorf("TTLDelaySeconds(+%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// topicMatch is AMQP topic matching: words split on '.', '*' matches one
// word and '#' zero or more.
func topicMatch(pattern, key string) bool {
	var match func(p, k []string) bool
	match = func(p, k []string) bool {
		if len(p) == 0 {
			return len(k) == 0
		}
		switch p[0] {
		case "#":
			for i := 0; i <= len(k); i++ {
				if match(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			return len(k) > 0 && match(p[1:], k[1:])
		default:
			return len(k) > 0 && k[0] == p[0] && match(p[1:], k[1:])
		}
	}
	return match(strings.Split(pattern, "."), strings.Split(key, "."))
}

// TestTTLTopologyDelaysExactly routes messages through the declared
// topology (the same names, bindings and dead-letter targets declare uses)
// and checks that each spends exactly its delay in level queues and then
// reaches its destination once.
func TestTTLTopologyDelaysExactly(t *testing.T) {
	topo := ttlTopology{prefix: "t", queueType: "quorum"}
	type binding struct{ pattern, target string }
	exchanges := map[string][]binding{} // exchange -> bindings to queues/exchanges
	ttl := map[string]int{}             // queue -> TTL seconds
	dlx := map[string]string{}          // queue -> dead-letter exchange
	for k := 0; k < TTLLevels; k++ {
		args := topo.queueArgs(k)
		ttl[topo.queue(k)] = int(args["x-message-ttl"].(int64) / 1000)
		dlx[topo.queue(k)] = args["x-dead-letter-exchange"].(string)
		exchanges[topo.level(k)] = append(exchanges[topo.level(k)],
			binding{TTLQueueBinding(k), "queue:" + topo.queue(k)},
			binding{TTLSkipBinding(k), "exchange:" + topo.next(k)})
	}
	const dest = "bench-dest"
	exchanges[topo.deliver()] = []binding{{TTLDeliverBinding(dest), "queue:" + dest}}
	if dlx[topo.queue(0)] != topo.deliver() || dlx[topo.queue(5)] != topo.level(4) {
		t.Fatalf("dead-letter targets wrong: L0 → %s, L5 → %s", dlx[topo.queue(0)], dlx[topo.queue(5)])
	}
	if args := topo.queueArgs(0); args["x-dead-letter-strategy"] != "at-least-once" || args["x-queue-type"] != "quorum" {
		t.Errorf("quorum args = %v", args)
	}
	if args := (ttlTopology{prefix: "t", queueType: "classic"}).queueArgs(0); args["x-queue-type"] != "classic" || args["x-dead-letter-strategy"] != nil {
		t.Errorf("classic args = %v", args)
	}

	// route delivers key published to exchange and returns, per destination
	// queue reached, the seconds spent in level queues on the way.
	var route func(exchange, key string, waited int, out map[string][]int)
	route = func(exchange, key string, waited int, out map[string][]int) {
		for _, b := range exchanges[exchange] {
			if !topicMatch(b.pattern, key) {
				continue
			}
			kind, name, _ := strings.Cut(b.target, ":")
			switch {
			case kind == "exchange":
				route(name, key, waited, out)
			case ttl[name] > 0: // a level queue: wait, then dead-letter
				route(dlx[name], key, waited+ttl[name], out)
			default:
				out[name] = append(out[name], waited)
			}
		}
	}
	delays := []int{0, 1, 2, 3, 7, 8, 13, 255, 256, 1000, 86400, 30 * 86400, MaxTTLDelay}
	for d := 0; d < 70; d++ {
		delays = append(delays, d)
	}
	for _, d := range delays {
		key, level := TTLRoutingKey(d, dest)
		for _, start := range []int{level, TTLLevels - 1} { // where NServiceBus publishes, and the top
			out := map[string][]int{}
			route(topo.level(start), key, 0, out)
			if got := out[dest]; len(got) != 1 || got[0] != d || len(out) != 1 {
				t.Errorf("delay %d published at level %d: reached %v, want %s once after %d s", d, start, out, dest, d)
			}
		}
	}
}
