package cli

import (
	"fmt"
	"io"
)

// runBench is `delaybridge bench`. The bench is its own command,
// delaybridge-bench, in a module of its own so that the harness is not
// linked into the bridge: this only says how to build and run it.
func runBench(args []string, out, errOut io.Writer) int {
	if len(args) > 0 && isHelp(args[0]) {
		return benchMoved(out, exitOK)
	}
	return benchMoved(errOut, exitConfig)
}

// benchMoved prints how to build and run the bench to w and returns code.
func benchMoved(w io.Writer, code int) int {
	fmt.Fprintln(w, "delaybridge: the bench is its own command: go build -o delaybridge . && go build -C bench -o ../delaybridge-bench ./cmd/delaybridge-bench && ./delaybridge-bench (see bench/README.md)")
	return code
}
