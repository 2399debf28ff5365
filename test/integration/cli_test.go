package integration

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// Every subcommand answers help asked for on stdout with exit 0, and usage
// errors on stderr with exit 2 (docs/contract.md §5.3).
func TestCLIHelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	cmds := []string{"run", "schedule", "declare-queue", "version", "bench", "ls", "show", "cancel",
		"reschedule", "dispatch", "stats", "replay-errors", "help"}
	var forms [][]string
	for _, h := range []string{"--help", "-h", "-help"} {
		forms = append(forms, []string{h})
	}
	forms = append(forms, []string{"help"})
	for _, c := range cmds {
		forms = append(forms, []string{c, "--help"}, []string{c, "-h"}, []string{"help", c})
	}
	// No broker, no bridge: help must not need them.
	env := map[string]string{"DELAYBRIDGE_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/", "DELAYBRIDGE_ADMIN_URL": "http://127.0.0.1:1"}
	for _, args := range forms {
		code, out, errOut := runBin(t, env, args...)
		if code != 0 || !strings.Contains(out, "usage") && !strings.Contains(out, "delaybridge-bench") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 0 and help on stdout", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{
		{"no-such-command"}, {"run", "extra"}, {"version", "extra"}, {"version", "--bogus"},
		{"ls", "--bogus"}, {"show"}, {"bench"}, {"declare-queue"}, {"declare-queue", "--bogus", "q"},
		{"schedule", "--in", "1s", "x"},                                              // no --to
		{"schedule", "--to", "q", "x"},                                               // no due time
		{"schedule", "--to", "q", "--in", "1s", "--at", "2026-01-01T00:00:00Z", "x"}, // both
		{"schedule", "--to", "q", "--in", "-1s", "x"},                                // negative
		{"schedule", "--to", "q", "--in", "1s"},                                      // no body
		{"schedule", "--to", "q", "--in", "1s", "--empty", "x"},                      // body and --empty
		{"schedule", "--to", "q", "--at", "tomorrow", "x"},
	} {
		code, out, errOut := runBin(t, env, args...)
		if code != 2 || out != "" || errOut == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and the error on stderr", args, code, out, errOut)
		}
	}
	_, _, errOut := runBin(t, env, "schedule", "--to", "q", "--in", "-5m", "x")
	if !strings.Contains(errOut, "--in -5m0s is negative") {
		t.Errorf("negative --in: %q", errOut)
	}
	_, _, errOut = runBin(t, env, "schedule", "--to", "q", "--in", "1s")
	if !strings.Contains(errOut, "--empty") {
		t.Errorf("missing body: %q", errOut)
	}
}

// headRevision is the commit the repository's HEAD names.
func headRevision(t *testing.T) (root, rev string) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		// A source tarball: nothing to compare with (a failure under CI=true,
		// which runs on a clone).
		testenv.Unavailable(t, "no git repository at %s: %v", root, err)
	}
	return root, strings.TrimSpace(string(out))
}

// `version` and /metrics carry the revision of HEAD in every kind of build:
// the go build of TestMain (stamped by go, or in a git worktree read from
// the tree), `go run .`, and a build with the container image's link flags.
func TestVersion(t *testing.T) {
	t.Parallel()
	root, rev := headRevision(t)
	want := "revision " + rev
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runBin(t, nil, args...)
		if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "go "+runtime.Version()) ||
			!regexp.MustCompile(`(?m)^delaybridge v\S+$`).MatchString(out) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q, a version and the Go version", args, code, out, errOut, want)
		}
	}

	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command(goTool, "run", ".", "version")
	run.Dir = root
	if out, err := run.CombinedOutput(); err != nil || !strings.Contains(string(out), want) {
		t.Errorf("go run . version: %v, output %q; want %q", err, out, want)
	}

	// The Dockerfile's way: -trimpath, no VCS stamp, link flags.
	bin := filepath.Join(t.TempDir(), "delaybridge")
	const pkg = "github.com/delaybridge/delaybridge/internal/buildinfo"
	build := exec.Command(goTool, "build", "-trimpath", "-buildvcs=false", "-o", bin,
		"-ldflags", "-X '"+pkg+".version=v9.8.7-test' -X '"+pkg+".revision="+rev+"'", ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with link flags: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "delaybridge v9.8.7-test\n") || !strings.Contains(string(out), want+"\n") {
		t.Errorf("version of a link-flag build: %v %q", err, out)
	}

	b := startBridge(t, nil)
	found := ""
	for k, v := range scrape(t, b) {
		if strings.HasPrefix(k, "delaybridge_build_info{") && v == 1 {
			found = k
		}
	}
	if !strings.Contains(found, `revision="`+rev+`"`) || !strings.Contains(found, `goversion="`+runtime.Version()+`"`) ||
		!strings.Contains(found, `version="v`) {
		t.Errorf("/metrics: build_info %q, want revision %s, goversion %s and a version", found, rev, runtime.Version())
	}
}

// schedule sends an absolute x-due-at (never x-delay, which would count from
// when the bridge takes the message in), prints the message id, and sends an
// empty body only with --empty. No bridge runs: the test reads E.Timeouts.
func TestScheduleSendsAbsoluteDueAt(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	ep := uniqueEndpoint(t)
	timeouts := ep + ".Timeouts"
	declareQueue(t, conn, timeouts)
	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": ep}

	// "orders" does not exist: refused at once, nothing published.
	code, out, errOut := runBin(t, env, "schedule", "--to", "orders", "--in", "1h", "--id", "refused", "hello")
	if code != 1 || out != "" || !strings.Contains(errOut, `queue "orders" does not exist`) || !strings.Contains(errOut, "declare-queue orders") {
		t.Fatalf("schedule to a missing queue: exit %d, stdout %q, stderr %q; want exit 1 naming the queue and declare-queue", code, out, errOut)
	}
	before := time.Now()
	code, out, errOut = runBin(t, env, "schedule", "--no-check", "--to", "orders", "--in", "1h", "--header", "k=v", "hello")
	after := time.Now()
	if code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, err := uuid.Parse(id); err != nil || out != id+"\n" {
		t.Fatalf("schedule printed %q, want the message id (a UUID) alone", out)
	}
	if !strings.Contains(errOut, "scheduled "+id+" for orders at ") {
		t.Errorf("stderr %q", errOut)
	}
	code, out, errOut = runBin(t, env, "schedule", "--no-check", "--to", "orders", "--at", "2030-01-02T03:04:05.123456789Z", "--id", "given", "--empty")
	if code != 0 || out != "given\n" {
		t.Fatalf("schedule --empty: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	get := func() amqp.Delivery {
		t.Helper()
		d, ok, err := ch.Get(timeouts, true)
		if err != nil || !ok {
			t.Fatalf("get from %s: %v %v", timeouts, ok, err)
		}
		return d
	}
	d := get()
	due, err := time.Parse(time.RFC3339Nano, headerString(d.Headers, "x-due-at"))
	if err != nil {
		t.Fatalf("x-due-at %v: %v", d.Headers["x-due-at"], err)
	}
	if due.Before(before.Add(time.Hour)) || due.After(after.Add(time.Hour)) {
		t.Errorf("x-due-at %s, want between %s and %s", due, before.Add(time.Hour), after.Add(time.Hour))
	}
	if _, ok := d.Headers["x-delay"]; ok {
		t.Errorf("x-delay sent: %v", d.Headers)
	}
	if d.MessageId != id || string(d.Body) != "hello" || headerString(d.Headers, "x-destination") != "orders" || headerString(d.Headers, "k") != "v" {
		t.Errorf("got message-id %q, body %q, headers %v", d.MessageId, d.Body, d.Headers)
	}
	d = get()
	if d.MessageId != "given" || len(d.Body) != 0 || headerString(d.Headers, "x-due-at") != "2030-01-02T03:04:05.123456789Z" {
		t.Errorf("--empty --at: message-id %q, body %q, headers %v", d.MessageId, d.Body, d.Headers)
	}
	if d, ok, err := ch.Get(timeouts, true); err != nil || ok {
		t.Errorf("a third message on %s (%v): id %q", timeouts, err, d.MessageId)
	}
}

// README's "Try it in a minute", word for word but for names, on a broker
// used without its management UI: declare-queue, then schedule.
func TestTryItInAMinute(t *testing.T) {
	t.Parallel()
	b := startBridge(t, nil)
	dest := b.Endpoint + ".orders"
	deleteQueuesOnCleanup(t, dest)
	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint}

	code, out, errOut := runBin(t, env, "declare-queue", dest)
	if code != 0 || out != "declared "+dest+"\n" {
		t.Fatalf("declare-queue: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Again, and on a quorum queue of that name: an existing queue is left alone.
	if code, out, errOut = runBin(t, env, "declare-queue", "--quorum", dest); code != 0 || out != "exists "+dest+"\n" {
		t.Fatalf("declare-queue again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runBin(t, env, "schedule", "--to", dest, "--in", "1s", "hello")
	if code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	c := consume(t, dial(t), dest)
	got := c.WaitFor(1, livenessBound)
	if string(got[0].Body) != "hello" || got[0].MessageId != strings.TrimSpace(out) {
		t.Errorf("delivered body %q, message-id %q; want hello, %q", got[0].Body, got[0].MessageId, out)
	}

	// A queue of another name gets the type asked for.
	quorum := b.Endpoint + ".quorum"
	deleteQueuesOnCleanup(t, quorum)
	if code, out, errOut = runBin(t, env, "declare-queue", "--quorum", quorum); code != 0 || out != "declared "+quorum+"\n" {
		t.Fatalf("declare-queue --quorum: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	ch, err := dial(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// A classic redeclare of a quorum queue is refused: proof of its type.
	if _, err := ch.QueueDeclare(quorum, true, false, false, false, nil); err == nil {
		t.Errorf("%s: a classic declare succeeded, want the quorum queue to refuse it", quorum)
	}
}

// Times the CLI prints are what --at, --from and --to take: printed by show
// and ls, parsed back, they are the same instant, to the nanosecond.
func TestCLITimesRoundTrip(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	dest := b.Endpoint + ".dst"
	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint}
	// Odd nanoseconds, so that a print that rounds shows.
	due := time.Now().Add(time.Hour).Truncate(time.Second).Add(123456789 * time.Nanosecond)
	code, out, errOut := runBin(t, env, "schedule", "--no-check", "--to", dest, "--at", due.Format(time.RFC3339Nano), "x")
	if code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	id := strings.TrimSpace(out)
	deadline := time.Now().Add(livenessBound)
	for listIDs(t, b)[id].ID == "" {
		if time.Now().After(deadline) {
			t.Fatal("the message never showed in ls")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stored := listIDs(t, b)[id].DueAt
	if !stored.Equal(due) {
		t.Fatalf("stored due %s, scheduled %s", stored, due)
	}

	printed := map[string]string{}
	if m := regexp.MustCompile(`(?m)^due at:\s+(\S+)$`).FindStringSubmatch(mustCLI(t, b, "show", id)); m != nil {
		printed["show"] = m[1]
	}
	for _, line := range strings.Split(mustCLI(t, b, "ls", "--destination", dest), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == id {
			printed["ls"] = f[2]
		}
	}
	if len(printed) != 2 {
		t.Fatalf("due time not found in show and ls: %v", printed)
	}
	for where, p := range printed {
		back, err := time.Parse(time.RFC3339Nano, p)
		if err != nil || !back.Equal(due) {
			t.Errorf("%s printed %q: parsed back %s (%v), want %s", where, p, back, err, due)
		}
		// The printed time as a filter: --from is inclusive, --to exclusive.
		if _, ok := listIDs(t, b, "--from", p, "--destination", dest)[id]; !ok {
			t.Errorf("ls --from %s (as %s printed it) lacks the message", p, where)
		}
		if _, ok := listIDs(t, b, "--to", p, "--destination", dest)[id]; ok {
			t.Errorf("ls --to %s (as %s printed it) lists the message", p, where)
		}
		mustCLI(t, b, "reschedule", id, "--at", p)
		if got := listIDs(t, b)[id].DueAt; !got.Equal(due) {
			t.Errorf("reschedule --at %s (as %s printed it): due %s, want %s", p, where, got, due)
		}
	}
}

// ls --all --json prints one JSON document, {"timeouts": [...]} without
// "next", however many pages it followed.
func TestCLIListAllJSONIsOneDocument(t *testing.T) {
	t.Parallel()
	b, _, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	dest := b.Endpoint + ".dst"
	const n = 7
	due := time.Now().Add(time.Hour).UTC()
	for i := 0; i < n; i++ {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "page-" + string(rune('a'+i)),
			Headers: amqp.Table{"x-destination": dest, "x-due-at": due.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano)}})
	}
	deadline := time.Now().Add(livenessBound)
	for len(listIDs(t, b, "--destination", dest)) < n {
		if time.Now().After(deadline) {
			t.Fatal("the messages never showed in ls")
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := mustCLI(t, b, "ls", "--all", "--json", "--limit", "2", "--destination", dest)
	dec := json.NewDecoder(strings.NewReader(out))
	var doc map[string]json.RawMessage
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("ls --all --json: %v\n%s", err, out)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		t.Fatalf("ls --all --json: more than one JSON document (%v):\n%s", err, out)
	}
	var rows []cliRow
	if err := json.Unmarshal(doc["timeouts"], &rows); err != nil || len(rows) != n || len(doc) != 1 {
		t.Fatalf("ls --all --json: %d rows (%v), keys %d; want %d rows and only \"timeouts\":\n%s", len(rows), err, len(doc), n, out)
	}
	for i, r := range rows {
		if want := "page-" + string(rune('a'+i)); r.ID != want {
			t.Errorf("row %d: %s, want %s (due order)", i, r.ID, want)
		}
	}
}

// A cancel of an id with nothing pending (a typo, or a message already
// delivered) says so and exits 1, and does not block the id: the message
// scheduled with it next is delivered (docs/contract.md §6.3). A cancel
// that removed a message does block its id for the cancel window, and the
// message dropped then is counted and logged (§2.5, §6.2).
func TestCLICancelOfNothingLeavesTheIDFree(t *testing.T) {
	t.Parallel()
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken})
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, dial(t), dest)
	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint}

	code, out, errOut := runCLI(t, b, true, "cancel", "typo")
	if code != 1 || out != "" || !strings.Contains(errOut, `no pending timeout with id "typo"`) {
		t.Fatalf("cancel of nothing: exit %d, stdout %q, stderr %q; want exit 1 saying nothing is pending", code, out, errOut)
	}
	if code, _, errOut = runBin(t, env, "schedule", "--id", "typo", "--to", dest, "--in", "200ms", "hello"); code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	if got := c.WaitFor(1, livenessBound); got[0].MessageId != "typo" || string(got[0].Body) != "hello" {
		t.Fatalf("delivered %q %q, want typo hello", got[0].MessageId, got[0].Body)
	}

	if code, _, errOut = runBin(t, env, "schedule", "--id", "kept", "--to", dest, "--in", "1h", "one"); code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	deadline := time.Now().Add(livenessBound)
	for listIDs(t, b)["kept"].ID == "" {
		if time.Now().After(deadline) {
			t.Fatal("kept never showed in ls")
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustCLI(t, b, "cancel", "kept")
	if code, _, errOut = runBin(t, env, "schedule", "--id", "kept", "--to", dest, "--in", "100ms", "two"); code != 0 {
		t.Fatalf("schedule: exit %d, stderr %q", code, errOut)
	}
	waitMetrics(t, b, livenessBound, "the message of the cancelled id dropped", func(m map[string]float64) bool {
		return m[`delaybridge_messages_dropped_total{reason="cancelled"}`] == 1
	})
	if got := c.Quiet(quietPeriod); len(got) != 1 {
		t.Errorf("%d deliveries, want only typo's", len(got))
	}
	if !strings.Contains(b.Stderr(), `"level":"warn","component":"ingest","reason":"cancelled","id":"kept"`) {
		t.Errorf("no warning for the dropped message of cancelled id kept:\n%s", tail(b.Stderr(), 4<<10))
	}
}
