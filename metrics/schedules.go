package metrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delaybridge/delaybridge/storage"
)

// Recurring schedule series (docs/contract.md §6.2, §2.11):
// delaybridge_schedules{state} read from the store at scrape time, and
// delaybridge_schedule_fires_total and delaybridge_schedule_misfires_total
// counted from what the firer's FireDue calls report (FireCounter).

// ScheduleStates are the values of delaybridge_schedules' state label:
// active (firing), paused, ended (no fire time left, or it could not be
// planned). Every series is reported at each scrape, zero or not.
var ScheduleStates = []string{"active", "paused", "ended"}

// maxScheduleScan bounds the schedules one scrape reads: the counts of a
// store with more are left out of that scrape rather than taking long.
const maxScheduleScan = 100_000

// scheduleCollector counts the schedules by state at scrape time.
type scheduleCollector struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	list func(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error)
}

func newScheduleCollector() *scheduleCollector {
	return &scheduleCollector{desc: prometheus.NewDesc(namespace+"_schedules",
		"Recurring schedules in the store, by state: active, paused, ended (no fire time left). Absent when the store keeps none.",
		[]string{"state"}, nil)}
}

func (c *scheduleCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *scheduleCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	list := c.list
	c.mu.Unlock()
	if list == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := CountSchedules(ctx, list)
	if err != nil {
		return // left out of this scrape, as the store's other series
	}
	for _, s := range ScheduleStates {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}

// CountSchedules counts the schedules list pages through by state
// (ScheduleStates); an error past maxScheduleScan schedules.
func CountSchedules(ctx context.Context, list func(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error)) (map[string]int, error) {
	counts := map[string]int{}
	after, seen := "", 0
	for {
		page, next, err := list(ctx, after, 1000)
		if err != nil {
			return nil, err
		}
		for i := range page {
			switch s := &page[i]; {
			case s.Paused:
				counts["paused"]++
			case s.NextFireAt.IsZero():
				counts["ended"]++
			default:
				counts["active"]++
			}
		}
		seen += len(page)
		if next == "" {
			return counts, nil
		}
		if seen >= maxScheduleScan {
			return nil, errTooManySchedules
		}
		after = next
	}
}

var errTooManySchedules = errors.New("metrics: too many schedules to count at a scrape")

// WatchSchedules has every scrape report delaybridge_schedules{state} from
// the store's schedules (storage.Scheduler.ListSchedules).
func (m *Metrics) WatchSchedules(list func(ctx context.Context, after string, limit int) ([]storage.Schedule, string, error)) {
	if m == nil {
		return
	}
	m.schedules.mu.Lock()
	m.schedules.list = list
	m.schedules.mu.Unlock()
}

// ScheduleFired counts what one FireDue did: each fire stored, and each
// misfire (fired late or skipped).
func (m *Metrics) ScheduleFired(fired []storage.Fired) {
	if m == nil {
		return
	}
	for i := range fired {
		if fired[i].Stored {
			m.scheduleFires.Inc()
		}
		if fired[i].Misfired {
			m.scheduleMisfires.Inc()
		}
	}
}

// FireStore is what the firer asks of the store (recurring.Store).
type FireStore interface {
	NextScheduleDue(ctx context.Context) (time.Time, bool, error)
	FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error)
}

// FireCounter is s, with what each FireDue reports counted in m
// (ScheduleFired).
func (m *Metrics) FireCounter(s FireStore) FireStore { return fireCounter{s, m} }

type fireCounter struct {
	FireStore
	m *Metrics
}

func (f fireCounter) FireDue(ctx context.Context, now time.Time, lead time.Duration, limit int, plan storage.Planner) ([]storage.Fired, error) {
	fired, err := f.FireStore.FireDue(ctx, now, lead, limit, plan)
	if err == nil {
		f.m.ScheduleFired(fired)
	}
	return fired, err
}
