package nsbdelay

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The cases of the transport's own test of CalculateRoutingKey
// (src/NServiceBus.Transport.RabbitMQ.Tests/DelayedDelivery/When_calculating_a_routing_key.cs),
// and the bits above 28 it ignores.
func TestRoutingKeyMatchesTheTransport(t *testing.T) {
	for _, c := range []struct {
		delay int
		addr  string
		key   string
		level int
	}{
		{0, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.some-address", 0},
		{0, "", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.", 0},
		{0, "exotic-😊-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.exotic-😊-address", 0},
		{1, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.some-address", 0},
		{2, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.some-address", 1},
		{3, "🔥-unicode", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.🔥-unicode", 1},
		{10, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.0.some-address", 3},
		{MaxDelaySeconds - 1, "almost-max", "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.0.almost-max", 27},
		{MaxDelaySeconds, "some-address", "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.some-address", 27},
		{28, "short-delay", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.1.0.0.short-delay", 4},
		{15, "small-delay", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.1.1.small-delay", 3},
		{-123, "some-address", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.some-address", 0},
		{1<<Levels + 5, "x", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.x", 2},
	} {
		key, level := RoutingKey(c.delay, c.addr)
		if key != c.key || level != c.level {
			t.Errorf("RoutingKey(%d, %q) = %q, %d; want %q, %d", c.delay, c.addr, key, level, c.key, c.level)
		}
		if c.addr == "" {
			continue
		}
		delay, addr, err := ParseRoutingKey(key)
		if want := max(c.delay, 0) & MaxDelaySeconds; err != nil || delay != want || addr != c.addr {
			t.Errorf("ParseRoutingKey(%q) = %d, %q, %v; want %d, %q", key, delay, addr, err, want, c.addr)
		}
	}
}

func TestParseRoutingKeyRefusesOtherKeys(t *testing.T) {
	good, _ := RoutingKey(10, "orders")
	for _, key := range []string{
		"", "orders", "0.0.1.orders",
		good[:2*Levels],                       // no address
		strings.Replace(good, "1.", "2.", 1),  // not a binary digit
		strings.Replace(good, "0.", "0-", 1),  // not a dot
		strings.Replace(good, "0.0", "00", 1), // a digit where a dot goes
		"x" + good[1:],
	} {
		if d, a, err := ParseRoutingKey(key); !errors.Is(err, ErrRoutingKey) {
			t.Errorf("ParseRoutingKey(%q) = %d, %q, %v; want ErrRoutingKey", key, d, a, err)
		}
	}
	// The address is everything after the digits, dots and all.
	key, _ := RoutingKey(7, "sales.orders")
	if d, a, err := ParseRoutingKey(key); err != nil || d != 7 || a != "sales.orders" {
		t.Errorf("ParseRoutingKey(%q) = %d, %q, %v", key, d, a, err)
	}
}

func TestChainNames(t *testing.T) {
	for _, c := range []struct {
		chain                     Chain
		level0, level27, delivery string
	}{
		{V2, "nsb.v2.delay-level-00", "nsb.v2.delay-level-27", "nsb.v2.delay-delivery"},
		{V1, "nsb.delay-level-00", "nsb.delay-level-27", "nsb.delay-delivery"},
	} {
		if c.chain.Level(0) != c.level0 || c.chain.Level(27) != c.level27 || c.chain.Delivery != c.delivery {
			t.Errorf("%s: levels %q, %q, delivery %q", c.chain.Version, c.chain.Level(0), c.chain.Level(27), c.chain.Delivery)
		}
		if c.chain.Next(0) != c.delivery || c.chain.Next(5) != c.chain.Level(4) {
			t.Errorf("%s: Next(0) = %q, Next(5) = %q", c.chain.Version, c.chain.Next(0), c.chain.Next(5))
		}
		for k := 0; k < Levels; k++ {
			if j, ok := c.chain.LevelOf(c.chain.Level(k)); !ok || j != k {
				t.Errorf("%s: LevelOf(%q) = %d, %v", c.chain.Version, c.chain.Level(k), j, ok)
			}
		}
	}
	for _, q := range []string{"nsb.v2.delay-level-28", "nsb.v2.delay-level-5", "nsb.v2.delay-level-005", "nsb.delay-level-05", "nsb.v2.delay-level-x1", "nsb.v2.delay-delivery"} {
		if k, ok := V2.LevelOf(q); ok {
			t.Errorf("V2.LevelOf(%q) = %d, true", q, k)
		}
	}
}

// The installers' arguments: DelayInfrastructure.Build of today (v2) and
// before tag 7.0.0 (v1).
func TestQueueArgs(t *testing.T) {
	want := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		"x-message-ttl": int64(32000), "x-dead-letter-exchange": "nsb.v2.delay-level-04"}
	if got := V2.QueueArgs(5); !equalTables(got, want) {
		t.Errorf("V2.QueueArgs(5) = %v, want %v", got, want)
	}
	want = amqp.Table{"x-queue-mode": "lazy", "x-message-ttl": int64(1000), "x-dead-letter-exchange": "nsb.delay-delivery"}
	if got := V1.QueueArgs(0); !equalTables(got, want) {
		t.Errorf("V1.QueueArgs(0) = %v, want %v", got, want)
	}
	if got := V2.QueueArgs(27)["x-message-ttl"]; got != int64(1<<27)*1000 {
		t.Errorf("level 27 TTL = %v", got)
	}
}

func equalTables(a, b amqp.Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestBindings(t *testing.T) {
	if got, want := QueueBinding(27), "1.#"; got != want {
		t.Errorf("QueueBinding(27) = %q, want %q", got, want)
	}
	if got, want := SkipBinding(0), strings.Repeat("*.", 27)+"0.#"; got != want {
		t.Errorf("SkipBinding(0) = %q, want %q", got, want)
	}
	if got, want := QueueBinding(3), "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.1.#"; got != want {
		t.Errorf("QueueBinding(3) = %q, want %q", got, want)
	}
	if got := DeliveryBinding("orders"); got != "#.orders" {
		t.Errorf("DeliveryBinding = %q", got)
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

// TestChainDelaysExactly routes messages through the chain as the installer
// lays it out (the names, bindings and dead-letter targets above) and checks
// that each spends exactly its delay in level queues, reaches its
// destination once, and that what is left of the delay in level k's queue
// is 2^k plus the key's digits below k (what the bridge takes it to be).
func TestChainDelaysExactly(t *testing.T) {
	c := V2
	type binding struct{ pattern, target string }
	exchanges := map[string][]binding{} // exchange -> bindings to queues/exchanges
	ttl := map[string]int{}             // queue -> TTL seconds
	dlx := map[string]string{}          // queue -> dead-letter exchange
	for k := 0; k < Levels; k++ {
		args := c.QueueArgs(k)
		ttl[c.Level(k)] = int(args["x-message-ttl"].(int64) / 1000)
		dlx[c.Level(k)] = args["x-dead-letter-exchange"].(string)
		exchanges[c.Level(k)] = append(exchanges[c.Level(k)],
			binding{QueueBinding(k), "queue:" + c.Level(k)},
			binding{SkipBinding(k), "exchange:" + c.Next(k)})
	}
	const dest = "some.dest"
	exchanges[c.Delivery] = []binding{{DeliveryBinding(dest), "queue:" + dest}}

	// route delivers key published to exchange and returns, per
	// destination queue reached, the seconds spent in level queues; left
	// records, per level queue entered, what was still to wait on entry.
	var route func(exchange, key string, waited, total int, out map[string][]int, left map[int]int)
	route = func(exchange, key string, waited, total int, out map[string][]int, left map[int]int) {
		for _, b := range exchanges[exchange] {
			if !topicMatch(b.pattern, key) {
				continue
			}
			kind, name, _ := strings.Cut(b.target, ":")
			switch {
			case kind == "exchange":
				route(name, key, waited, total, out, left)
			case ttl[name] > 0: // a level queue: wait, then dead-letter
				k, _ := c.LevelOf(name)
				left[k] = total - waited
				route(dlx[name], key, waited+ttl[name], total, out, left)
			default:
				out[name] = append(out[name], waited)
			}
		}
	}
	delays := []int{0, 1, 2, 3, 7, 8, 13, 255, 256, 1000, 86400, 30 * 86400, MaxDelaySeconds}
	for d := 0; d < 70; d++ {
		delays = append(delays, d)
	}
	for _, d := range delays {
		key, level := RoutingKey(d, dest)
		for _, start := range []int{level, Levels - 1} { // where a sender publishes, and the top
			out, left := map[string][]int{}, map[int]int{}
			route(c.Level(start), key, 0, d, out, left)
			if got := out[dest]; len(got) != 1 || got[0] != d || len(out) != 1 {
				t.Errorf("delay %d published at level %d: reached %v, want %s once after %d s", d, start, out, dest, d)
			}
			for k, l := range left {
				if want := 1<<k + d&(1<<k-1); l != want {
					t.Errorf("delay %d: entering level %d with %d s left, want %d", d, k, l, want)
				}
			}
		}
	}
}
