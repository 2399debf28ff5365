// Package integration runs the real delaybridge binary against a real
// RabbitMQ broker and checks the external contract (docs/contract.md
// §1–§5) from the outside: what goes into E.Timeouts, what comes out on the
// destination and error queues, and how the process behaves on signals,
// crashes and bad configuration.
//
// The broker is taken from DELAYBRIDGE_TEST_AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/). Without a reachable broker the tests
// are skipped, except under CI=true where that is a failure (the rule of
// internal/testenv). The tests that disturb the broker for everyone else
// (testenv.Disruptive) run only in scripts/test.sh's serial step.
package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/confirmed"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

var (
	// amqpURL is the broker every test and every bridge uses.
	amqpURL string
	// bridgeBin is the race-enabled bridge binary built once by TestMain.
	bridgeBin string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	amqpURL = testenv.AMQPURLFromEnv()
	if err := testenv.AMQPReachable(); err != nil {
		// No bridge to build: every test's requireBroker skips it, or
		// fails it under CI=true.
		fmt.Fprintf(os.Stderr, "integration: RabbitMQ is not reachable at %s (%v)\n", broker.Redact(amqpURL), err)
		return m.Run()
	}

	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: cannot find the repository root:", err)
		return 1
	}
	// scripts/test.sh names one path for all of its go test runs: go build
	// leaves an up-to-date binary there alone, so a later run links nothing.
	if bridgeBin = os.Getenv("DELAYBRIDGE_TEST_BRIDGE_BIN"); bridgeBin != "" {
		if bridgeBin, err = filepath.Abs(bridgeBin); err != nil {
			fmt.Fprintln(os.Stderr, "integration: DELAYBRIDGE_TEST_BRIDGE_BIN:", err)
			return 1
		}
	} else {
		tmp, err := os.MkdirTemp("", "delaybridge-it-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		bridgeBin = filepath.Join(tmp, "delaybridge")
	}
	// DELAYBRIDGE_TEST_BRIDGE_PREBUILT=true runs the binary at
	// DELAYBRIDGE_TEST_BRIDGE_BIN as it is, e.g. an earlier commit's build
	// to show that a test fails on it; without it, go build would replace it.
	if os.Getenv("DELAYBRIDGE_TEST_BRIDGE_PREBUILT") == "true" {
		if _, err := os.Stat(bridgeBin); err != nil {
			fmt.Fprintf(os.Stderr, "integration: DELAYBRIDGE_TEST_BRIDGE_PREBUILT needs a binary at DELAYBRIDGE_TEST_BRIDGE_BIN (%q): %v\n", bridgeBin, err)
			return 1
		}
		return m.Run()
	}
	build := exec.Command("go", "build", "-race", "-o", bridgeBin, ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: go build -race of the bridge failed: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// repoRoot is the directory of the module's go.mod.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if mod := strings.TrimSpace(string(out)); mod != "" && mod != os.DevNull {
			return filepath.Dir(mod), nil
		}
	}
	wd, werr := os.Getwd()
	if werr != nil {
		return "", werr
	}
	root := filepath.Join(wd, "..", "..")
	if _, serr := os.Stat(filepath.Join(root, "go.mod")); serr != nil {
		return "", fmt.Errorf("go env GOMOD: %v; ../../go.mod: %v", err, serr)
	}
	return root, nil
}

// requireBroker skips the test when TestMain found no broker, or fails it
// under CI=true (testenv.AMQPURL).
func requireBroker(t testing.TB) {
	t.Helper()
	testenv.AMQPURL(t)
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

var unsafeName = regexp.MustCompile(`[^a-z0-9-]+`)

// uniqueEndpoint is it-<testname-sanitized>-<random>.
func uniqueEndpoint(t testing.TB) string {
	name := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(name) > 60 {
		name = name[:60]
	}
	return "it-" + name + "-" + randomHex(4)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ---------------------------------------------------------------------------
// The bridge process

// syncBuffer collects a process's output; safe for concurrent use. While
// held, it takes nothing: the process's writes to the pipe block once the
// pipe is full.
type syncBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	gate sync.RWMutex // write-held while held
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.gate.RLock()
	defer b.gate.RUnlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) hold()    { b.gate.Lock() }
func (b *syncBuffer) release() { b.gate.Unlock() }

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// bridgeProc is one running (or exited) bridge process.
type bridgeProc struct {
	t        testing.TB
	Env      map[string]string // the DELAYBRIDGE_* variables it was started with
	Endpoint string
	ErrorQ   string
	HTTPAddr string
	cmd      *exec.Cmd
	stderr   *syncBuffer
	stdout   *syncBuffer
	done     chan struct{}
	exitCode int
}

// TimeoutsQueue is E.Timeouts.
func (b *bridgeProc) TimeoutsQueue() string { return b.Endpoint + ".Timeouts" }

// DispatcherQueue is E.TimeoutsDispatcher.
func (b *bridgeProc) DispatcherQueue() string { return b.Endpoint + ".TimeoutsDispatcher" }

// Stderr is everything the process wrote to stderr so far.
func (b *bridgeProc) Stderr() string { return b.stderr.String() }

// bridgeEnv fills in the per-test defaults: a unique endpoint and error queue,
// a store file in t.TempDir(), a free HTTP port and JSON logs. Values already
// in env win, so a restart can pass the same endpoint and store path.
func bridgeEnv(t testing.TB, env map[string]string) map[string]string {
	full := map[string]string{}
	for k, v := range env {
		full[k] = v
	}
	setDefault := func(k, v string) {
		if _, ok := full[k]; !ok {
			full[k] = v
		}
	}
	setDefault("DELAYBRIDGE_ENDPOINT", uniqueEndpoint(t))
	setDefault("DELAYBRIDGE_ERROR_QUEUE", full["DELAYBRIDGE_ENDPOINT"]+".error")
	setDefault("DELAYBRIDGE_AMQP_URL", amqpURL)
	setDefault("DELAYBRIDGE_STORE_PATH", filepath.Join(t.TempDir(), "store.db"))
	setDefault("DELAYBRIDGE_HTTP_ADDR", freeAddr(t))
	setDefault("DELAYBRIDGE_LOG_FORMAT", "json")
	return full
}

// bridgeCommand is the built binary with args, the test's environment
// without its DELAYBRIDGE_* variables, and exactly those of env.
func bridgeCommand(t testing.TB, env map[string]string, args ...string) *exec.Cmd {
	t.Helper()
	if bridgeBin == "" {
		requireBroker(t) // TestMain builds the binary only when the broker is up
		t.Fatal("the bridge binary was not built (TestMain)")
	}
	cmd := exec.Command(bridgeBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYBRIDGE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// execBridge starts the binary with args and exactly the given DELAYBRIDGE_*
// variables (none inherited from the test's environment), except that
// DELAYBRIDGE_ADMIN_TOKEN_FILE is empty unless given: a test's bridge makes
// no token file in the working directory, and its admin API is on only with
// a token the test sets.
func execBridge(t testing.TB, env map[string]string, args ...string) *bridgeProc {
	t.Helper()
	cmd := bridgeCommand(t, env, args...)
	if _, ok := env["DELAYBRIDGE_ADMIN_TOKEN_FILE"]; !ok {
		cmd.Env = append(cmd.Env, "DELAYBRIDGE_ADMIN_TOKEN_FILE=")
	}
	b := &bridgeProc{
		t: t, Env: env, Endpoint: env["DELAYBRIDGE_ENDPOINT"], ErrorQ: env["DELAYBRIDGE_ERROR_QUEUE"],
		HTTPAddr: env["DELAYBRIDGE_HTTP_ADDR"], cmd: cmd,
		stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{}), exitCode: -1,
	}
	cmd.Stderr = b.stderr
	cmd.Stdout = b.stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bridgeBin, err)
	}
	go func() {
		_ = cmd.Wait()
		b.exitCode = cmd.ProcessState.ExitCode()
		close(b.done)
	}()
	t.Cleanup(func() {
		if b.Running() {
			_ = b.cmd.Process.Kill()
			<-b.done
		}
		logs := b.Stderr()
		if strings.Contains(logs, "DATA RACE") {
			t.Errorf("the race detector reported a DATA RACE in the bridge (%s %s)", filepath.Base(bridgeBin), strings.Join(args, " "))
		}
		if t.Failed() {
			t.Logf("bridge %q %v exit code %d; stderr (last 24 KiB):\n%s", b.Endpoint, args, b.exitCode, tail(logs, 24<<10))
			if out := b.stdout.String(); out != "" {
				t.Logf("bridge stdout:\n%s", tail(out, 4<<10))
			}
		}
	})
	return b
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// startBridge starts a bridge (see bridgeEnv for the defaults) and waits until
// GET /readyz answers 200. The test's cleanup kills a bridge still running,
// fails the test on a DATA RACE report, and deletes the bridge's queues.
func startBridge(t testing.TB, env map[string]string) *bridgeProc {
	t.Helper()
	requireBroker(t)
	full := bridgeEnv(t, env)
	// Registered before the process's own cleanup, so it runs after the
	// process is gone.
	deleteQueuesOnCleanup(t, full["DELAYBRIDGE_ENDPOINT"]+".Timeouts",
		full["DELAYBRIDGE_ENDPOINT"]+".TimeoutsDispatcher", full["DELAYBRIDGE_ERROR_QUEUE"])
	// The fanout exchanges of NServiceBus's conventional topology.
	deleteExchangesOnCleanup(t, full["DELAYBRIDGE_ENDPOINT"]+".Timeouts")
	if q := full["DELAYBRIDGE_REBUS_QUEUE"]; q != "" {
		deleteExchangesOnCleanup(t, q)
	}
	b := execBridge(t, full)
	b.waitReady(20 * time.Second)
	return b
}

// Restart starts a new bridge with the same variables (endpoint, error
// queue, store file) on a new HTTP port. The previous process must be gone.
func (b *bridgeProc) Restart(extra map[string]string) *bridgeProc {
	b.t.Helper()
	if b.Running() {
		b.t.Fatal("Restart: the previous bridge is still running")
	}
	env := map[string]string{}
	for k, v := range b.Env {
		env[k] = v
	}
	delete(env, "DELAYBRIDGE_HTTP_ADDR")
	for k, v := range extra {
		env[k] = v
	}
	return startBridge(b.t, env)
}

func (b *bridgeProc) waitReady(timeout time.Duration) {
	b.t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get("http://" + b.HTTPAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if !b.Running() {
			b.t.Fatalf("bridge exited with code %d before /readyz answered 200", b.exitCode)
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("bridge not ready within %s (last /readyz: %v)", timeout, describe(resp, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describe(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// Running reports whether the process has not exited yet.
func (b *bridgeProc) Running() bool {
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 when killed by a signal). It fails the test on timeout.
func (b *bridgeProc) Wait(timeout time.Duration) int {
	b.t.Helper()
	select {
	case <-b.done:
		return b.exitCode
	case <-time.After(timeout):
		_ = b.cmd.Process.Kill()
		<-b.done
		b.t.Fatalf("bridge did not exit within %s; killed it", timeout)
		return b.exitCode
	}
}

// Stop sends SIGTERM and asserts a graceful exit with code 0 within 15 s.
func (b *bridgeProc) Stop() {
	b.t.Helper()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.t.Fatalf("SIGTERM: %v", err)
	}
	if code := b.Wait(15 * time.Second); code != 0 {
		b.t.Fatalf("after SIGTERM the bridge exited with code %d, want 0", code)
	}
}

// KillWhileLogging stops taking the process's stderr for d, so that the
// process blocks in its next log line once the pipe is full, and then
// kills it: with debug logs, ingest is caught between a commit and its
// acknowledgement, where it logs what it stored.
func (b *bridgeProc) KillWhileLogging(d time.Duration) {
	b.t.Helper()
	b.stderr.hold()
	time.Sleep(d)
	err := b.cmd.Process.Kill()
	b.stderr.release()
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.t.Fatalf("SIGKILL: %v", err)
	}
	b.Wait(10 * time.Second)
}

// Kill sends SIGKILL and waits for the process to be gone.
func (b *bridgeProc) Kill() {
	b.t.Helper()
	if err := b.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.t.Fatalf("SIGKILL: %v", err)
	}
	b.Wait(10 * time.Second)
}

// ---------------------------------------------------------------------------
// AMQP helpers

// dial opens a connection closed at cleanup.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	requireBroker(t)
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		t.Fatalf("connect to %s: %v", broker.Redact(amqpURL), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// deleteQueuesOnCleanup deletes the queues when the test ends, on a
// connection of its own (the test's may be closed by then).
func deleteQueuesOnCleanup(t testing.TB, names ...string) {
	deleteOnCleanup(t, "queue", names, func(ch *amqp.Channel, q string) error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	})
}

// deleteExchangesOnCleanup deletes the exchanges when the test ends, as
// deleteQueuesOnCleanup does the queues.
func deleteExchangesOnCleanup(t testing.TB, names ...string) {
	deleteOnCleanup(t, "exchange", names, func(ch *amqp.Channel, x string) error {
		return ch.ExchangeDelete(x, false, false)
	})
}

// deleteOnCleanup calls del for each name when the test ends, each on a
// channel of its own (a failed delete closes its channel).
func deleteOnCleanup(t testing.TB, kind string, names []string, del func(*amqp.Channel, string) error) {
	t.Cleanup(func() {
		conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
		if err != nil {
			t.Logf("cleanup: cannot connect to delete %ss %v: %v", kind, names, err)
			return
		}
		defer conn.Close()
		for _, name := range names {
			ch, err := conn.Channel()
			if err != nil {
				t.Logf("cleanup: open channel: %v", err)
				return
			}
			if err := del(ch, name); err != nil {
				t.Logf("cleanup: delete %s %q: %v", kind, name, err)
			}
			_ = ch.Close()
		}
	})
}

// declareQueue declares a durable destination queue, deleted at cleanup.
func declareQueue(t testing.TB, conn *amqp.Connection, name string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatalf("declare queue %q: %v", name, err)
	}
	deleteQueuesOnCleanup(t, name)
}

// queueDepth returns the number of ready messages in an existing queue.
func queueDepth(t testing.TB, conn *amqp.Connection, name string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %q: %v", name, err)
	}
	return q.Messages
}

// waitQueueEmpty waits until queue has no ready messages.
func waitQueueEmpty(t testing.TB, conn *amqp.Connection, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n := queueDepth(t, conn, name)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %q still has %d ready messages after %s", name, n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publisher publishes with confirms and mandatory, so a message that is not
// routed or not confirmed fails the test.
type publisher struct {
	t   testing.TB
	pub *confirmed.Publisher
}

func newPublisher(t testing.TB, conn *amqp.Connection) *publisher {
	t.Helper()
	p := confirmedPublisher(t, conn)
	p.Timeout = 60 * time.Second
	return &publisher{t: t, pub: p}
}

// confirmedPublisher is a confirmed.Publisher on conn, closed when the
// test ends. It returns errors, so that goroutines other than the test's
// can publish with it.
func confirmedPublisher(t testing.TB, conn *amqp.Connection) *confirmed.Publisher {
	t.Helper()
	p, err := confirmed.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Publish sends one message to queue through the default exchange and waits
// for the broker's confirm.
func (p *publisher) Publish(queue string, msg amqp.Publishing) {
	p.t.Helper()
	p.PublishAll(queue, []amqp.Publishing{msg})
}

// PublishAll sends msgs to queue and waits for every confirm.
func (p *publisher) PublishAll(queue string, msgs []amqp.Publishing) {
	p.t.Helper()
	p.PublishTo("", queue, msgs...)
}

// PublishTo sends msgs to exchange with routing key key and waits for every
// confirm.
func (p *publisher) PublishTo(exchange, key string, msgs ...amqp.Publishing) {
	p.t.Helper()
	if err := p.pub.Publish(exchange, key, msgs...); err != nil {
		p.t.Fatal(err)
	}
}

// arrival is one delivery and the local time it was received.
type arrival struct {
	amqp.Delivery
	At time.Time
}

// consumer records every delivery on a queue with its arrival time.
type consumer struct {
	t      testing.TB
	queue  string
	mu     sync.Mutex
	got    []arrival
	signal chan struct{}
}

// consume starts an auto-ack consumer on queue (which must exist).
func consume(t testing.TB, conn *amqp.Connection, queue string) *consumer {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %q: %v", queue, err)
	}
	c := &consumer{t: t, queue: queue, signal: make(chan struct{}, 1)}
	go func() {
		for d := range deliveries {
			now := time.Now()
			c.mu.Lock()
			c.got = append(c.got, arrival{Delivery: d, At: now})
			c.mu.Unlock()
			select {
			case c.signal <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { _ = ch.Close() })
	return c
}

// delayOne sends one message (message-id and body id) through b to
// <endpoint>.dst, due after from now, waits up to wait for its first
// delivery and fails the test if that came early (otherwise it logs how
// late). It returns the consumer of the destination and that delivery.
func delayOne(t *testing.T, b *bridgeProc, id string, after, wait time.Duration) (*consumer, arrival) {
	t.Helper()
	conn := dial(t)
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	due := time.Now().Add(after).UTC().Truncate(time.Millisecond)
	newPublisher(t, conn).Publish(b.TimeoutsQueue(), delayedMessage(id, dest, due))
	got := c.WaitFor(1, wait)[0]
	if got.At.Before(due) {
		t.Errorf("delivered EARLY by %s (arrived %s, due %s)", due.Sub(got.At),
			got.At.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
	}
	t.Logf("%s delivered %s after its due time", id, got.At.Sub(due).Round(time.Millisecond))
	return c, got
}

// startWithPublisher starts a bridge with env (see bridgeEnv) and, on a
// connection of the test's own, a publisher.
func startWithPublisher(t *testing.T, env map[string]string) (b *bridgeProc, conn *amqp.Connection, pub *publisher) {
	t.Helper()
	b = startBridge(t, env)
	conn = dial(t)
	return b, conn, newPublisher(t, conn)
}

// startWithDest is startWithPublisher with the default settings, and a
// consumer of the destination queue <endpoint>.dst.
func startWithDest(t *testing.T) (b *bridgeProc, conn *amqp.Connection, pub *publisher, dest string, c *consumer) {
	t.Helper()
	b, conn, pub = startWithPublisher(t, nil)
	dest = b.Endpoint + ".dst"
	return b, conn, pub, dest, declareAndConsume(t, conn, dest)
}

// declareAndConsume declares a destination queue and consumes it.
func declareAndConsume(t testing.TB, conn *amqp.Connection, queue string) *consumer {
	t.Helper()
	declareQueue(t, conn, queue)
	return consume(t, conn, queue)
}

// All returns a copy of the deliveries so far.
func (c *consumer) All() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arrival(nil), c.got...)
}

// Count is the number of deliveries so far.
func (c *consumer) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// WaitFor waits until at least n deliveries arrived and returns them all;
// it fails the test after timeout.
func (c *consumer) WaitFor(n int, timeout time.Duration) []arrival {
	c.t.Helper()
	return c.WaitUntil(timeout, fmt.Sprintf("%d deliveries", n), func(got []arrival) bool { return len(got) >= n })
}

// WaitUntil waits until done(deliveries so far) holds; it fails the test
// after timeout, naming what.
func (c *consumer) WaitUntil(timeout time.Duration, what string, done func([]arrival) bool) []arrival {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		got := c.All()
		if done(got) {
			return got
		}
		select {
		case <-c.signal:
		case <-time.After(100 * time.Millisecond):
		case <-deadline.C:
			got = c.All()
			if done(got) {
				return got
			}
			c.t.Fatalf("queue %q: waited %s for %s, have %d deliveries", c.queue, timeout, what, len(got))
			return nil
		}
	}
}

// byMessageID groups deliveries by message-id, in arrival order.
func byMessageID(got []arrival) map[string][]arrival {
	by := map[string][]arrival{}
	for _, a := range got {
		by[a.MessageId] = append(by[a.MessageId], a)
	}
	return by
}

// Quiet waits d and returns every delivery so far: used after the expected
// deliveries arrived, to see duplicates that come late.
func (c *consumer) Quiet(d time.Duration) []arrival {
	time.Sleep(d)
	return c.All()
}

// headerString returns header name as a string ("" when absent or not a string).
func headerString(h amqp.Table, name string) string {
	switch v := h[name].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// dueTimeHeaders are removed from every forwarded message (docs/contract.md §3).
var dueTimeHeaders = []string{"x-due-at", "NServiceBus.Timeout.Expire", "x-delay"}

// nsbExpire formats t in the NServiceBus wire format (microsecond precision,
// UTC) and returns the string and the instant it denotes.
func nsbExpire(t time.Time) (string, time.Time) {
	t = t.UTC().Truncate(time.Microsecond)
	return fmt.Sprintf("%s:%06d Z", t.Format("2006-01-02 15:04:05"), t.Nanosecond()/1000), t
}
