// Package bridge wires ingest, store, poller, dispatcher and HTTP into one
// running delaybridge and shuts them down in data-flow order. Package cli
// reads the configuration and hands it here; tests build a bridge in-process
// with an injected store and clock.
package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/httpapi"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/storage"
)

// dispatchWorkers overlap the confirms of one forwarded batch with the next.
// A worker holds a dispatcher message from its arrival, up to a lookahead
// before its first due time, until its last forward is confirmed and removed:
// about a lookahead each. The poller hands one over per poll, every quarter
// lookahead or sooner, so four workers were all busy under steady load and
// hand-overs queued; sixteen leave room for slow commits. Each
// has its own channel.
const dispatchWorkers = 16

// lookahead is how far ahead of their due time timeouts are leased and handed
// to the dispatcher, which holds each forward until it is due: the hand-over
// (a confirmed publish through the broker to the dispatcher queue) then costs
// no lateness. 50 ms was too little under steady intake on a busy host: the
// hand-over's trip through the broker took longer for about 1% of rows, and
// at 2,000 msg/s p99 was 100–110 ms against 15–40 ms with 200 ms
// (docs/performance.md). A message leased this early can no longer be
// cancelled (409), so it is kept short.
const lookahead = 200 * time.Millisecond

// commitHold is how long intake and removals wait to share a store commit
// with what follows. At 2,000 msg/s with bbolt, committing as soon as
// possible (about 130 commits a second, four random pages rewritten per
// message) wrote 35–40 MB/s, and the disk then stalled the broker's own
// fsyncs, and its queues, for 100–1,300 ms at times; 100 ms apart the same
// load wrote 20–24 MB/s, with about 15% less of the bridge's CPU
// (docs/performance.md, "Steady intake while messages fall due"). Intake due within holdUrgent is not
// held, so holding never makes a message late.
const (
	commitHold = 100 * time.Millisecond
	holdUrgent = lookahead + 3*commitHold
)

// ShutdownDrain bounds how long shutdown waits for in-flight work (a forward
// window's confirms take at most 31 s) before cutting the connections.
// The Helm chart's terminationGracePeriodSeconds covers it (deploy/chart_test.go).
const ShutdownDrain = 45 * time.Second

// ErrCritical marks errors after which the process should exit 1 so that a
// supervisor restarts it.
var ErrCritical = errors.New("critical")

// Deps are what a bridge takes besides its configuration; all optional.
type Deps struct {
	Logger zerolog.Logger
	// Now is the clock of store, poller and dispatcher; nil means time.Now.
	Now func() time.Time
	// Store replaces the store cfg names (tests inject faults this way). The
	// bridge closes it on shutdown.
	Store storage.Store
	// OpenStore, when set and Store is not, opens the store in place of the
	// one cfg names (tests hold the start-up there).
	OpenStore func(context.Context) (storage.Store, error)
	// TLS configures amqps:// connections; nil uses the system's roots.
	TLS *tls.Config
	// Metrics receives the bridge's metrics; nil: the bridge makes its own
	// (see Bridge.Metrics).
	Metrics *metrics.Metrics
}

// Bridge owns every component and shuts them down in data-flow order.
type Bridge struct {
	cfg   config.Config
	deps  Deps
	log   zerolog.Logger
	owner string
	// processing names this bridge on its error copies.
	processing errorqueue.Processing
	ready      atomic.Bool
	// phase is what the bridge is doing while it starts, for /readyz.
	phase atomic.Pointer[string]
	// started is when New ran: the status page's uptime.
	started time.Time
}

// New returns a bridge for cfg; it starts nothing.
func New(cfg config.Config, deps Deps) *Bridge {
	host, _ := os.Hostname()
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.New()
	}
	return &Bridge{cfg: cfg, deps: deps, log: deps.Logger, owner: host + "-" + uuid.NewString()[:8],
		processing: errorqueue.NewProcessing(cfg.Endpoint, host), started: deps.Now()}
}

// Metrics are the bridge's metrics, served on GET /metrics.
func (b *Bridge) Metrics() *metrics.Metrics { return b.deps.Metrics }

// Ready reports whether the bridge is running and connected.
func (b *Bridge) Ready() bool { return b.ready.Load() }

// Run runs the bridge until ctx ends (returning nil after a clean shutdown)
// or a critical error (wrapping ErrCritical).
func (b *Bridge) Run(ctx context.Context) error {
	st := newStages(ctx, b.log)
	// The probes answer from the start: opening the store can take minutes
	// (a bbolt file of an earlier format is converted first; PostgreSQL
	// may wait for another instance's migration), and a liveness probe
	// that restarted the bridge then would start the conversion over.
	// /healthz answers 200 and /readyz 503 with the phase until the rest
	// of the routes are swapped in (serveHTTP).
	var srv *httpapi.Server
	var httpSrv *stage
	if b.cfg.HTTPAddr != "" {
		srv = httpapi.New(httpapi.Options{Addr: b.cfg.HTTPAddr, Logger: b.log,
			Ready: b.notRunning})
		if err := srv.Listen(); err != nil {
			return err
		}
		httpSrv = st.start("http", srv.Run)
		b.log.Info().Str("addr", srv.Addr()).Msg("http listening")
	}
	c, err := b.build(ctx, srv)
	if err != nil {
		st.stop(httpSrv)
		st.close()
		if ctx.Err() != nil {
			// Stopped while starting (SIGTERM while the store opened or
			// the broker was dialled): a clean stop, not a failure.
			b.log.Info().Err(err).Msg("stopped while starting")
			return nil
		}
		return err
	}
	publishConn := st.start("publish connection", c.publishConn.Run)
	consumeConn := st.start("consume connection", c.consumeConn.Run)
	ingestConn := st.start("ingest connection", c.ingestConn.Run)
	// The dispatcher starts first and alone: only once it holds the
	// dispatcher queue (exclusively, with a bbolt store) do polling and
	// intake begin, so a second instance is refused before it takes in a
	// single message.
	dispatcher := st.start("dispatch", c.dispatcher.Run)
	var poller, reaper, takeover, intake, sampler, bindings, firer *stage
	runErr, up := b.await(ctx, c.dispatching, c.critical, st.failed)
	if up {
		poller = st.start("poller", c.poller.Run)
		reaper = st.start("reaper", c.reaper.Run)
		if c.takeover != nil {
			takeover = st.start("takeover", c.takeover.Run)
		}
		if c.firer != nil {
			firer = st.start("recurring schedules", c.firer.Run)
		}
		intake = st.start("ingest", c.ingester.Run)
		if c.sampler != nil {
			sampler = st.start("status sampler", c.sampler)
		}
		if c.bindings != nil {
			bindings = st.start("binding check", c.bindings.Run)
		}
		b.ready.Store(true)
		b.log.Info().Str("endpoint", b.cfg.Endpoint).Str("owner", b.owner).Msg("delaybridge running")
		runErr, _ = b.await(ctx, nil, c.critical, st.failed)
	}
	b.setPhase("stopping")
	b.ready.Store(false)

	// Data-flow order: stop consuming, stop firing schedules (no new fire
	// rows), stop polling, drain dispatch. A
	// broker that stopped reading (a resource alarm) can block a publish or
	// channel call forever; past the deadline the connections are closed
	// under the stuck calls, which fails them (their work is released or
	// requeued, nothing is lost).
	deadline := time.After(ShutdownDrain)
	cut := func() { c.publishConn.Close(); c.consumeConn.Close(); c.ingestConn.Close() }
	for _, s := range []*stage{bindings, sampler, intake, firer, reaper, takeover, poller, dispatcher} {
		st.drain(s, deadline, cut)
	}
	c.errors.Flush() // no count of refused copies left unlogged
	st.stop(httpSrv)
	if err := c.store.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("close store: %w", err)
	}
	st.stop(publishConn)
	st.stop(consumeConn)
	st.stop(ingestConn)
	for _, err := range st.close() {
		if runErr == nil {
			runErr = err
		}
	}
	return runErr
}

// await waits until up closes (reported as true), ctx ends, a breaker
// triggers or a stage fails, and returns the error to stop with.
func (b *Bridge) await(ctx context.Context, up <-chan struct{}, critical, failed <-chan error) (error, bool) {
	select {
	case <-up:
		return nil, true
	case <-ctx.Done():
		b.log.Info().Msg("shutting down")
		return nil, false
	case e := <-critical:
		b.log.Error().Err(e).Msg("critical error: stopping intake and shutting down")
		return fmt.Errorf("%w: %w", ErrCritical, e), false
	case e := <-failed:
		return e, false
	}
}

// stage is one component running in its own goroutine with its own context,
// so that shutdown can stop the components one at a time.
type stage struct {
	name string
	stop context.CancelFunc
	done chan struct{}
}

// stages starts components and collects their failures.
type stages struct {
	parent context.Context
	failed chan error
	all    []*stage
	log    zerolog.Logger
}

func newStages(ctx context.Context, log zerolog.Logger) *stages {
	// Stages outlive ctx: shutdown stops them in order, not all at once.
	return &stages{parent: context.WithoutCancel(ctx), failed: make(chan error, 16), log: log}
}

// start runs run in a new stage; its error, if any, goes to failed.
func (ss *stages) start(name string, run func(context.Context) error) *stage {
	ctx, cancel := context.WithCancel(ss.parent)
	s := &stage{name: name, stop: cancel, done: make(chan struct{})}
	ss.all = append(ss.all, s)
	go func() {
		defer close(s.done)
		if err := run(ctx); err != nil {
			ss.failed <- fmt.Errorf("%s: %w", name, err)
		}
	}()
	return s
}

// drain stops s and waits for it; past deadline it calls cut (which makes a
// stuck stage's calls fail) and waits on. A nil s was never started.
func (ss *stages) drain(s *stage, deadline <-chan time.Time, cut func()) {
	if s == nil {
		return
	}
	s.stop()
	select {
	case <-s.done:
	case <-deadline:
		ss.log.Error().Str("stage", s.name).Dur("after", ShutdownDrain).Msg("stage did not stop in time; closing the broker connections under it")
		cut()
		<-s.done
	}
	ss.log.Debug().Str("stage", s.name).Msg("stopped")
}

// stop stops s and waits for it. A nil s was never started.
func (ss *stages) stop(s *stage) {
	if s != nil {
		s.stop()
		<-s.done
	}
}

// close returns the stages' failures; every stage must have stopped.
func (ss *stages) close() []error {
	close(ss.failed)
	var errs []error
	for e := range ss.failed {
		errs = append(errs, e)
	}
	return errs
}
