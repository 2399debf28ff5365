// Package bridge wires ingest, store, poller, dispatcher and HTTP into one
// running delaybridge and shuts them down in data-flow order. main reads the
// configuration and hands it here; tests build a bridge in-process with an
// injected store and clock.
package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"golang.org/x/time/rate"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/dispatch"
	"github.com/delaybridge/delaybridge/httpapi"
	"github.com/delaybridge/delaybridge/ingest"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/poller"
	"github.com/delaybridge/delaybridge/storage"
)

// dispatchWorkers overlap the confirms of one forwarded batch with the next.
const dispatchWorkers = 4

// lookahead is how far ahead of their due time timeouts are leased and handed
// to the dispatcher, which holds each forward until it is due: the hand-over
// (a store commit and a confirmed publish) then costs no lateness.
const lookahead = 50 * time.Millisecond

// shutdownDrain bounds how long shutdown waits for in-flight work (a forward
// window's confirms take at most 31 s) before cutting the connections.
const shutdownDrain = 45 * time.Second

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
	ready atomic.Bool
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
	return &Bridge{cfg: cfg, deps: deps, log: deps.Logger, owner: host + "-" + uuid.NewString()[:8]}
}

// Metrics are the bridge's metrics, served on GET /metrics.
func (b *Bridge) Metrics() *metrics.Metrics { return b.deps.Metrics }

// Ready reports whether the bridge is running and connected.
func (b *Bridge) Ready() bool { return b.ready.Load() }

// Run runs the bridge until ctx ends (returning nil after a clean shutdown)
// or a critical error (wrapping ErrCritical).
func (b *Bridge) Run(ctx context.Context) (err error) {
	cfg, log := b.cfg, b.log
	topo := broker.Topology{Endpoint: cfg.Endpoint, ErrorQueue: cfg.ErrorQueue, QueueType: cfg.QueueType}
	allowed, err := ingest.CompileGlobs(cfg.AllowedDestinations)
	if err != nil {
		return fmt.Errorf("DELAYBRIDGE_ALLOWED_DESTINATIONS: %w", err)
	}
	now := b.deps.Now
	met := b.deps.Metrics

	store := b.deps.Store
	if store == nil {
		if store, err = openStore(ctx, cfg, b.owner, now, log); err != nil {
			return err
		}
	}
	defer store.Close() // for early returns; Close is idempotent
	var storeStats func(context.Context) (int, int, error)
	if st, ok := store.(interface {
		Stats(context.Context) (int, int, error)
	}); ok {
		storeStats = st.Stats
	}
	met.WatchStore(storeStats, store.NextDue, now)

	// Separate connections: a publisher blocked by flow control must not
	// stall the consumers, and vice versa. Each reconnects on its own.
	declare := func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		defer ch.Close()
		return topo.Declare(ch)
	}
	amqpCfg := amqp.Config{TLSClientConfig: b.deps.TLS}
	newConn := func(role string) *broker.Conn {
		return broker.NewConn(broker.ConnOptions{
			URLs: cfg.AMQPURLs(), Name: "delaybridge " + role + " " + b.owner, Config: amqpCfg, OnConnect: declare,
			Logger: log.With().Str("component", "broker").Logger(),
		})
	}
	consumeConn, publishConn := newConn("consume"), newConn("publish")
	met.WatchConnection("consume", consumeConn.Connected)
	met.WatchConnection("publish", publishConn.Connected)
	met.WatchBlocked("consume", func() bool { return consumeConn.Blocked() != "" })
	met.WatchBlocked("publish", func() bool { return publishConn.Blocked() != "" })
	if err := publishConn.Connect(); err != nil {
		return err
	}
	if err := consumeConn.Connect(); err != nil {
		publishConn.Close()
		return err
	}
	log.Info().Str("consume", consumeConn.Broker()).Str("publish", publishConn.Broker()).Msg("connected to the broker")

	// A triggered breaker is a critical error: the bridge stops so that a
	// supervisor restarts it.
	critical := make(chan error, 1)
	breaker := func(name string, ttt time.Duration) *circuit.Breaker {
		met.BreakerState(name, circuit.Disarmed)
		return circuit.New(name, ttt, circuit.Options{
			Now: now,
			OnTrigger: func(err error) {
				select {
				case critical <- err:
				default:
				}
			},
			OnChange: func(name string, s circuit.State, cause error) {
				ev := log.Warn()
				if s == circuit.Disarmed {
					ev = log.Info()
				}
				ev.Str("breaker", name).Str("state", s.String()).AnErr("cause", cause).Msg("circuit breaker " + s.String())
				met.BreakerState(name, s)
			},
		})
	}
	publisher := func(window int) func(context.Context) (*broker.Publisher, error) {
		return func(ctx context.Context) (*broker.Publisher, error) { return publishConn.Publisher(ctx, window) }
	}
	ingestPub, pollPub, dispatchPub := publisher(cfg.Prefetch), publisher(cfg.BatchSize), publisher(1000)

	pl := poller.New(store, func(ctx context.Context) (poller.Publisher, error) { return pollPub(ctx) }, poller.Options{
		Owner: b.owner, DispatcherQueue: topo.DispatcherQueue(), BatchSize: cfg.BatchSize,
		LeaseDuration: cfg.LockLeaseDuration, PollInterval: cfg.PollInterval, Lookahead: lookahead, Now: now,
		MaxLeased:    20 * cfg.BatchSize,
		FetchBreaker: breaker("fetch", cfg.TimeToTriggerFetchCircuitBreaker),
		Metrics:      met,
		Logger:       log.With().Str("component", "poller").Logger(),
	})
	in := ingest.New(consumeConn, func(ctx context.Context) (ingest.Publisher, error) { return ingestPub(ctx) }, store, ingest.Options{
		Sources: []ingest.Source{ingest.TimeoutsSource(topo.TimeoutsQueue())}, ErrorQueue: cfg.ErrorQueue, Prefetch: cfg.Prefetch,
		MaxBatch: min(cfg.Prefetch, 500), Wake: pl.Wake, Now: now,
		Rules: ingest.Rules{
			MaxDelay: cfg.MaxDelay, MaxMessageBytes: cfg.MaxMessageBytes, Allowed: allowed,
			Reserved: []string{topo.TimeoutsQueue(), topo.DispatcherQueue()},
		},
		StoreBreaker: breaker("store", cfg.TimeToTriggerStoreCircuitBreaker),
		Metrics:      met,
		Logger:       log.With().Str("component", "ingest").Logger(),
	})
	dispatching := make(chan struct{})
	var dispatchingOnce sync.Once
	dp := dispatch.New(consumeConn, func(ctx context.Context) (dispatch.Publisher, error) { return dispatchPub(ctx) }, store, dispatch.Options{
		Queue: topo.DispatcherQueue(), TimeoutsQueue: topo.TimeoutsQueue(), ErrorQueue: cfg.ErrorQueue,
		// A bbolt file serves one instance; a second one on this endpoint
		// would take tokens for rows it does not have and drop them. With
		// PostgreSQL every instance sees every row, so any may dispatch.
		Exclusive:   cfg.Store != "postgres",
		OnConsuming: func() { dispatchingOnce.Do(func() { close(dispatching) }) },
		Prefetch:    cfg.Prefetch, Workers: dispatchWorkers, LeaseDuration: cfg.LockLeaseDuration, NumberOfRetries: cfg.NumberOfRetries, Allowed: allowed,
		FailureCountLimit: rate.NewLimiter(rate.Limit(cfg.MaxRecoveryFailuresPerSecond), cfg.MaxRecoveryFailuresPerSecond),
		Breaker:           breaker("dispatch", cfg.TimeToTriggerDispatchBreaker),
		Metrics:           met,
		Now:               now, Logger: log.With().Str("component", "dispatch").Logger(),
	})

	var httpSrv *httpapi.Server
	var statusRun func(context.Context) error // samples the status page's counters
	if cfg.HTTPAddr != "" {
		// Without a token the admin handler answers every /api/v1/ request
		// with 404 and a JSON error saying the admin API is disabled.
		replayer := &admin.Replayer{Conn: consumeConn.Wait, ErrorQueue: cfg.ErrorQueue, Store: store, Now: now}
		adm := admin.New(admin.Options{Store: store, Token: cfg.AdminToken, Now: now, Wake: pl.Wake,
			Replay: replayer.Replay, Logger: log.With().Str("component", "admin").Logger()})
		statusPage := newStatusPage(cfg.Endpoint, store, storeStats, now, met, consumeConn, publishConn)
		statusRun = statusPage.Run
		httpSrv = httpapi.New(httpapi.Options{Addr: cfg.HTTPAddr,
			Admin:  adm,        // ADMIN-WIRING: the admin API handler (issue 5)
			Status: statusPage, // STATUS-WIRING: the status page handler (issue 5)
			Vars: func(ctx context.Context) map[string]any {
				vars := map[string]any{"owner": b.owner, "ready": b.ready.Load()}
				if st, ok := store.(interface {
					Stats(context.Context) (int, int, error)
				}); ok {
					if pending, leased, err := st.Stats(ctx); err == nil {
						vars["pending"], vars["leased"] = pending, leased
					}
				}
				return vars
			}, Ready: func() error {
				switch {
				case !b.ready.Load():
					return errors.New("starting or stopping")
				case !consumeConn.Connected() || !publishConn.Connected():
					return errors.New("not connected to the broker")
				case publishConn.Blocked() != "":
					// No forward, token or error copy gets out until
					// the alarm lifts.
					return fmt.Errorf("the broker blocks publishing: %s", publishConn.Blocked())
				}
				// The store must answer too (cheap: NextDue reads two keys).
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				if _, _, err := store.NextDue(ctx); err != nil {
					return fmt.Errorf("store: %w", err)
				}
				return nil
			}, Metrics: met.Handler(), Logger: log})
		if err := httpSrv.Listen(); err != nil {
			return err
		}
	}

	// One context per stage so shutdown can stop them in data-flow order.
	type stage struct {
		name string
		run  func(context.Context) error
		stop context.CancelFunc
		done chan struct{}
	}
	failed := make(chan error, 8)
	start := func(name string, run func(context.Context) error) *stage {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s := &stage{name: name, run: run, stop: cancel, done: make(chan struct{})}
		go func() {
			defer close(s.done)
			if err := run(sctx); err != nil {
				failed <- fmt.Errorf("%s: %w", name, err)
			}
		}()
		return s
	}
	connStages := []*stage{start("publish connection", publishConn.Run), start("consume connection", consumeConn.Run)}
	var httpStage *stage
	if httpSrv != nil {
		httpStage = start("http", httpSrv.Run)
		log.Info().Str("addr", httpSrv.Addr()).Msg("http listening")
	}
	// The dispatcher starts first and alone: only once it holds the
	// dispatcher queue (exclusively, with a bbolt store) do polling and
	// intake begin, so a second instance is refused before it takes in a
	// single message.
	stages := []*stage{start("dispatch", dp.Run)}
	var runErr error
	select {
	case <-dispatching:
		reaper := &poller.Reaper{Store: store, Interval: cfg.LockLeaseDuration / 4,
			Logger: log.With().Str("component", "reaper").Logger()}
		stages = append(stages, start("poller", pl.Run), start("reaper", reaper.Run), start("ingest", in.Run))
		if statusRun != nil {
			stages = append(stages, start("status sampler", statusRun))
		}
		b.ready.Store(true)
		log.Info().Str("endpoint", cfg.Endpoint).Str("owner", b.owner).Msg("delaybridge running")
		select {
		case <-ctx.Done():
			log.Info().Msg("shutting down")
		case e := <-critical:
			runErr = fmt.Errorf("%w: %w", ErrCritical, e)
			log.Error().Err(e).Msg("critical error: stopping intake and shutting down")
		case runErr = <-failed:
		}
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case runErr = <-failed:
	}
	b.ready.Store(false)

	// Data-flow order: stop consuming, stop polling, drain dispatch. A
	// broker that stopped reading (a resource alarm) can block a publish or
	// channel call forever; past the deadline the connections are closed
	// under the stuck calls, which fails them (their work is released or
	// requeued, nothing is lost).
	deadline := time.After(shutdownDrain)
	for i := len(stages) - 1; i >= 0; i-- {
		s := stages[i]
		s.stop()
		select {
		case <-s.done:
		case <-deadline:
			log.Error().Str("stage", s.name).Dur("after", shutdownDrain).Msg("stage did not stop in time; closing the broker connections under it")
			publishConn.Close()
			consumeConn.Close()
			<-s.done
		}
		log.Debug().Str("stage", s.name).Msg("stopped")
	}
	if httpStage != nil {
		httpStage.stop()
		<-httpStage.done
	}
	if cerr := store.Close(); cerr != nil && runErr == nil {
		runErr = fmt.Errorf("close store: %w", cerr)
	}
	for _, s := range connStages {
		s.stop()
		<-s.done
	}
	close(failed)
	for e := range failed {
		if runErr == nil {
			runErr = e
		}
	}
	return runErr
}
