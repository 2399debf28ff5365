package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/config"
)

// A bridge without DELAYBRIDGE_ADMIN_TOKEN takes the token file's, making
// it; a default path it cannot write leaves the API off with a warning; a
// path the operator named must work.
func TestAdminTokenFromTheFile(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	log := zerolog.New(&logs)

	cfg := config.Config{AdminTokenFile: filepath.Join(dir, "data", "admin-token")}
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN_FILE", cfg.AdminTokenFile)
	if code := adminToken(&cfg, log); code != exitOK || cfg.AdminToken == "" {
		t.Fatalf("adminToken = %d, token set %v", code, cfg.AdminToken != "")
	}
	if tok, err := admin.ReadTokenFile(cfg.AdminTokenFile); err != nil || tok != cfg.AdminToken {
		t.Fatalf("the file holds %q (%v), the bridge uses another token", tok, err)
	}
	if strings.Contains(logs.String(), cfg.AdminToken) || !strings.Contains(logs.String(), "made a token") {
		t.Fatalf("logs %q: want the file named and the token never", logs.String())
	}

	// A set token wins; the file is not read.
	set := config.Config{AdminToken: "given", AdminTokenFile: filepath.Join(dir, "never")}
	if code := adminToken(&set, log); code != exitOK || set.AdminToken != "given" {
		t.Fatalf("with a token: %d %q", code, set.AdminToken)
	}
	if _, err := os.Stat(set.AdminTokenFile); !os.IsNotExist(err) {
		t.Fatalf("the file was made although a token was set: %v", err)
	}

	// A path that cannot be made: under a regular file (root writes anywhere else).
	blocker := filepath.Join(dir, "plain")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	unwritable := filepath.Join(blocker, "admin-token")
	os.Unsetenv("DELAYBRIDGE_ADMIN_TOKEN_FILE") // the default path
	logs.Reset()
	def := config.Config{AdminTokenFile: unwritable}
	if code := adminToken(&def, log); code != exitOK || def.AdminToken != "" || !strings.Contains(logs.String(), "admin API off") {
		t.Fatalf("default path unwritable: exit %d, token %q, logs %q; want the API off with a warning", code, def.AdminToken, logs.String())
	}
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN_FILE", unwritable)
	if code := adminToken(&config.Config{AdminTokenFile: unwritable}, log); code != exitConfig {
		t.Fatalf("named path unwritable: exit %d, want %d", code, exitConfig)
	}

	// A file others can read is refused even at the default path.
	os.Unsetenv("DELAYBRIDGE_ADMIN_TOKEN_FILE")
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("tok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := adminToken(&config.Config{AdminTokenFile: open}, log); code != exitConfig {
		t.Fatalf("a world-readable token file: exit %d, want %d", code, exitConfig)
	}
}

// No broker at the URL: the one line says how to get one; a broker that
// answers and refuses gets no such advice.
func TestBrokerHint(t *testing.T) {
	c := broker.NewConn(broker.ConnOptions{URL: "amqp://guest:guest@127.0.0.1:1/", Name: "test"})
	err := c.Connect()
	if err == nil {
		t.Fatal("connected to port 1")
	}
	if h := brokerHint(err); !strings.Contains(h, "DELAYBRIDGE_AMQP_URL") || !strings.Contains(h, "ensure-rabbitmq.sh") {
		t.Fatalf("brokerHint(%v) = %q", err, h)
	}
	if h := brokerHint(broker.ErrNeverConnected); h != "" {
		t.Fatalf("a refusal got the hint %q", h)
	}
}

// Console logs carry colour codes only to a terminal: a file or a pipe (a
// log collector) gets plain text.
func TestConsoleLogColourOnlyOnATerminal(t *testing.T) {
	cfg := config.Config{LogLevel: "info", LogFormat: "console"}
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fl := newLogger(cfg, f)
	fl.Info().Str("k", "v").Msg("hello")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pl := newLogger(cfg, w)
	pl.Warn().Msg("piped")
	w.Close()
	piped, _ := io.ReadAll(r)
	written, _ := os.ReadFile(f.Name())
	for name, out := range map[string][]byte{"file": written, "pipe": piped} {
		if !bytes.Contains(out, []byte("k=v")) && !bytes.Contains(out, []byte("piped")) {
			t.Fatalf("%s: nothing logged: %q", name, out)
		}
		if bytes.Contains(out, []byte("\x1b[")) {
			t.Errorf("%s got colour codes: %q", name, out)
		}
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !isTerminal(tty) {
			t.Error("/dev/tty is not seen as a terminal")
		}
	}
}

func TestMemoryLimitFollowsTheBudgetUnlessGOMEMLIMITIsSet(t *testing.T) {
	cfg := config.Config{MaxInflightBytes: 64 << 20}
	if got, ok := memoryLimit(cfg, ""); !ok || got != 320<<20 {
		t.Fatalf("memoryLimit = %d, %v; want 320 MiB", got, ok)
	}
	if _, ok := memoryLimit(cfg, "1GiB"); ok {
		t.Fatal("the operator's GOMEMLIMIT was overridden")
	}
	if _, ok := memoryLimit(config.Config{}, ""); ok {
		t.Fatal("a limit without a budget")
	}
}
