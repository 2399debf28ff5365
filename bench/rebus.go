package bench

import (
	"context"
	"path/filepath"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/protocol/rebus"
)

// stepRebus is the punctuality workload as Rebus endpoints defer messages
// to a bridge that serves as their external timeout manager
// (DELAYBRIDGE_REBUS_QUEUE): each is published to the direct exchange with
// the timeout manager queue's name as routing key, with
// rbs2-deferred-until and rbs2-defer-recipient, and delivered to a queue
// bound to that exchange by its name. Rebus's own timeout manager runs in a
// .NET endpoint, which the bench cannot run. (With --sentinel-only the
// sentinel goes through E.Timeouts, a queue of its own: "all stored" is then
// only a hint. Lateness does not depend on it.)
func (b *bencher) stepRebus(ctx context.Context) error {
	tm, directX, dest := b.name(StepRebus, "timeouts"), b.name(StepRebus, "RebusDirect"), b.name(StepRebus, "dest")
	b.reg.queue(tm) // the bridge declares them
	b.reg.exchange(directX)
	p, ready, err := b.startBridgeEnv(ctx, b.name(StepRebus), filepath.Join(b.dir, StepRebus, "delaybridge.db"),
		map[string]string{"DELAYBRIDGE_REBUS_QUEUE": tm, "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": directX})
	if err != nil {
		return err
	}
	b.logf("   bridge %s ready in %.0f ms (pid %d, http %s)", p.endpoint, ms(ready), p.cmd.Process.Pid, p.httpAddr)
	defer b.stopBridge(p, StepRebus)
	if err := b.declareQueue(dest, nil); err != nil {
		return err
	}
	if err := b.bindQueue(dest, dest, directX); err != nil {
		return err
	}
	at := time.FixedZone("", 3600) // the senders' offset: Rebus writes local time
	res, err := b.punctualVia(ctx, p, StepRebus, dest, b.opts.PunctualN, b.opts.Window, func(seq int, due time.Time) outgoing {
		due = due.Truncate(100) // .NET keeps 100 ns ticks: bench-due must be the instant written
		msg := b.message(dest, seq, due, dest)
		msg.Headers = amqp.Table{
			rebus.HeaderMessageID:      msg.MessageId,
			rebus.HeaderDeferredUntil:  due.In(at).Format("2006-01-02T15:04:05.0000000-07:00"),
			rebus.HeaderDeferRecipient: dest,
			hdrDue:                     msg.Headers[hdrDue],
			hdrSeq:                     msg.Headers[hdrSeq],
		}
		return outgoing{exchange: directX, key: tm, msg: msg}
	})
	if res != nil {
		b.res.Rebus = res
	}
	return err
}
