package integration

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func getStatusPage(t *testing.T, b *bridgeProc) string {
	t.Helper()
	resp, body := request(t, b, http.MethodGet, "/", false)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %s %q: %s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	return body
}

// TestStatusPage: the bridge serves the status page at / with its counts,
// connections, breakers and the next due messages, escaped; and headless
// Chromium (Debian's chromium package; see chromiumPath) renders it.
func TestStatusPage(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, nil)
	dest := b.Endpoint + ".dst"
	declareQueue(t, conn, dest)
	evil := `<script>alert(1)</script>`
	due := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	pub.PublishAll(b.TimeoutsQueue(), []amqp.Publishing{
		{MessageId: evil, Body: []byte("SECRET-BODY"), Headers: amqp.Table{"x-destination": dest, "x-due-at": due, "x-secret-header": "HDR"}},
		{MessageId: "status-page-2", Body: []byte("x"), Headers: amqp.Table{"x-destination": dest, "x-due-at": due}},
	})
	var page string
	deadline := time.Now().Add(15 * time.Second)
	for {
		page = getStatusPage(t, b)
		if strings.Contains(page, `id="pending">2<`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{`id="pending">2<`, `id="leased">0<`, "status-page-2", "&lt;script&gt;alert(1)&lt;/script&gt;",
		dest, "consume connection", "publish connection", "store breaker", "dispatch breaker", "fetch breaker", ">healthy<", ">in "} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	for _, bad := range []string{evil, "SECRET-BODY", "x-secret-header", "HDR"} {
		if strings.Contains(page, bad) {
			t.Errorf("status page contains %q", bad)
		}
	}

	chromium := chromiumPath(t) // a failure under CI=true when missing, never a silent pass
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--dump-dom", "http://"+b.HTTPAddr+"/").Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	dom := string(out)
	// The DOM as the browser built it: the id is text, not a script element.
	if !strings.Contains(dom, "status-page-2") || !strings.Contains(dom, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("chromium's DOM lacks the rows:\n%s", tail(dom, 2000))
	}
	if strings.Contains(dom, "<script") {
		t.Errorf("chromium's DOM has a script element")
	}
	png := filepath.Join(dir, "status.png")
	if err := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile2"), "--window-size=1280,900",
		"--screenshot="+png, "http://"+b.HTTPAddr+"/").Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v", err)
	}
	if fi, err := os.Stat(png); err != nil || fi.Size() < 10_000 {
		t.Errorf("screenshot %v, %v: want a PNG of some size", fi, err)
	}
}
