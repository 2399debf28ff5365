package bridge

// Fault-injection tests of the whole bridge, in-process, against a real
// RabbitMQ broker (DELAYBRIDGE_TEST_AMQP_URL, default
// amqp://guest:guest@127.0.0.1:5672/; unreachable: skipped, or failed under
// CI=true). Each test runs one bridge on its own endpoint and error queue, with
// a boltstore wrapped in a faultstore, and checks docs/contract.md (§3 delivery,
// §4 errors, §5 circuit breakers) while the store fails or is slow.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/storage/boltstore"
	"github.com/delaybridge/delaybridge/storage/faultstore"
)

// testAMQPURL is the test broker: $DELAYBRIDGE_TEST_AMQP_URL or the local one.
func testAMQPURL() string { return testenv.AMQPURLFromEnv() }

// dialBroker connects to the test broker, or skips (fails under CI=true); the
// connection is closed when the test ends (testenv.DialAMQP).
func dialBroker(t *testing.T) *amqp.Connection {
	t.Helper()
	return testenv.DialAMQP(t)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// harness is one bridge on its own endpoint with a faultstore over a
// boltstore, and the test's own broker connection.
type harness struct {
	t          *testing.T
	endpoint   string
	errorQueue string
	dest       string
	storePath  string

	conn  *amqp.Connection
	pubCh *amqp.Channel
	fs    *faultstore.Store
	inner *boltstore.Store
	br    *Bridge
	logs  *logtest.Buffer // printed when a test fails

	cancel   context.CancelFunc
	done     chan error
	returned bool
	result   error
}

// newHarness configures (through DELAYBRIDGE_* variables and config.Load, as
// main does) a bridge for this test; env overrides the test defaults. The
// bridge is not started.
func newHarness(t *testing.T, name string, env map[string]string) *harness {
	t.Helper()
	conn := dialBroker(t)
	h := &harness{
		t:        t,
		endpoint: "bt-" + name + "-" + randomHex(4),
		conn:     conn,
		logs:     &logtest.Buffer{},
	}
	h.errorQueue = h.endpoint + ".error"
	h.dest = h.endpoint + ".dest"
	h.storePath = filepath.Join(t.TempDir(), "delaybridge.db")
	t.Cleanup(h.cleanup)

	vars := map[string]string{
		"DELAYBRIDGE_AMQP_URL":                                 testAMQPURL(),
		"DELAYBRIDGE_ENDPOINT":                                 h.endpoint,
		"DELAYBRIDGE_ERROR_QUEUE":                              h.errorQueue,
		"DELAYBRIDGE_STORE":                                    "bbolt",
		"DELAYBRIDGE_STORE_PATH":                               h.storePath,
		"DELAYBRIDGE_HTTP_ADDR":                                "",
		"DELAYBRIDGE_POLL_INTERVAL":                            "100ms",
		"DELAYBRIDGE_LOCK_LEASE_DURATION":                      "5m",
		"DELAYBRIDGE_BATCH_SIZE":                               "1000",
		"DELAYBRIDGE_PREFETCH":                                 "500",
		"DELAYBRIDGE_NUMBER_OF_RETRIES":                        "5",
		"DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER":    "1m",
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER":    "1m",
		"DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "1m",
		"DELAYBRIDGE_MAXIMUM_RECOVERY_FAILURES_PER_SECOND":     "1",
		"DELAYBRIDGE_MAX_DELAY":                                "0",
		"DELAYBRIDGE_ALLOWED_DESTINATIONS":                     "*",
		"DELAYBRIDGE_QUEUE_TYPE":                               "classic",
		"DELAYBRIDGE_LOG_LEVEL":                                "info",
		"DELAYBRIDGE_LOG_FORMAT":                               "json",
	}
	for k, v := range env {
		vars[k] = v
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	if _, set := env["DELAYBRIDGE_HTTP_ADDR"]; !set {
		cfg.HTTPAddr = "" // disabled, whatever envconfig made of the empty value
	}

	h.inner, err = boltstore.Open(h.storePath, boltstore.Options{})
	if err != nil {
		t.Fatalf("boltstore.Open: %v", err)
	}
	h.fs = faultstore.Wrap(h.inner)
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	logger := zerolog.New(h.logs).Level(level).With().Timestamp().Logger()
	h.br = New(cfg, Deps{Logger: logger, Store: h.fs})

	h.pubCh, err = conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	if err := h.pubCh.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	h.declare(h.dest)
	return h
}

func (h *harness) topology() broker.Topology {
	return broker.Topology{Endpoint: h.endpoint, ErrorQueue: h.errorQueue}
}
func (h *harness) timeoutsQueue() string   { return h.topology().TimeoutsQueue() }
func (h *harness) dispatcherQueue() string { return h.topology().DispatcherQueue() }

// cleanup stops the bridge, deletes the test's queues and closes the
// connection; on failure it prints the end of the bridge's log.
func (h *harness) cleanup() {
	t := h.t
	if h.cancel != nil {
		h.cancel()
		if _, ok := h.wait(15 * time.Second); !ok {
			t.Errorf("Run did not return within 15 s of cancelling its context")
		}
	}
	if ch, err := h.conn.Channel(); err == nil {
		for _, q := range []string{h.timeoutsQueue(), h.dispatcherQueue(), h.errorQueue, h.dest} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Logf("delete queue %s: %v", q, err)
				if ch, err = h.conn.Channel(); err != nil {
					break
				}
			}
		}
		_ = ch.Close()
	}
	_ = h.conn.Close()
	if t.Failed() {
		lines := strings.Split(strings.TrimSpace(h.logs.String()), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("end of the bridge's log:\n%s", strings.Join(lines, "\n"))
	}
}

// start runs the bridge in a goroutine and waits until it declared its queues.
func (h *harness) start() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.br.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err, ok := h.wait(0); ok {
			h.t.Fatalf("Run returned during start-up: %v", err)
		}
		if h.queueExists(h.timeoutsQueue()) && h.queueExists(h.dispatcherQueue()) && h.queueExists(h.errorQueue) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatal("the bridge did not declare its queues within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wait returns Run's result if it returned within d (d <= 0: already).
func (h *harness) wait(d time.Duration) (error, bool) {
	if h.returned {
		return h.result, true
	}
	if h.done == nil {
		return nil, false
	}
	if d <= 0 {
		select {
		case err := <-h.done:
			h.returned, h.result = true, err
			return err, true
		default:
			return nil, false
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-h.done:
		h.returned, h.result = true, err
		return err, true
	case <-timer.C:
		return nil, false
	}
}

// requireRunning fails the test if Run has returned.
func (h *harness) requireRunning(when string) {
	h.t.Helper()
	if err, ok := h.wait(0); ok {
		h.t.Fatalf("%s: Run returned (%v); want the bridge still running", when, err)
	}
}

// requireCritical waits up to d for Run to return an error wrapping
// ErrCritical whose text mentions want.
func (h *harness) requireCritical(d time.Duration, want string) error {
	h.t.Helper()
	err, ok := h.wait(d)
	if !ok {
		h.t.Fatalf("Run still running %s later; want a critical error (%s)", d, want)
	}
	if !errors.Is(err, ErrCritical) {
		h.t.Fatalf("Run returned %v; want an error wrapping ErrCritical", err)
	}
	if !strings.Contains(err.Error(), want) {
		h.t.Fatalf("Run returned %q; want it to mention %q", err, want)
	}
	return err
}

// requireBreaker is requireCritical for the breaker named ("store",
// "fetch", "dispatch"), whose time to trigger the test set to 1s: Run
// stopped no sooner than that after start.
func (h *harness) requireBreaker(start time.Time, d time.Duration, breaker string) {
	h.t.Helper()
	err := h.requireCritical(d, breaker+" circuit breaker")
	el := time.Since(start)
	h.t.Logf("Run returned after %s: %v", el.Round(time.Millisecond), err)
	if el < time.Second {
		h.t.Errorf("breaker triggered after %s, before its time to trigger (1s)", el)
	}
}

func (h *harness) queueExists(q string) bool {
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	return err == nil
}

// ready returns the number of ready messages on q.
func (h *harness) ready(q string) int {
	h.t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		h.t.Fatalf("inspect queue %s: %v", q, err)
	}
	return st.Messages
}

func (h *harness) declare(q string) {
	h.t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		h.t.Fatalf("declare %s: %v", q, err)
	}
}

// publish sends messages to E.Timeouts and waits for the broker's confirms.
func (h *harness) publish(msgs ...amqp.Publishing) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		c, err := h.pubCh.PublishWithDeferredConfirmWithContext(ctx, "", h.timeoutsQueue(), true, false, m)
		if err != nil {
			h.t.Fatalf("publish: %v", err)
		}
		confs[i] = c
	}
	for i, c := range confs {
		ok, err := c.WaitContext(ctx)
		if err != nil || !ok {
			h.t.Fatalf("publish %d: not confirmed (ack %v, %v)", i, ok, err)
		}
	}
}

// delayed is a message for h.dest, due delay after the bridge receives it.
func (h *harness) delayed(id string, delay time.Duration) amqp.Publishing {
	return amqp.Publishing{
		MessageId:    id,
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{"x-destination": h.dest, "x-delay": int64(delay / time.Millisecond)},
		Body:         []byte("body of " + id),
	}
}

// dueAt is a message for h.dest, due at an absolute time.
func (h *harness) dueAt(id string, at time.Time) amqp.Publishing {
	return amqp.Publishing{
		MessageId:    id,
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{"x-destination": h.dest, "x-due-at": at.UTC().Format(time.RFC3339Nano)},
		Body:         []byte("body of " + id),
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// collector consumes a destination queue and records each arrival.
type collector struct {
	mu  sync.Mutex
	got map[string][]time.Time
	n   int
}

func (h *harness) collect(q string) *collector {
	h.t.Helper()
	ch, err := h.conn.Channel()
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	dels, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		h.t.Fatalf("consume %s: %v", q, err)
	}
	c := &collector{got: map[string][]time.Time{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range dels {
			now := time.Now()
			c.mu.Lock()
			c.got[d.MessageId] = append(c.got[d.MessageId], now)
			c.n++
			c.mu.Unlock()
		}
	}()
	h.t.Cleanup(func() {
		_ = ch.Close()
		<-done
	})
	return c
}

// total is the number of arrivals, duplicates included.
func (c *collector) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *collector) arrivals(id string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.got[id]...)
}

// waitAll waits up to d until every id arrived at least once.
func (c *collector) waitAll(t *testing.T, want []string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var missing []string
		c.mu.Lock()
		for _, id := range want {
			if len(c.got[id]) == 0 {
				missing = append(missing, id)
			}
		}
		c.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages not delivered within %s: %v", len(missing), len(want), d, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exactlyOnce checks that each id arrived once and nothing else arrived.
func (c *collector) exactlyOnce(t *testing.T, want []string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range want {
		if n := len(c.got[id]); n != 1 {
			t.Errorf("message %s delivered %d times, want exactly once", id, n)
		}
	}
	if c.n != len(want) {
		t.Errorf("%d deliveries in all, want %d", c.n, len(want))
	}
}

// deliveredOnce waits up to d until every id arrived, then half a second
// for late duplicates, and checks that each arrived once and nothing else.
func (c *collector) deliveredOnce(t *testing.T, want []string, d time.Duration) {
	t.Helper()
	c.waitAll(t, want, d)
	time.Sleep(500 * time.Millisecond)
	c.exactlyOnce(t, want)
}

// reopen opens the store file after the bridge closed it.
func (h *harness) reopen() *boltstore.Store {
	h.t.Helper()
	s, err := boltstore.Open(h.storePath, boltstore.Options{})
	if err != nil {
		h.t.Fatalf("reopen store: %v", err)
	}
	h.t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestStoreWriteFaultNoAckBeforeCommit: while every Insert fails, ingest
// acknowledges nothing and forwards nothing, backs off instead of spinning,
// and the store breaker (1m) does not trigger; after Heal every message is
// delivered exactly once.
func TestStoreWriteFaultNoAckBeforeCommit(t *testing.T) {
	h := newHarness(t, "insertfault", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER": "1m",
	})
	h.fs.FailInsert(errors.New("disk full"))
	h.start()
	c := h.collect(h.dest)

	want := ids("nofault", 20)
	msgs := make([]amqp.Publishing, len(want))
	for i, id := range want {
		msgs[i] = h.delayed(id, 0)
	}
	h.publish(msgs...)

	faultyFor := 1500 * time.Millisecond
	end := time.Now().Add(faultyFor)
	for time.Now().Before(end) {
		if n := c.total(); n > 0 {
			t.Fatalf("%d messages delivered while every store commit failed", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	inserts := h.fs.Calls(faultstore.Insert)
	t.Logf("Insert called %d times in %s of store failure", inserts, faultyFor)
	if inserts == 0 {
		t.Fatal("ingest never tried to store the messages")
	}
	if inserts >= 100 {
		t.Errorf("Insert called %d times in %s of failure: ingest spins instead of backing off", inserts, faultyFor)
	}
	if _, ok, err := h.inner.NextDue(context.Background()); err != nil || ok {
		t.Fatalf("store has pending rows after failing commits (ok %v, err %v)", ok, err)
	}
	h.requireRunning("during the store fault")

	h.fs.Heal()
	c.deliveredOnce(t, want, 15*time.Second)
	h.requireRunning("after Heal")
	if n := h.ready(h.timeoutsQueue()); n != 0 {
		t.Errorf("%s still has %d ready messages after all were delivered", h.timeoutsQueue(), n)
	}
	if n := h.ready(h.errorQueue); n != 0 {
		t.Errorf("error queue has %d messages; a store failure is not the message's fault", n)
	}
}

// TestStoreBreakerTriggers: Insert failing for longer than the store
// breaker's time to trigger is a critical error, and nothing the bridge was
// handed is lost: the messages are back on E.Timeouts.
func TestStoreBreakerTriggers(t *testing.T) {
	h := newHarness(t, "storebreaker", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_STORE_CIRCUIT_BREAKER": "1s",
	})
	h.fs.FailInsert(errors.New("disk full"))
	start := time.Now()
	h.start()
	want := ids("storebrk", 5)
	for _, id := range want {
		h.publish(h.delayed(id, 0))
	}
	h.requireBreaker(start, 8*time.Second, "store")

	// Nothing acknowledged: every message is back on E.Timeouts.
	deadline := time.Now().Add(5 * time.Second)
	for h.ready(h.timeoutsQueue()) < len(want) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ch, cerr := h.conn.Channel()
	if cerr != nil {
		t.Fatal(cerr)
	}
	defer ch.Close()
	seen := map[string]bool{}
	for {
		d, ok, gerr := ch.Get(h.timeoutsQueue(), false)
		if gerr != nil {
			t.Fatalf("basic.get: %v", gerr)
		}
		if !ok {
			break
		}
		seen[d.MessageId] = true
		if d.Headers["x-destination"] != h.dest {
			t.Errorf("message %s came back with x-destination %v", d.MessageId, d.Headers["x-destination"])
		}
	}
	for _, id := range want {
		if !seen[id] {
			t.Errorf("message %s is not on %s after the critical stop: lost", id, h.timeoutsQueue())
		}
	}
}

// TestFetchBreakerTriggers: leasing and reading the next due time failing
// for longer than the fetch breaker's time to trigger is a critical error.
func TestFetchBreakerTriggers(t *testing.T) {
	h := newHarness(t, "fetchbreaker", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "1s",
	})
	h.fs.FailLease(errors.New("i/o error"))
	h.fs.FailNextDue(errors.New("i/o error"))
	start := time.Now()
	h.start()
	h.requireBreaker(start, 8*time.Second, "fetch")
}

// TestFetchBreakerTriggersOnLeaseFailures: leasing due timeouts is fetching
// them, so Lease failing alone (NextDue healthy) for longer than the fetch
// breaker's time to trigger is a critical error too (docs/contract.md §5).
func TestFetchBreakerTriggersOnLeaseFailures(t *testing.T) {
	h := newHarness(t, "leasebreaker", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "1s",
	})
	h.fs.FailLease(errors.New("i/o error"))
	start := time.Now()
	h.start()
	h.publish(h.delayed("leasebrk-1", 0)) // something due: the poller must lease
	h.requireBreaker(start, 8*time.Second, "fetch")
	if n := h.fs.Calls(faultstore.Lease); n >= 160 {
		t.Errorf("Lease called %d times before the breaker triggered: the poller spins instead of backing off", n)
	}
}

// TestFetchFaultRecovers: a Lease fault shorter than the time to trigger
// delays a due message but neither loses nor duplicates it.
func TestFetchFaultRecovers(t *testing.T) {
	h := newHarness(t, "fetchrecover", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "1m",
	})
	h.fs.FailLease(errors.New("i/o error"))
	h.start()
	c := h.collect(h.dest)
	h.publish(h.delayed("fetchrec-1", 0))
	time.Sleep(time.Second)
	if n := c.total(); n > 0 {
		t.Fatalf("%d deliveries while every Lease failed", n)
	}
	if _, err := h.inner.Get(context.Background(), "fetchrec-1"); err != nil {
		t.Fatalf("the message is not pending in the store during the fault: %v", err)
	}
	h.requireRunning("during the lease fault")
	leases := h.fs.Calls(faultstore.Lease)
	t.Logf("Lease called %d times in 1 s of failure", leases)
	if leases >= 100 {
		t.Errorf("Lease called %d times in 1 s of failure: the poller spins instead of backing off", leases)
	}

	h.fs.Heal()
	c.deliveredOnce(t, []string{"fetchrec-1"}, 10*time.Second)
	h.requireRunning("after Heal")
}

// TestDispatchStoreFaultRecovers: the forward is confirmed but removing it
// from the store fails. A duplicate is allowed later, a loss never; after
// Heal the message is removed and stays delivered.
func TestDispatchStoreFaultRecovers(t *testing.T) {
	h := newHarness(t, "removefault", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "1m",
		"DELAYBRIDGE_LOCK_LEASE_DURATION":                      "1s", // re-lease soon
	})
	h.fs.FailRemove(errors.New("disk full"))
	h.start()
	c := h.collect(h.dest)
	const id = "removefault-1"
	h.publish(h.delayed(id, 0))

	c.waitAll(t, []string{id}, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for h.fs.Calls(faultstore.Remove) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if h.fs.Calls(faultstore.Remove) == 0 {
		t.Fatal("the dispatcher never tried to remove the forwarded message")
	}
	if _, err := h.inner.Get(context.Background(), id); err != nil {
		t.Fatalf("after the failed removal the message is no longer pending (%v): a later loss could go unnoticed", err)
	}
	time.Sleep(500 * time.Millisecond)
	h.requireRunning("during the remove fault")

	h.fs.Heal()
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, err := h.fs.Get(context.Background(), id)
		if errors.Is(err, storage.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the message is still pending 10 s after Heal")
		}
		time.Sleep(50 * time.Millisecond)
	}
	settled := c.total()
	time.Sleep(1500 * time.Millisecond) // longer than a lease: no more forwards
	if n := c.total(); n != settled {
		t.Errorf("%d more deliveries after the message was removed", n-settled)
	}
	if n := len(c.arrivals(id)); n < 1 {
		t.Errorf("message delivered %d times, want at least once", n)
	} else {
		t.Logf("delivered %d times (duplicates allowed: removal failed after confirmed forwards)", n)
	}
	h.requireRunning("after Heal")
	if n := h.ready(h.errorQueue); n != 0 {
		t.Errorf("error queue has %d messages; a failed removal is not a dispatch failure", n)
	}
}

// TestDispatchBreakerTriggers: store reads failing during dispatch for
// longer than the dispatch breaker's time to trigger is a critical error, and
// the message is still pending in the store afterwards.
func TestDispatchBreakerTriggers(t *testing.T) {
	h := newHarness(t, "dispatchbreaker", map[string]string{
		"DELAYBRIDGE_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "1s",
		"DELAYBRIDGE_LOCK_LEASE_DURATION":                      "1s",
	})
	h.fs.FailGet(errors.New("i/o error"))
	start := time.Now()
	h.start()
	c := h.collect(h.dest)
	want := ids("dispbrk", 3)
	for _, id := range want {
		h.publish(h.delayed(id, 0))
	}
	h.requireBreaker(start, 10*time.Second, "dispatch")
	if n := c.total(); n != 0 {
		t.Errorf("%d deliveries although no row could be read", n)
	}
	s := h.reopen()
	for _, id := range want {
		if _, err := s.Get(context.Background(), id); err != nil {
			t.Errorf("message %s not pending in the store after the critical stop: %v", id, err)
		}
	}
}

// TestSlowCommits: with every commit taking 200 ms, 50 messages are each
// delivered exactly once and none early.
func TestSlowCommits(t *testing.T) {
	h := newHarness(t, "slowcommits", nil)
	h.fs.Delay(faultstore.Insert, 200*time.Millisecond)
	h.start()
	c := h.collect(h.dest)

	want := ids("slow", 50)
	due := map[string]time.Time{}
	base := time.Now()
	for i, id := range want {
		// Due from 0.3 s to ~2.3 s from now, some before their commit ends.
		at := base.Add(300*time.Millisecond + time.Duration(i)*40*time.Millisecond).Truncate(time.Millisecond)
		due[id] = at
		h.publish(h.dueAt(id, at))
	}
	c.deliveredOnce(t, want, 20*time.Second)
	for _, id := range want {
		for _, got := range c.arrivals(id) {
			if got.Before(due[id]) {
				t.Errorf("message %s delivered %s early", id, due[id].Sub(got))
			}
		}
	}
	if n := h.fs.Calls(faultstore.Insert); n >= 50 {
		t.Logf("note: %d commits for 50 messages (no group commit while commits are slow)", n)
	}
	h.requireRunning("after the slow commits")
}

// TestShutdownIsClean: cancelling Run's context stops the bridge cleanly
// within 5 s, leaves no goroutine behind and keeps what it stored.
func TestShutdownIsClean(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs after the harness's cleanup closed the
	// test's own broker connection.
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

	h := newHarness(t, "shutdown", nil)
	h.start()
	want := ids("later", 3)
	for _, id := range want {
		h.publish(h.delayed(id, time.Hour))
	}
	// Wait until they are stored (acked off E.Timeouts).
	deadline := time.Now().Add(5 * time.Second)
	for {
		stored := 0
		for _, id := range want {
			if _, err := h.inner.Get(context.Background(), id); err == nil {
				stored++
			}
		}
		if stored == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d messages stored within 5 s", stored, len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}

	h.cancel()
	start := time.Now()
	err, ok := h.wait(5 * time.Second)
	if !ok {
		t.Fatal("Run did not return within 5 s of cancelling its context")
	}
	if err != nil {
		t.Fatalf("Run returned %v after a clean shutdown; want nil", err)
	}
	t.Logf("Run returned nil %s after cancel", time.Since(start).Round(time.Millisecond))

	if _, err := h.inner.Get(context.Background(), want[0]); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("the bridge did not close its store on shutdown (Get: %v)", err)
	}
	s := h.reopen()
	for _, id := range want {
		if _, err := s.Get(context.Background(), id); err != nil {
			t.Errorf("message %s not pending after the shutdown: %v", id, err)
		}
	}
	if n := h.ready(h.timeoutsQueue()); n != 0 {
		t.Errorf("%s has %d ready messages; all were stored and acknowledged", h.timeoutsQueue(), n)
	}
}

// newHTTPHarness is newHarness with the bridge's HTTP server on a free
// local port, whose address it returns too.
func newHTTPHarness(t *testing.T, name string) (*harness, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return newHarness(t, name, map[string]string{"DELAYBRIDGE_HTTP_ADDR": addr}), addr
}

// openStoreWith makes Run open the store with open instead of taking h's;
// the channel closes when Run calls it.
func (h *harness) openStoreWith(open func(ctx context.Context) (storage.Store, error)) <-chan struct{} {
	opened := make(chan struct{})
	h.br.deps.Store = nil
	h.br.deps.OpenStore = func(ctx context.Context) (storage.Store, error) {
		close(opened)
		return open(ctx)
	}
	return opened
}

// TestReadyzReflectsTheStore: /readyz is 503 while the store does not
// answer, and 200 again once it does (docs/contract.md §6: connected to the broker
// and the store).
func TestReadyzReflectsTheStore(t *testing.T) {
	h, addr := newHTTPHarness(t, "readyz")
	h.start()
	status := func() int {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitCode := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("/readyz never answered %d (last %d)", want, status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCode(http.StatusOK)
	h.fs.FailNextDue(errors.New("disk gone"))
	waitCode(http.StatusServiceUnavailable)
	h.fs.Heal()
	waitCode(http.StatusOK)
}

// The probes answer while the store opens, which can take minutes (a bbolt
// file of an earlier format is converted first): /healthz 200 and /readyz
// 503 naming the phase, so that a liveness probe does not restart the
// conversion; the other routes come once the bridge is built.
func TestProbesAnswerWhileTheStoreOpens(t *testing.T) {
	h, addr := newHTTPHarness(t, "opening")
	release := make(chan struct{})
	opened := h.openStoreWith(func(ctx context.Context) (storage.Store, error) {
		select {
		case <-release:
			return h.fs, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	// Not h.start: that waits for the queues, declared after the store opens.
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.br.Run(ctx) }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	waitFor := func(path string, want int) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body := get(path)
			if code == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s never answered %d (last %d %q)", path, want, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	<-opened
	waitFor("/healthz", http.StatusOK)
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "not ready: starting: opening the store" {
		t.Fatalf("/readyz while the store opens: %d %q; want 503 naming the phase", code, body)
	}
	if code, _ := get("/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics while the store opens: %d; want 404 until the bridge is built", code)
	}
	if code, body := get("/debug/vars"); code != http.StatusOK || !strings.Contains(body, `"memstats"`) || strings.Contains(body, `"delaybridge"`) {
		t.Fatalf("/debug/vars while the store opens: %d %.200q; want 200 with memstats only", code, body)
	}
	close(release)
	waitFor("/readyz", http.StatusOK)
	waitFor("/metrics", http.StatusOK)
	got := h.collect(h.dest)
	h.publish(h.delayed("after-open", 0))
	got.waitAll(t, []string{"after-open"}, 10*time.Second)
}

// A stop requested while the store opens is a clean stop: Run returns nil
// (exit 0) and the HTTP port closes.
func TestStopWhileTheStoreOpens(t *testing.T) {
	h, addr := newHTTPHarness(t, "stopopen")
	opened := h.openStoreWith(func(ctx context.Context) (storage.Store, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("open: %w", ctx.Err())
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.br.Run(ctx) }()
	<-opened
	cancel()
	testenv.WaitNil(t, done, 10*time.Second, "Run to return nil (a clean stop) after a stop while the store opened")
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("/healthz still answers %d after Run returned", resp.StatusCode)
	}
}
