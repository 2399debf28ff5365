package integration

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const adminToken = "it-admin-token-0123456789"

// runCLI runs an admin subcommand of the built binary against bridge b. The
// token is passed through the environment only when withToken is set.
func runCLI(t *testing.T, b *bridgeProc, withToken bool, args ...string) (int, string, string) {
	t.Helper()
	env := map[string]string{"DELAYBRIDGE_ADMIN_URL": "http://" + b.HTTPAddr}
	if withToken {
		env["DELAYBRIDGE_ADMIN_TOKEN"] = adminToken
	}
	return runBin(t, env, args...)
}

// runBin runs the built binary with args and exactly the given DELAYBRIDGE_*
// variables, to its end, and returns its exit code, stdout and stderr.
func runBin(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	cmd := bridgeCommand(t, env, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, out.String(), errOut.String()
}

func mustCLI(t *testing.T, b *bridgeProc, args ...string) string {
	t.Helper()
	code, out, errOut := runCLI(t, b, true, args...)
	if code != 0 {
		t.Fatalf("delaybridge %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

type cliRow struct {
	ID          string    `json:"id"`
	Destination string    `json:"destination"`
	DueAt       time.Time `json:"due_at"`
}

func listIDs(t *testing.T, b *bridgeProc, args ...string) map[string]cliRow {
	t.Helper()
	var page struct{ Timeouts []cliRow }
	out := mustCLI(t, b, append([]string{"ls", "--json", "--all"}, args...)...)
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("ls --json: %v: %s", err, out)
	}
	m := map[string]cliRow{}
	for _, r := range page.Timeouts {
		m[r.ID] = r
	}
	return m
}

// TestAdminCLI drives ls / show / reschedule / cancel / dispatch / stats
// through the real binary against a running bridge.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_POLL_INTERVAL": "200ms"})
	dest := b.Endpoint + ".dst"
	got := declareAndConsume(t, conn, dest)

	due := time.Now().Add(time.Hour).UTC()
	ids := []string{"admin/one", "admin two%", "admin-three"}
	for _, id := range ids {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: id, Body: []byte("body of " + id), ContentType: "text/plain",
			Headers: amqp.Table{"x-destination": dest, "x-due-at": due.Format(time.RFC3339Nano), "custom": int32(42)}})
	}
	deadline := time.Now().Add(livenessBound)
	for len(listIDs(t, b)) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("the timeouts never showed in ls: %v", listIDs(t, b))
		}
		time.Sleep(100 * time.Millisecond)
	}
	table := mustCLI(t, b, "ls", "--destination", dest)
	for _, id := range ids {
		if !strings.Contains(table, id) {
			t.Errorf("ls table lacks %q:\n%s", id, table)
		}
	}
	if n := len(listIDs(t, b, "--destination", "other")); n != 0 {
		t.Errorf("ls --destination other: %d rows", n)
	}

	show := mustCLI(t, b, "show", "admin/one")
	if !strings.Contains(show, "body of admin/one") || !strings.Contains(show, "header custom") || !strings.Contains(show, dest) {
		t.Errorf("show:\n%s", show)
	}
	var shown struct {
		BodyBase64 string         `json:"body_base64"`
		Headers    map[string]any `json:"headers"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, b, "show", "--json", "admin two%")), &shown); err != nil || shown.Headers["custom"] != 42.0 {
		t.Errorf("show --json: %+v %v", shown, err)
	}

	later := due.Add(time.Hour).Truncate(time.Millisecond)
	mustCLI(t, b, "reschedule", "admin-three", "--at", later.Format(time.RFC3339Nano))
	if r := listIDs(t, b)["admin-three"]; !r.DueAt.Equal(later) {
		t.Errorf("after reschedule due %s, want %s", r.DueAt, later)
	}

	mustCLI(t, b, "cancel", "admin two%")
	if _, ok := listIDs(t, b)["admin two%"]; ok {
		t.Error("cancelled timeout still listed")
	}
	code, _, errOut := runCLI(t, b, true, "cancel", "admin two%")
	if code != 1 || !strings.Contains(errOut, "no pending timeout") {
		t.Errorf("second cancel: exit %d, stderr %q", code, errOut)
	}

	start := time.Now()
	mustCLI(t, b, "dispatch", "admin/one")
	arr := got.WaitFor(1, livenessBound)
	if arr[0].MessageId != "admin/one" || string(arr[0].Body) != "body of admin/one" {
		t.Errorf("dispatched message: id %q body %q", arr[0].MessageId, arr[0].Body)
	}
	t.Logf("dispatch-now delivered after %s", arr[0].At.Sub(start).Round(time.Millisecond))
	if _, ok := listIDs(t, b)["admin/one"]; ok {
		t.Error("dispatched timeout still listed")
	}

	stats := mustCLI(t, b, "stats", "--json")
	var s struct {
		Pending *int       `json:"pending"`
		NextDue *time.Time `json:"next_due"`
	}
	if err := json.Unmarshal([]byte(stats), &s); err != nil || s.Pending == nil || *s.Pending != 1 || s.NextDue == nil || !s.NextDue.Equal(later) {
		t.Errorf("stats: %s (%v)", stats, err)
	}

	// Without the token: a clear 401, exit 1.
	code, _, errOut = runCLI(t, b, false, "ls")
	if code != 1 || !strings.Contains(errOut, "401") || !strings.Contains(errOut, "token") {
		t.Errorf("ls without the token: exit %d, stderr %q", code, errOut)
	}
	if strings.Contains(b.Stderr(), adminToken) {
		t.Error("the bridge logged the admin token")
	}
	if !b.Running() {
		t.Fatalf("bridge exited with code %d", b.Wait(0))
	}
}

// TestAdminDisabledWithoutToken: no DELAYBRIDGE_ADMIN_TOKEN and
// DELAYBRIDGE_ADMIN_TOKEN_FILE empty (execBridge's default), no admin API.
func TestAdminDisabledWithoutToken(t *testing.T) {
	t.Parallel()
	b := startBridge(t, nil)
	code, _, errOut := runCLI(t, b, true, "stats")
	if code != 1 || !strings.Contains(errOut, "disabled") {
		t.Errorf("stats against a bridge without a token: exit %d, stderr %q", code, errOut)
	}
}

// TestAdminTokenFile: with no DELAYBRIDGE_ADMIN_TOKEN the bridge makes a
// token in DELAYBRIDGE_ADMIN_TOKEN_FILE, owner-only; the CLI on this
// machine uses it without being told; a restart keeps it.
func TestAdminTokenFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "data", "admin-token")
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN_FILE": path})
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v; want one with mode 0600", err, fi)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(string(raw))
	cli := func(b *bridgeProc, env map[string]string) (int, string) {
		full := map[string]string{"DELAYBRIDGE_ADMIN_URL": "http://" + b.HTTPAddr}
		maps.Copy(full, env)
		code, out, errOut := runBin(t, full, "stats")
		return code, out + errOut
	}
	if code, out := cli(b, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN_FILE": path}); code != 0 || !strings.Contains(out, "pending") {
		t.Fatalf("stats with the token file: exit %d: %s", code, out)
	}
	if code, out := cli(b, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN_FILE": ""}); code != 1 || !strings.Contains(out, "401") {
		t.Fatalf("stats without a token: exit %d: %s; want 401", code, out)
	}
	if strings.Contains(b.Stderr(), tok) || !strings.Contains(b.Stderr(), path) {
		t.Fatalf("the log must name the file and never the token:\n%s", b.Stderr())
	}
	b.Stop()
	b = b.Restart(nil)
	if code, out := cli(b, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": tok}); code != 0 {
		t.Fatalf("after a restart the first token no longer works: exit %d: %s", code, out)
	}

	// Made readable by others, it is refused at start: exit 2, saying why.
	b.Stop()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	p := execBridge(t, bridgeEnv(t, b.Env))
	if code := p.Wait(20 * time.Second); code != 2 || !strings.Contains(p.Stderr(), "DELAYBRIDGE_ADMIN_TOKEN_FILE") || !strings.Contains(p.Stderr(), "chmod 600") {
		t.Fatalf("a world-readable token file: exit %d, stderr %q; want 2 naming the variable", code, p.Stderr())
	}
}

// TestAdminReplayErrors: a dispatch failure on the error queue goes back into
// the store with `delaybridge replay-errors` and is delivered once its
// destination exists; an ingest failure stays on the error queue.
func TestAdminReplayErrors(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, map[string]string{
		"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_NUMBER_OF_RETRIES": "0", "DELAYBRIDGE_POLL_INTERVAL": "100ms",
	})
	dest := b.Endpoint + ".later"
	due := time.Now().Add(200 * time.Millisecond).UTC()
	body := []byte("replay \x00\xff me")
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "replay-1", CorrelationId: "c-1", ContentType: "application/x-bin", Body: body,
		Headers: amqp.Table{"x-destination": dest, "x-due-at": due.Format(time.RFC3339Nano), "custom": "kept"}})
	// An ingest failure (no due time) on the same error queue.
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "bad-1", Body: []byte("no due time"),
		Headers: amqp.Table{"x-destination": dest}})

	deadline := time.Now().Add(livenessBound + 2*time.Second)
	for queueDepth(t, conn, b.ErrorQ) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("error queue has %d messages, want 2", queueDepth(t, conn, b.ErrorQ))
		}
		time.Sleep(100 * time.Millisecond)
	}

	got := declareAndConsume(t, conn, dest)
	out := mustCLI(t, b, "replay-errors", "--json")
	var res struct{ Replayed, Skipped int }
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Replayed != 1 || res.Skipped != 1 {
		t.Fatalf("replay-errors: %s (%v)", out, err)
	}
	arr := got.WaitFor(1, livenessBound)
	d := arr[0]
	if d.MessageId != "replay-1" || d.CorrelationId != "c-1" || d.ContentType != "application/x-bin" || !bytes.Equal(d.Body, body) {
		t.Errorf("replayed message: id %q corr %q type %q body %q", d.MessageId, d.CorrelationId, d.ContentType, d.Body)
	}
	if headerString(d.Headers, "custom") != "kept" {
		t.Errorf("custom header lost: %v", d.Headers)
	}
	for k := range d.Headers {
		if strings.HasPrefix(k, "x-delaybridge-") || k == "NServiceBus.ExceptionInfo.Message" || k == "NServiceBus.FailedQ" || k == "x-due-at" {
			t.Errorf("replayed message still carries %q", k)
		}
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 1 {
		t.Errorf("error queue has %d messages after replay, want 1 (the ingest failure)", n)
	}
	// A second pass finds only the ingest failure and leaves it there.
	out = mustCLI(t, b, "replay-errors")
	if !strings.Contains(out, "replayed 0, skipped 1") {
		t.Errorf("second replay: %s", out)
	}
	if n := queueDepth(t, conn, b.ErrorQ); n != 1 {
		t.Errorf("error queue has %d messages after the second pass, want 1", n)
	}
	if extra := got.Quiet(quietPeriod); len(extra) != 1 {
		t.Errorf("%d deliveries to %s, want 1", len(extra), dest)
	}
}
