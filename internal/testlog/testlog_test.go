package testlog

import (
	"fmt"
	"testing"
)

func TestCount(t *testing.T) {
	var b Buffer
	fmt.Fprintln(&b, `{"level":"info","msg":"waiting"}`)
	fmt.Fprintln(&b, `{"level":"debug","msg":"waiting"}`)
	fmt.Fprintln(&b, `{"level":"info","msg":"found"}`)
	if got := b.Count("waiting"); got != 2 {
		t.Errorf("Count(waiting) = %d", got)
	}
	if got := b.Count(`"level":"info"`, "waiting"); got != 1 {
		t.Errorf("Count(info, waiting) = %d", got)
	}
	if got := b.Count(); got != 3 {
		t.Errorf("Count() = %d, want every non-empty line", got)
	}
	if got := CountLines("", "x"); got != 0 {
		t.Errorf("CountLines of nothing = %d", got)
	}
}
