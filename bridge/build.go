package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/budget"
	"github.com/delaybridge/delaybridge/circuit"
	"github.com/delaybridge/delaybridge/dispatch"
	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/httpapi"
	"github.com/delaybridge/delaybridge/ingest"
	"github.com/delaybridge/delaybridge/management"
	"github.com/delaybridge/delaybridge/metrics"
	"github.com/delaybridge/delaybridge/poller"
	"github.com/delaybridge/delaybridge/protocol/delayed"
	"github.com/delaybridge/delaybridge/recurring"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// components are a built bridge: everything Run starts and stops.
type components struct {
	store                    storage.Store
	consumeConn, publishConn *broker.Conn
	poller                   *poller.Poller
	reaper                   *poller.Reaper
	takeover                 *poller.Reaper // nil unless the store is a storage.TakerOver
	// firer fires recurring schedules; nil when the store keeps none.
	firer      *recurring.Firer
	ingester   *ingest.Ingester
	dispatcher *dispatch.Dispatcher
	// dispatching closes once the dispatcher consumes.
	dispatching chan struct{}
	// critical receives the error of a triggered circuit breaker.
	critical chan error
	sampler  func(context.Context) error // the status page's sampler; nil without HTTP

	// ingestConn consumes the intake queues alone, so a message the AMQP
	// client cannot read there does not interrupt the dispatcher.
	ingestConn *broker.Conn

	// rules are ingest's, which replay applies too.
	rules ingest.Rules
	// errors puts the error copies of ingest, dispatch and the sweep on the
	// error queue; it paces those of ingest and dispatch alike while the
	// queue refuses them, and declares it again if it is gone.
	errors *errorqueue.Sender
	// bindings watches the delayed exchanges for foreign bindings; nil
	// without delayed exchanges.
	bindings *management.Watcher
}

// build opens the store, connects to the broker and builds every component;
// the HTTP server is listening when it returns. On an error it leaves
// nothing open.
func (b *Bridge) build(ctx context.Context, srv *httpapi.Server) (_ *components, err error) {
	cfg := b.cfg
	topo := broker.Topology{Endpoint: cfg.Endpoint, ErrorQueue: cfg.ErrorQueue, QueueType: cfg.QueueType}
	intake := intakeOf(protocols(cfg))
	c := &components{store: b.deps.Store, dispatching: make(chan struct{}), critical: make(chan error, 1)}
	if c.rules, err = b.rules(topo, intake); err != nil {
		return nil, err
	}
	if c.store == nil {
		b.setPhase("starting: opening the store")
		open := func(ctx context.Context) (storage.Store, error) {
			return openStore(ctx, cfg, b.owner, b.deps.Now, b.log)
		}
		if b.deps.OpenStore != nil {
			open = b.deps.OpenStore
		}
		if c.store, err = open(ctx); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			_ = c.store.Close()
		}
	}()
	b.watchStore(c.store)
	c.errors = b.errorSender(c, topo)

	b.setPhase("starting: connecting to the broker")
	if err := b.connect(c, topo, intake.declare); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.publishConn.Close()
			c.consumeConn.Close()
			c.ingestConn.Close()
		}
	}()
	b.buildPolling(c, topo, intake)
	// Half the byte budget for what is being taken in, half for what is
	// being forwarded: neither can starve the other.
	intakeBudget, dispatchBudget := budget.New(cfg.MaxInflightBytes/2), budget.New(cfg.MaxInflightBytes-cfg.MaxInflightBytes/2)
	c.ingester = b.newIngester(c, intake, intakeBudget)
	c.dispatcher = b.newDispatcher(c, topo, intake, dispatchBudget)
	if c.bindings, err = b.bindingWatch(topo); err != nil {
		return nil, err
	}
	if srv != nil {
		b.serveHTTP(c, srv)
	}
	b.setPhase("starting: waiting for the dispatcher queue")
	return c, nil
}

// rules are what ingest checks each message against: the allowed
// destinations (with the intake protocols' routing exchanges), and the
// bridge's own queues, which no message may name.
func (b *Bridge) rules(topo broker.Topology, intake intakes) (ingest.Rules, error) {
	cfg := b.cfg
	allowed, err := ingest.CompileGlobs(cfg.AllowedDestinations)
	if err != nil {
		return ingest.Rules{}, fmt.Errorf("DELAYBRIDGE_ALLOWED_DESTINATIONS: %w", err)
	}
	return ingest.Rules{
		MaxDelay: cfg.MaxDelay, MaxMessageBytes: cfg.MaxMessageBytes, Allowed: allowed.WithExchanges(intake.routes...),
		// The error queue too: a forward there would read as a failure.
		Reserved: append([]string{topo.TimeoutsQueue(), topo.DispatcherQueue(), cfg.ErrorQueue}, intake.reserved...),
	}, nil
}

// watchStore has the metrics read the store's counts when scraped.
func (b *Bridge) watchStore(s storage.Store) {
	cfg, met, now := b.cfg, b.deps.Metrics, b.deps.Now
	met.WatchStore(s.Stats, s.NextDue, now)
	met.WatchDestinations(metrics.DestinationOptions{Now: now, MaxDestinations: cfg.MetricsMaxDestinations,
		Interval: cfg.MetricsDestinationInterval, Count: s.CountByDestination, Paused: s.Paused})
}

// errorSender is the one sender of error copies (components.errors); it
// declares the error queue again on the publish connection when it is gone.
func (b *Bridge) errorSender(c *components, topo broker.Topology) *errorqueue.Sender {
	met := b.deps.Metrics
	errs := errorqueue.New(errorqueue.Options{Queue: b.cfg.ErrorQueue, Processing: b.processing, Metrics: met, Now: b.deps.Now,
		// With the arguments of every declaration (Topology.Declare).
		Declare: func(ctx context.Context) error {
			conn, err := c.publishConn.Wait(ctx)
			if err != nil {
				return err
			}
			ch, err := conn.Channel()
			if err != nil {
				return fmt.Errorf("open channel: %w", err)
			}
			defer ch.Close()
			return topo.DeclareErrorQueue(ch)
		},
		Logger: b.log.With().Str("component", "error-queue").Logger(),
	})
	met.WatchErrorQueue(func() bool { refusing, _, _ := errs.Refusing(); return refusing })
	return errs
}

// leaseReleaser is the store's storage.LeaseReleaser where the poller's
// hand-overs may be transient: where every lease is this process's and can
// be freed when the broker may have lost their tokens, a store that is not
// shared (bbolt). Nil otherwise.
func leaseReleaser(s storage.Store) storage.LeaseReleaser {
	if r, ok := s.(storage.LeaseReleaser); ok && !s.Properties().Shared {
		return r
	}
	return nil
}

// buildPolling builds what hands the store's due rows to the dispatcher:
// the poller, the firer of recurring schedules when the store keeps them,
// the reaper of expired leases, and the takeover of a dead instance's
// leases when the store is shared by several.
func (b *Bridge) buildPolling(c *components, topo broker.Topology, intake intakes) {
	cfg, log, now, met := b.cfg, b.log, b.deps.Now, b.deps.Metrics
	c.poller = poller.New(c.store, func(ctx context.Context) (poller.Publisher, error) {
		return c.publishConn.Publisher(ctx, cfg.BatchSize)
	}, poller.Options{
		Owner: b.owner, DispatcherQueue: topo.DispatcherQueue(), BatchSize: cfg.BatchSize,
		LeaseDuration: cfg.LockLeaseDuration, PollInterval: cfg.PollInterval, Lookahead: lookahead, Now: now,
		MaxLeased: 20 * cfg.BatchSize, Transient: leaseReleaser(c.store) != nil,
		FetchBreaker: b.breaker(c, "fetch", cfg.TimeToTriggerFetchCircuitBreaker),
		Metrics:      met,
		Logger:       log.With().Str("component", "poller").Logger(),
	})
	if sc, ok := c.store.(storage.Scheduler); ok {
		// Recurring schedules (docs/contract.md §2.11): fires are stored a
		// lookahead ahead, so the poller hands them over in time to be
		// forwarded on the second; another instance's new schedule is seen
		// within a poll interval.
		met.WatchSchedules(sc.ListSchedules)
		c.firer = recurring.New(met.FireCounter(sc), recurring.Options{Lead: lookahead, MaxWait: cfg.PollInterval, Wake: c.poller.Wake, Now: now,
			Threshold: cfg.MisfireThreshold, Stampers: intake.fires,
			Logger: log.With().Str("component", "recurring").Logger()})
	}
	c.reaper = &poller.Reaper{Store: c.store, Interval: cfg.LockLeaseDuration / 4,
		Logger: log.With().Str("component", "reaper").Logger()}
	if to, ok := c.store.(storage.TakerOver); ok {
		// A dead instance's leases are freed within this interval of the
		// store's grace (docs/contract.md §7.1); the poller is woken for
		// them, as they are overdue.
		p := c.poller
		c.takeover = &poller.Reaper{Store: takeOverFunc(to.TakeOver), Interval: min(cfg.LockLeaseDuration/10, takeoverEvery),
			OnReap: func(n int) {
				if n > 0 {
					p.Wake(now())
				}
			},
			Quiet: true, Logger: log.With().Str("component", "takeover").Logger()}
	}
}

// newIngester builds the consumer of the intake queues, holding at most
// inflight bytes.
func (b *Bridge) newIngester(c *components, intake intakes, inflight *budget.Budget) *ingest.Ingester {
	cfg := b.cfg
	return ingest.New(c.ingestConn, func(ctx context.Context) (ingest.Publisher, error) { return c.publishConn.Publisher(ctx, cfg.Prefetch) }, c.store, ingest.Options{
		Sources: intake.sources,
		Errors:  c.errors, Prefetch: cfg.Prefetch, MaxBatch: min(cfg.Prefetch, 500), Wake: c.poller.Wake, Now: b.deps.Now,
		ScheduleWake: c.wakeFirer,
		Hold:         commitHold, Urgent: holdUrgent,
		Budget: inflight, ExpectedBytes: cfg.MaxMessageBytes,
		Rules:        c.rules,
		StoreBreaker: b.breaker(c, "store", cfg.TimeToTriggerStoreCircuitBreaker),
		Metrics:      b.deps.Metrics,
		Logger:       b.log.With().Str("component", "ingest").Logger(),
	})
}

// newDispatcher builds the consumer of the dispatcher queue, holding at
// most inflight bytes.
func (b *Bridge) newDispatcher(c *components, topo broker.Topology, intake intakes, inflight *budget.Budget) *dispatch.Dispatcher {
	cfg := b.cfg
	var reconnected func() int
	if r := leaseReleaser(c.store); r != nil {
		reconnected = r.ReleaseLeases
	}
	var once sync.Once
	return dispatch.New(c.consumeConn, func(ctx context.Context) (dispatch.Publisher, error) { return c.publishConn.Publisher(ctx, 1000) }, c.store, dispatch.Options{
		Queue: topo.DispatcherQueue(), TimeoutsQueue: topo.TimeoutsQueue(), Errors: c.errors,
		// A store that is not shared (a bbolt file) serves one instance; a
		// second one on this endpoint would take tokens for rows it does
		// not have and drop them. With a shared store every instance sees
		// every row, so any may dispatch.
		Exclusive:   !c.store.Properties().Shared,
		OnConsuming: func() { once.Do(func() { close(c.dispatching) }) },
		Reconnected: reconnected,
		Stamp:       intake.stamp,
		Prefetch:    cfg.Prefetch, Workers: dispatchWorkers, LeaseDuration: cfg.LockLeaseDuration, NumberOfRetries: cfg.NumberOfRetries, Allowed: c.rules.Allowed,
		Budget: inflight, ExpectedRowBytes: cfg.MaxMessageBytes, RemoveHold: commitHold,
		// Failure handling that itself keeps failing is a critical error.
		RecoveryFailuresPerSecond: cfg.MaxRecoveryFailuresPerSecond,
		OnCritical:                c.raise,
		Breaker:                   b.breaker(c, "dispatch", cfg.TimeToTriggerDispatchBreaker),
		Metrics:                   b.deps.Metrics,
		Now:                       b.deps.Now, Logger: b.log.With().Str("component", "dispatch").Logger(),
	})
}

// bindingWatch watches the delayed exchanges, through the management API,
// for bindings other than the bridge's own (docs/contract.md §2.7): AMQP
// cannot list bindings. Nil without delayed exchanges.
func (b *Bridge) bindingWatch(topo broker.Topology) (*management.Watcher, error) {
	cfg, met := b.cfg, b.deps.Metrics
	xs := cfg.DelayedExchangeList()
	if len(xs) == 0 {
		return nil, nil
	}
	client, err := management.New(cfg.ManagementURL, cfg.AMQPURL, b.deps.TLS)
	if err != nil {
		return nil, fmt.Errorf("DELAYBRIDGE_MANAGEMENT_URL: %w", err)
	}
	names := make([]string, len(xs))
	for i, x := range xs {
		names[i] = x.Name
	}
	return management.NewWatcher(management.WatchOptions{
		Lister: client, Exchanges: names, Interval: cfg.BindingCheckInterval,
		Own: func(bd management.Binding) bool {
			return delayed.OwnBinding(topo.TimeoutsQueue(), bd.DestinationType == "queue", bd.Destination, bd.Arguments)
		},
		Report: func(x string, foreign []management.Binding) { met.ForeignBindings(x, len(foreign)) },
		Hint: "Enable the rabbitmq_management plugin, or set DELAYBRIDGE_MANAGEMENT_URL to the API " +
			"(http://user:password@host:15672/; the user needs the monitoring or management tag and read access to the vhost).",
		Logger: b.log.With().Str("component", "bindings").Logger(),
	}), nil
}

// connect makes the consume, ingest and publish connections. They are
// separate: a publisher blocked by flow control must not stall the consumers,
// and vice versa; a message on an intake queue that the AMQP client cannot
// read drops the ingest connection, not the dispatcher's. Each reconnects on
// its own and redeclares the queues, then what the intake protocols need.
func (b *Bridge) connect(c *components, topo broker.Topology, declareIntake func(*amqp.Connection) error) error {
	declare := func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		err = topo.Declare(ch)
		_ = ch.Close()
		if err != nil {
			return err
		}
		return declareIntake(conn)
	}
	// Consumers whose connection died on a message the client cannot read
	// move it to the error queue with this (docs/contract.md §4.5).
	sweeper := broker.NewSweeper(broker.SweepOptions{
		Name: "delaybridge sweep " + b.owner, TLS: b.deps.TLS, ErrorQueue: b.cfg.ErrorQueue,
		Move: func(ctx context.Context, m broker.Unreadable) error {
			return c.errors.SendUnreadable(ctx, func(ctx context.Context, msg amqp.Publishing) error {
				return broker.PublishOne(ctx, c.publishConn, b.cfg.ErrorQueue, msg)
			}, m)
		},
		Limit:  b.cfg.Prefetch,
		Logger: b.log.With().Str("component", "sweep").Logger(),
	})
	newConn := func(role string, sw *broker.Sweeper) *broker.Conn {
		return broker.NewConn(broker.ConnOptions{
			URLs: b.cfg.AMQPURLs(), Name: "delaybridge " + role + " " + b.owner,
			Config: amqp.Config{TLSClientConfig: b.deps.TLS}, OnConnect: declare, Sweeper: sw,
			Logger: b.log.With().Str("component", "broker").Logger(),
		})
	}
	c.consumeConn, c.ingestConn, c.publishConn = newConn("consume", sweeper), newConn("ingest", sweeper), newConn("publish", nil)
	met := b.deps.Metrics
	for name, conn := range map[string]*broker.Conn{"consume": c.consumeConn, "ingest": c.ingestConn, "publish": c.publishConn} {
		met.WatchConnection(name, conn.Connected)
		met.WatchBlocked(name, func() bool { return conn.Blocked() != "" })
	}
	if err := c.publishConn.Connect(); err != nil {
		return err
	}
	if err := c.consumeConn.Connect(); err != nil {
		c.publishConn.Close()
		return err
	}
	if err := c.ingestConn.Connect(); err != nil {
		c.publishConn.Close()
		c.consumeConn.Close()
		return err
	}
	b.log.Info().Str("consume", c.consumeConn.Broker()).Str("ingest", c.ingestConn.Broker()).
		Str("publish", c.publishConn.Broker()).Msg("connected to the broker")
	return nil
}

// breaker returns a circuit breaker whose trigger is a critical error: the
// bridge stops so that a supervisor restarts it.
func (b *Bridge) breaker(c *components, name string, timeToTrigger time.Duration) *circuit.Breaker {
	met := b.deps.Metrics
	met.BreakerState(name, circuit.Disarmed)
	return circuit.New(name, timeToTrigger, circuit.Options{
		Now:       b.deps.Now,
		OnTrigger: c.raise,
		OnChange: func(name string, s circuit.State, cause error) {
			ev := b.log.Warn()
			if s == circuit.Disarmed {
				ev = b.log.Info()
			}
			ev.Str("breaker", name).Str("state", s.String()).AnErr("cause", cause).Msg("circuit breaker " + s.String())
			met.BreakerState(name, s)
		},
	})
}

// serveHTTP builds the full routes (admin API, status page, probes,
// metrics) and swaps them into srv, which Run started listening before
// the store opened (a taken port fails start-up there).
func (b *Bridge) serveHTTP(c *components, srv *httpapi.Server) {
	cfg, log, now := b.cfg, b.log, b.deps.Now
	// Without a token the admin handler answers every /api/v1/ request with
	// 404 and a JSON error saying the admin API is disabled.
	replayer := &admin.Replayer{Conn: b.dialReplay, Release: func(c *amqp.Connection) { _ = c.Close() },
		ErrorQueue: cfg.ErrorQueue, Store: c.store, Now: now,
		TimeoutsQueue: wire.TimeoutsQueue(cfg.Endpoint), Rules: c.rules,
		// A copy the AMQP client cannot read is held aside, untouched,
		// while the pass is made again (docs/contract.md §4.4).
		Hold: func(ctx context.Context, queue string, limit int) (*broker.Held, error) {
			return broker.HoldUnreadable(ctx, broker.HoldOptions{URLs: cfg.AMQPURLs(), TLS: b.deps.TLS, Name: "delaybridge replay " + b.owner}, queue, limit)
		}}
	admOpts := admin.Options{Store: c.store, Token: cfg.AdminToken, Now: now, Wake: c.poller.Wake, ScheduleWake: c.wakeFirer,
		Replay: replayer.Replay, Errors: replayer.Errors, Logger: log.With().Str("component", "admin").Logger()}
	adm := admin.New(admOpts)
	statusPage := b.newStatusPage(c, admin.NewOps(admOpts), replayer.Errors)
	c.sampler = statusPage.Run
	srv.Swap(httpapi.Options{Admin: adm, Status: statusPage,
		Vars:    func(ctx context.Context) map[string]any { return b.vars(ctx, c) },
		Ready:   func() error { return b.readiness(c) },
		Metrics: b.deps.Metrics.Handler(), Pprof: cfg.Pprof, Logger: log})
}

// setPhase records what the bridge is doing while it is not running, for
// /readyz.
func (b *Bridge) setPhase(p string) { b.phase.Store(&p) }

// notRunning is why /readyz answers 503 while the bridge starts or stops.
func (b *Bridge) notRunning() error {
	if p := b.phase.Load(); p != nil {
		return errors.New(*p)
	}
	return errors.New("starting")
}

// vars are the bridge's entries in /debug/vars.
func (b *Bridge) vars(ctx context.Context, c *components) map[string]any {
	vars := map[string]any{"owner": b.owner, "ready": b.ready.Load()}
	if pending, leased, err := c.store.Stats(ctx); err == nil {
		vars["pending"], vars["leased"] = pending, leased
	}
	return vars
}

// readiness is /readyz: nil when the bridge runs, all its connections are up,
// the broker takes publishes and the store answers.
func (b *Bridge) readiness(c *components) error {
	switch {
	case !b.ready.Load():
		return b.notRunning()
	case !c.consumeConn.Connected() || !c.ingestConn.Connected() || !c.publishConn.Connected():
		return errors.New("not connected to the broker")
	case c.publishConn.Blocked() != "":
		// No forward, token or error copy gets out until the alarm lifts.
		return fmt.Errorf("the broker blocks publishing: %s", c.publishConn.Blocked())
	}
	if refusing, since, cause := c.errors.Refusing(); refusing {
		// Invalid messages wait on E.Timeouts, holding prefetch slots, and
		// failed ones in the store, until it takes copies again.
		return fmt.Errorf("the error queue %q refuses copies since %s: %s", b.cfg.ErrorQueue, since.UTC().Format(time.RFC3339), cause)
	}
	// The store must answer too (cheap: NextDue reads two keys).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, _, err := c.store.NextDue(ctx); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// dialReplay connects for one replay pass, trying each broker in turn. The
// pass reads the error queue, where any endpoint's copies land; one the AMQP
// client cannot read drops this connection only (docs/contract.md §4.5).
func (b *Bridge) dialReplay(ctx context.Context) (*amqp.Connection, error) {
	var errs []error
	for _, u := range b.cfg.AMQPURLs() {
		if ctx.Err() != nil {
			break
		}
		conn, err := broker.Dial(u, "delaybridge replay "+b.owner, amqp.Config{TLSClientConfig: b.deps.TLS})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(append(errs, ctx.Err())...)
}

// wakeFirer has the firer read the next fire time again (a schedule was
// stored).
func (c *components) wakeFirer() {
	if c.firer != nil {
		c.firer.Wake()
	}
}

// raise hands a critical error to Run, which stops the bridge; it is
// dropped while another waits there.
func (c *components) raise(err error) {
	select {
	case c.critical <- err:
	default:
	}
}
