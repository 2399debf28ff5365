package status

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/storage"
)

// Due times span years 0000 to 2262: further from now than a time.Duration
// holds. The page used to print a saturated Duration, and for year 0000 a
// negated minimum Duration that overflowed into a negative one.
func TestFarDueTimesAreWordedInYears(t *testing.T) {
	now := t0
	farPast := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	farFuture := storage.MaxDueAt
	page := get(t, New(Options{Now: func() time.Time { return now },
		NextDue: func(context.Context) (time.Time, bool, error) { return farPast, true, nil },
		List: rows(
			storage.Timeout{ID: "old", Destination: "d", DueAt: farPast},
			storage.Timeout{ID: "far", Destination: "d", DueAt: farFuture},
			storage.Timeout{ID: "year", Destination: "d", DueAt: now.AddDate(1, 0, 3).Add(time.Hour)},
			storage.Timeout{ID: "soon", Destination: "d", DueAt: now.Add(400 * time.Hour)},
		)}))
	mustContain(t, page, "2026y 324d overdue", "in 235y 141d", "in 1y 3d", "in 16d 16h0m0s")
	for _, bad := range []string{"106751d", "-2562047h"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page shows a saturated or overflowed duration %q", bad)
		}
	}
}
