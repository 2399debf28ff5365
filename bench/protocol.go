package bench

import (
	"context"
	"path/filepath"
	"time"
)

// Protocol is the punctuality workload through one framework's intake of a
// bridge, next to the plain workload (x-due-at and x-destination on
// E.Timeouts) through the same bridge in the same run, so that what the
// protocol costs is not hidden in run-to-run noise.
type Protocol struct {
	Plain *Punctual `json:"plain,omitempty"`
	Via   *Punctual `json:"protocol,omitempty"`
	// Framework says why the framework's own mechanism was not measured.
	Framework string `json:"framework_mechanism"`
}

// notRunDotNet is why a framework's own mechanism is not measured.
const notRunDotNet = "not run: it needs a .NET endpoint, which the bench does not run"

// protocolRun is one protocol step: the bridge's extra settings, the
// destination queue's binding (declared by protocolStep, bound by bind) and
// message seq due at due as the framework's endpoints send it through bridge p.
type protocolRun struct {
	step  string
	env   map[string]string
	bind  func(dest string) error
	build func(p *bridgeProc, dest string, seq int, due time.Time) outgoing
}

// protocolStep starts a bridge with r.env, runs the plain workload through
// it, then the workload as r.build makes it, and returns both. A failed
// round leaves the figures it has.
func (b *bencher) protocolStep(ctx context.Context, r protocolRun) (*Protocol, error) {
	p, ready, err := b.startBridgeEnv(ctx, b.name(r.step), filepath.Join(b.dir, r.step, "delaybridge.db"), r.env)
	if err != nil {
		return nil, err
	}
	b.logf("   bridge %s ready in %.0f ms (pid %d, http %s)", p.endpoint, ms(ready), p.cmd.Process.Pid, p.httpAddr)
	defer b.stopBridge(p, r.step)
	res := &Protocol{Framework: notRunDotNet}
	if res.Plain, err = b.punctual(ctx, p, r.step+"-plain", b.opts.PunctualN, b.opts.Window); err != nil {
		return res, err
	}
	dest := b.name(r.step, "dest")
	if err := b.declareQueue(dest, nil); err != nil {
		return res, err
	}
	if err := r.bind(dest); err != nil {
		return res, err
	}
	res.Via, err = b.punctualVia(ctx, p, r.step, dest, b.opts.PunctualN, b.opts.Window, func(seq int, due time.Time) outgoing {
		return r.build(p, dest, seq, due)
	})
	return res, err
}
