package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The TTL + dead-letter delay topology that transports build when the broker
// has no delay plugin, laid out like NServiceBus's RabbitMQ transport: 28
// levels k = 27..0, each a topic exchange and a queue whose messages expire
// after 2^k seconds and are dead-lettered to the exchange of level k-1 (level
// 0's to a delivery exchange). The routing key spells the delay in seconds
// as 28 binary digits, most significant first, then the destination. At
// level k the digit for 2^k decides: 1 routes into the level's queue (wait
// 2^k s), 0 straight on to the next level's exchange. The delivery exchange
// routes "#.<destination>" to the destination queue.

// TTLLevels is the number of levels; the longest delay is 2^28-1 seconds.
const TTLLevels = 28

// MaxTTLDelay is the longest delay, in seconds, the topology can express.
const MaxTTLDelay = 1<<TTLLevels - 1

// TTLDelaySeconds is the delay in whole seconds a sender computes for a
// message due at due, sending at now: rounded up, as NServiceBus does
// (Math.Ceiling), so the 1 s granularity can only make a message late, never
// early. Negative delays are 0; delays beyond MaxTTLDelay are clamped.
func TTLDelaySeconds(due, now time.Time) int {
	d := due.Sub(now)
	if d <= 0 {
		return 0
	}
	s := math.Ceil(d.Seconds())
	if s > MaxTTLDelay {
		return MaxTTLDelay
	}
	return int(s)
}

// TTLRoutingKey returns the routing key for a delay of delaySeconds to dest,
// and the highest level whose bit is set (where a sender publishes; 0 for a
// zero delay). A negative delay is 0, one beyond MaxTTLDelay is clamped.
func TTLRoutingKey(delaySeconds int, dest string) (key string, startLevel int) {
	delaySeconds = min(max(delaySeconds, 0), MaxTTLDelay)
	var sb strings.Builder
	sb.Grow(2*TTLLevels + len(dest))
	for k := TTLLevels - 1; k >= 0; k-- {
		if delaySeconds&(1<<k) != 0 {
			sb.WriteString("1.")
			if startLevel == 0 {
				startLevel = k
			}
		} else {
			sb.WriteString("0.")
		}
	}
	sb.WriteString(dest)
	return sb.String(), startLevel
}

// TTLQueueBinding is the pattern binding level k's exchange to its queue: the
// digit for 2^k (position 27-k) is 1.
func TTLQueueBinding(k int) string {
	return strings.Repeat("*.", TTLLevels-1-k) + "1.#"
}

// TTLSkipBinding is the pattern binding level k's exchange to the next
// exchange down (level k-1, or the delivery exchange for k = 0): the digit for
// 2^k is 0.
func TTLSkipBinding(k int) string {
	return strings.Repeat("*.", TTLLevels-1-k) + "0.#"
}

// TTLDeliverBinding binds the delivery exchange to a destination queue.
func TTLDeliverBinding(dest string) string { return "#." + dest }

// ttlTopology names one instance of the topology.
type ttlTopology struct {
	prefix    string
	queueType string // quorum (NServiceBus v2) or classic (v1)
}

func (t ttlTopology) level(k int) string { return t.prefix + "-L" + strconv.Itoa(k) }
func (t ttlTopology) queue(k int) string { return t.level(k) + "-q" }
func (t ttlTopology) deliver() string    { return t.prefix + "-deliver" }

// next is where level k's expired and skipping messages go.
func (t ttlTopology) next(k int) string {
	if k == 0 {
		return t.deliver()
	}
	return t.level(k - 1)
}

func (t ttlTopology) queueArgs(k int) amqp.Table {
	args := amqp.Table{
		"x-message-ttl":          int64(1<<k) * 1000,
		"x-dead-letter-exchange": t.next(k),
	}
	if t.queueType == "quorum" {
		// NServiceBus's v2 delay infrastructure: quorum queues with
		// at-least-once dead-lettering (RabbitMQ 3.10+).
		args["x-queue-type"] = "quorum"
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	} else {
		args["x-queue-type"] = "classic"
	}
	return args
}

// declare builds the topology, bottom up so every dead-letter target exists.
// It registers everything it creates with reg for the teardown.
func (t ttlTopology) declare(ch *amqp.Channel, reg *registry) error {
	if err := ch.ExchangeDeclare(t.deliver(), amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", t.deliver(), err)
	}
	reg.exchange(t.deliver())
	for k := 0; k < TTLLevels; k++ {
		if err := ch.ExchangeDeclare(t.level(k), amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", t.level(k), err)
		}
		reg.exchange(t.level(k))
		if _, err := ch.QueueDeclare(t.queue(k), true, false, false, false, t.queueArgs(k)); err != nil {
			return fmt.Errorf("declare queue %s: %w", t.queue(k), err)
		}
		reg.queue(t.queue(k))
		if err := ch.QueueBind(t.queue(k), TTLQueueBinding(k), t.level(k), false, nil); err != nil {
			return fmt.Errorf("bind %s: %w", t.queue(k), err)
		}
		if err := ch.ExchangeBind(t.next(k), TTLSkipBinding(k), t.level(k), false, nil); err != nil {
			return fmt.Errorf("bind %s to %s: %w", t.level(k), t.next(k), err)
		}
	}
	return nil
}
