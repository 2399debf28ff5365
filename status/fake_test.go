package status

import (
	"cmp"
	"context"
	"slices"
	"strconv"

	"github.com/delaybridge/delaybridge/storage"
)

// rows is a List over ts with the store's rules: the filter (ListFilter.
// Selects), due order, Limit, and a cursor (here the index of the next row).
func rows(ts ...storage.Timeout) func(context.Context, storage.ListFilter) ([]storage.Timeout, string, error) {
	sorted := slices.Clone(ts)
	slices.SortStableFunc(sorted, func(a, b storage.Timeout) int {
		return cmp.Or(a.DueAt.Compare(b.DueAt), cmp.Compare(a.ID, b.ID))
	})
	return func(_ context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
		start := 0
		if f.After != "" {
			start, _ = strconv.Atoi(f.After)
		}
		var out []storage.Timeout
		for i := start; i < len(sorted); i++ {
			if !f.Selects(&sorted[i]) {
				continue
			}
			if len(out) == f.Limit {
				return out, strconv.Itoa(i), nil
			}
			t := sorted[i]
			t.Message = nil
			out = append(out, t)
		}
		return out, "", nil
	}
}
