package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"
)

// The bigmsg step: BigMsgN messages of BigMsgSize bytes each, due over
// bigMsgWindow from bigMsgLead after the first publish, so that the first
// ones fall due while later ones are still arriving (pending and flowing).
// It reports the bridge process's peak RSS (VmHWM): the byte budget
// (DELAYBRIDGE_MAX_INFLIGHT_BYTES) is what keeps it bounded.
const (
	BigMsgN         = 300
	BigMsgSize      = 8 << 20
	TargetBigMsgRSS = int64(512 << 20)
	bigMsgLead      = 5 * time.Second
	bigMsgWindow    = 30 * time.Second
	// The step waits for every message until none has arrived for
	// bigMsgStall (2.4 GB through two broker hops and a store on a loaded
	// 2-core machine is slow; only a bridge that stopped delivering is
	// given up on), and at most bigMsgMaxWait after the last due time.
	bigMsgStall   = 2 * time.Minute
	bigMsgMaxWait = 20 * time.Minute
)

// BigMsg is what the bigmsg step measured.
type BigMsg struct {
	N              int     `json:"n"`
	Bytes          int     `json:"message_bytes"`
	WindowMs       float64 `json:"window_ms"`
	LeadMs         float64 `json:"lead_ms"`
	PublishSeconds float64 `json:"publish_seconds"`
	// PeakRSS is the bridge's VmHWM at the end of the step (the bridge is
	// fresh: the step's own peak); SampledRSS the highest VmRSS sampled
	// every 100 ms; HeapPeak the highest Go HeapAlloc sampled.
	PeakRSS    int64 `json:"peak_rss_bytes"`
	SampledRSS int64 `json:"sampled_rss_bytes"`
	// AnonRSS is the highest RssAnon sampled: the RSS less the file-backed
	// pages (a bbolt store's mmap, which the kernel reclaims at will).
	AnonRSS  int64  `json:"sampled_anon_rss_bytes"`
	HeapPeak uint64 `json:"heap_peak_bytes,omitempty"`
	// LastAfterDueMs: the last due time to the last delivery.
	LastAfterDueMs float64  `json:"last_after_due_ms"`
	Lateness       Lateness `json:"lateness"`
}

func (b *bencher) stepBigMsg(ctx context.Context) error {
	p, dest, col, err := b.newBridgeCollecting(ctx, StepBigMsg, BigMsgN)
	if err != nil {
		return err
	}
	defer b.stopBridge(p, StepBigMsg)
	body := make([]byte, BigMsgSize) // one body shared by every message
	_, _ = rand.Read(body)
	smp := startSampler(p, 100*time.Millisecond)
	first := time.Now().Add(bigMsgLead)
	dues := spread(first, bigMsgWindow, BigMsgN)
	b.logf("   bigmsg: %d messages of %d MiB due over %v from %v ahead", BigMsgN, BigMsgSize>>20, bigMsgWindow, bigMsgLead)
	pub, err := b.publishAll(ctx, BigMsgN, func(i int) outgoing {
		m := b.message(dest, i, dues[i], dest)
		m.Body = body
		return outgoing{key: p.timeoutsQueue(), msg: m}
	})
	if err != nil {
		smp.finish()
		col.stop(0)
		return err
	}
	last := dues[BigMsgN-1]
	for seen, progress := 0, time.Now(); ; {
		if col.wait(ctx, time.Now().Add(10*time.Second)) || ctx.Err() != nil {
			break
		}
		if got := col.received(); got > seen {
			seen, progress = got, time.Now()
		}
		if time.Since(progress) > bigMsgStall || time.Now().After(last.Add(bigMsgMaxWait)) {
			b.warnf("bigmsg: %d of %d delivered; none for %v", col.received(), BigMsgN, time.Since(progress).Round(time.Second))
			break
		}
	}
	sampled, heap, _, _ := smp.finish()
	m, merr := p.mem()
	l, lastAt := col.stop(duplicateLinger)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res := &BigMsg{N: BigMsgN, Bytes: BigMsgSize, WindowMs: ms(bigMsgWindow), LeadMs: ms(bigMsgLead),
		PublishSeconds: pub.End.Sub(pub.Start).Seconds(), SampledRSS: sampled, AnonRSS: smp.maxAnon, HeapPeak: heap, Lateness: l,
		LastAfterDueMs: ms(lastAt.Sub(last))}
	if merr == nil {
		res.PeakRSS = m.HWM
	}
	b.res.BigMsg = res
	b.logf("   bigmsg: peak RSS %.0f MiB (sampled %.0f MiB, anon %.0f MiB, heap %.0f MiB); published in %.1f s; missing %d, dups %d, early %d; p99 %.0f ms",
		mib(res.PeakRSS), mib(sampled), mib(res.AnonRSS), mib(int64(heap)), res.PublishSeconds, l.Missing, l.Duplicates, l.Early, l.P99Ms)
	if merr != nil {
		return fmt.Errorf("bigmsg: read the bridge's memory: %w", merr)
	}
	return nil
}
