package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// NSB is the punctuality workload sent as NServiceBus endpoints send delayed
// messages, into the transport's v2 chain under its real names: delivered by
// the chain alone, then by a bridge consuming its level queues
// (DELAYBRIDGE_NSB_NATIVE_DELAYS). Lateness counts from each message's own
// due time, its NServiceBus.TimeSent plus its delay header (the delay
// rounded up to whole seconds at sending, as the transport does), which is
// what the chain and the bridge both aim at.
type NSB struct {
	N        int      `json:"n"`
	WindowMs float64  `json:"window_ms"`
	LeadMs   float64  `json:"lead_ms"`
	Chain    NSBRound `json:"chain"`
	Bridge   NSBRound `json:"bridge"`
}

// NSBRound is the workload through one of the two.
type NSBRound struct {
	PublishSeconds float64 `json:"publish_seconds"` // all publishes confirmed
	Lateness
}

// stepNSB runs the workload through the chain, then through the bridge. The
// transport's names are fixed, so it holds nsbendpoint's lock (tests use it
// too) and removes the chain before and after.
func (b *bencher) stepNSB(ctx context.Context) error {
	release, err := b.holdNSBChain(ctx)
	if err != nil {
		return err
	}
	defer release()
	n, window := b.opts.PunctualN, b.opts.Window
	res := &NSB{N: n, WindowMs: ms(window)}

	chain, err := b.nsbRound(ctx, "nsb-chain", res)
	if err != nil {
		return err
	}
	res.Chain = chain
	p, _, err := b.startBridgeEnv(ctx, b.name("nsb"), filepath.Join(b.dir, StepNSB, "delaybridge.db"), map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true"})
	if err != nil {
		return err
	}
	defer b.stopBridge(p, StepNSB)
	if err := b.waitNSBConsumers(ctx); err != nil {
		return err
	}
	bridge, err := b.nsbRound(ctx, "nsb-bridge", res)
	if err != nil {
		return err
	}
	res.Bridge = bridge
	b.res.NSB = res
	return ctx.Err()
}

// nsbRound publishes the workload into the chain, as NServiceBus sends, to a
// destination bound as an endpoint of the direct topology binds, and
// measures it.
func (b *bencher) nsbRound(ctx context.Context, label string, res *NSB) (NSBRound, error) {
	n, window := b.opts.PunctualN, b.opts.Window
	dest := b.name(label, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return NSBRound{}, err
	}
	if err := b.bindNSB(dest); err != nil {
		return NSBRound{}, err
	}
	col, err := b.collect(dest, n)
	if err != nil {
		return NSBRound{}, err
	}
	lead := b.lead(n)
	res.LeadMs = ms(lead)
	dues, pub, err := b.publishSpread(ctx, label, n, window, lead, func(i, seq int, due time.Time) outgoing {
		now := time.Now()
		s := nsbendpoint.Send{MessageID: fmt.Sprintf("%s-%d", label, seq), Address: dest,
			Delay: int32(nsbendpoint.DelaySeconds(due, now)), TimeSent: now, Body: b.body, SeqNo: int64(i)}
		msg := s.Publishing()
		// The chain delivers at the time sent plus whole seconds.
		due = now.Truncate(time.Microsecond).Add(time.Duration(s.Delay) * time.Second)
		msg.Headers[hdrDue], msg.Headers[hdrSeq] = due.UnixNano(), int64(seq)
		key, level := s.Key()
		return outgoing{exchange: nsbdelay.V2.Level(level), key: key, msg: msg}
	})
	if err != nil {
		col.stop(0)
		return NSBRound{}, err
	}
	first := dues[0]
	if pub.End.After(first) {
		b.warnf("%s: publishing ended %.0f ms after the first due time", label, ms(pub.End.Sub(first)))
	}
	// Due times are up to a second later than dues (whole seconds).
	if !col.wait(ctx, dues[n-1].Add(time.Second+collectGrace)) && ctx.Err() == nil {
		b.warnf("%s: %d of %d delivered %v after the last due time", label, col.received(), n, collectGrace)
	}
	l, _ := col.stop(duplicateLinger)
	b.logf("   %s: p50 %.1f ms, p99 %.1f ms, max %.1f ms, early %d, dups %d, missing %d",
		label, l.P50Ms, l.P99Ms, l.MaxMs, l.Early, l.Duplicates, l.Missing)
	return NSBRound{PublishSeconds: pub.End.Sub(pub.Start).Seconds(), Lateness: l}, ctx.Err()
}

// holdNSBChain takes nsbendpoint's lock (the transport's names are fixed,
// and tests use them too) and installs the v2 chain afresh; release removes
// the chain and lets the lock go.
func (b *bencher) holdNSBChain(ctx context.Context) (release func(), err error) {
	dial := func() (*amqp.Connection, error) { return amqp.Dial(b.opts.AMQPURL) }
	lock, err := nsbendpoint.Lock(ctx, dial)
	if err != nil {
		return nil, err
	}
	release = func() {
		_ = nsbendpoint.Uninstall(b.adminConn, nsbdelay.V2)
		_ = lock.Close()
	}
	_ = nsbendpoint.Uninstall(b.adminConn, nsbdelay.V2)
	if err := b.withAdmin(func(ch *amqp.Channel) error { return nsbendpoint.Install(ch, nsbdelay.V2) }); err != nil {
		release()
		return nil, fmt.Errorf("install the v2 chain: %w", err)
	}
	return release, nil
}

// bindNSB binds dest as an endpoint of the direct topology to the v2 chain.
func (b *bencher) bindNSB(dest string) error {
	if err := b.withAdmin(func(ch *amqp.Channel) error {
		return nsbendpoint.Bind(ch, nsbdelay.V2, nsbendpoint.Direct, dest)
	}); err != nil {
		return fmt.Errorf("bind %s: %w", dest, err)
	}
	return nil
}

// waitNSBConsumers waits until the bridge consumes every level queue.
func (b *bencher) waitNSBConsumers(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for k := 0; k < nsbdelay.Levels; k++ {
		for {
			var q amqp.Queue
			if err := b.withAdmin(func(ch *amqp.Channel) (err error) {
				q, err = ch.QueueDeclarePassive(nsbdelay.V2.Level(k), true, false, false, false, nil)
				return err
			}); err != nil {
				return err
			}
			if q.Consumers > 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the bridge does not consume %s", nsbdelay.V2.Level(k))
			}
			if !broker.Sleep(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}
