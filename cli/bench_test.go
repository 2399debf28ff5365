package cli

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

func TestBenchMoved(t *testing.T) {
	var errOut bytes.Buffer
	code := benchMoved(&errOut, exitConfig)
	msg := errOut.String()
	if code != exitConfig || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "go build -C bench -o ../delaybridge-bench ./cmd/delaybridge-bench") {
		t.Fatalf("bench: %d %q", code, msg)
	}
}

// The harness must stay out of the bridge's binary: a test, so that an
// import of it slipping back in fails here rather than in a binary's size.
func TestBridgeDoesNotLinkBench(t *testing.T) {
	goTool, err := exec.LookPath("go") // go test puts GOROOT/bin first on PATH
	if err != nil {
		t.Fatal(err)
	}
	// The bridge's main package, at the module's root.
	out, err := exec.Command(goTool, "list", "-deps", "github.com/delaybridge/delaybridge").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/delaybridge/delaybridge/bench" || strings.HasPrefix(pkg, "github.com/delaybridge/delaybridge/bench/") {
			t.Fatalf("the bridge's main package depends on %s", pkg)
		}
	}
}
