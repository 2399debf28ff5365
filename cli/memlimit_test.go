package cli

import (
	"testing"

	"github.com/delaybridge/delaybridge/config"
)

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
