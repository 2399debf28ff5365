package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/admin"
	"github.com/delaybridge/delaybridge/wire"
)

// pause, paused and resume call the admin API; ls and show say paused.
func TestCLIPause(t *testing.T) {
	srv, st := cliServer(t) // a/1 and b 2, queue q
	ctx := context.Background()
	code, out, errOut := cli(t, srv, "pause", "q", "--by", "carol")
	if code != 0 || out != "paused q\n" {
		t.Fatalf("pause: %d %q %q", code, out, errOut)
	}
	code, out, _ = cli(t, srv, "pause", "q")
	if code != 0 || !strings.HasPrefix(out, "q was paused already (since ") {
		t.Fatalf("second pause: %d %q", code, out)
	}
	code, out, errOut = cli(t, srv, "pause", "--exchange", "x", "a.b")
	if code != 0 || out != "paused exchange \"x\" routing key \"a.b\"\n" {
		t.Fatalf("pause --exchange: %d %q %q", code, out, errOut)
	}
	if ps, err := st.Paused(ctx); err != nil || len(ps) != 2 || ps[0].Destination != wire.Queue("q") || ps[0].By != "carol" {
		t.Fatalf("store's pauses: %+v, %v", ps, err)
	}
	code, out, _ = cli(t, srv, "paused")
	if code != 0 || !strings.Contains(out, "PAUSED SINCE") || !strings.Contains(out, "carol") || !strings.Contains(out, `exchange "x"`) {
		t.Fatalf("paused: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "paused", "--json")
	var ds admin.DestinationsJSON
	if code != 0 || json.Unmarshal([]byte(out), &ds) != nil || len(ds.Destinations) != 2 {
		t.Fatalf("paused --json: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "ls")
	if code != 0 || strings.Count(out, "paused") != 2 {
		t.Fatalf("ls while paused: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "show", "a/1")
	if code != 0 || !strings.Contains(out, "paused:") {
		t.Fatalf("show while paused: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "resume", "q")
	if code != 0 || out != "resumed q\n" {
		t.Fatalf("resume: %d %q", code, out)
	}
	code, out, _ = cli(t, srv, "resume", "q")
	if code != 0 || out != "q was not paused\n" {
		t.Fatalf("second resume: %d %q", code, out)
	}
	if ls, err := st.Lease(ctx, "o", time.Now().Add(3*time.Hour), 10, time.Minute); err != nil || len(ls) != 2 {
		t.Fatalf("Lease after resume = %v, %v", ls, err)
	}
	code, out, _ = cli(t, srv, "ls")
	if code != 0 || strings.Contains(out, "paused") {
		t.Fatalf("ls after resume: %d %q", code, out)
	}
	for _, args := range [][]string{{"pause"}, {"pause", "a", "b"}, {"resume", ""}, {"paused", "x"}} {
		if code, _, _ := cli(t, srv, args...); code != exitConfig {
			t.Fatalf("%q: exit %d, want %d", args, code, exitConfig)
		}
	}
	code, _, errOut = cli(t, srv, "pause", "bad\x00name")
	if code != exitCritical || !strings.Contains(errOut, "HTTP 400") {
		t.Fatalf("pause of an invalid name: %d %q", code, errOut)
	}
}
