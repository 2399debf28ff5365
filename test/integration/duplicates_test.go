package integration

// The crash tests' verdict on duplicates, on made-up runs: which causes
// (docs/contract.md §3.3) it accepts, and that it accepts nothing else.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// verdicts records what a check reported instead of failing a test.
type verdicts struct {
	errors, logs []string
}

func (v *verdicts) Helper() {}

func (v *verdicts) Logf(format string, args ...any) {
	v.logs = append(v.logs, fmt.Sprintf(format, args...))
}

func (v *verdicts) Errorf(format string, args ...any) {
	v.errors = append(v.errors, fmt.Sprintf(format, args...))
}

func (v *verdicts) unexplained() int {
	n := 0
	for _, e := range v.errors {
		if strings.Contains(e, "with no kill to explain it") {
			n++
		}
	}
	return n
}

func forwardingLine(at time.Time, ids ...string) string {
	list, _ := json.Marshal(ids) // a later send's key holds 0x1F, escaped as the bridge's logs do
	return fmt.Sprintf(`{"level":"debug","component":"dispatch","ids":%s,"time":%q,"message":"forwarding"}`,
		list, at.Format(time.RFC3339Nano))
}

func storedLine(at time.Time, id string, redelivered bool) string {
	return storedSendLine(at, id, 1, redelivered)
}

// storedSendLine is ingest's line for a message stored as send n of its id.
func storedSendLine(at time.Time, id string, n int, redelivered bool) string {
	return fmt.Sprintf(`{"level":"debug","component":"ingest","id":%q,"send":%d,"destination":"q","due_at":"2026-11-23T16:50:08Z","redelivered":%t,"time":%q,"message":"stored"}`,
		id, n, redelivered, at.Format(time.RFC3339Nano))
}

func TestDuplicateAttribution(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 16, 50, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// Due after the kill, the duplicates of most cases below cannot be a
	// forward the kill left unremoved.
	kills := []killEvent{{At: ms(1000), Running: ms(1300)}}
	for _, tc := range []struct {
		name     string
		due      time.Time
		arrivals []time.Time
		logs     []string // one per process; lines joined
		want     int      // duplicate deliveries left unexplained
	}{
		{name: "killed between the forward's confirm and the removal",
			due: ms(500), arrivals: []time.Time{ms(800), ms(1600)}},
		{name: "no kill between the arrivals",
			due: ms(500), arrivals: []time.Time{ms(600), ms(800)}, want: 1},
		{name: "stored again from a redelivery after a kill, once forwarded",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{storedLine(ms(200), "m", false),
				forwardingLine(ms(1400), "x", "m") + "\n" + storedLine(ms(1600), "m", true) + "\n" + forwardingLine(ms(1700), "m")}},
		{name: "the first commit's line missing (killed before it was written)",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", forwardingLine(ms(1400), "m") + "\n" + storedLine(ms(1600), "m", true) + "\n" + forwardingLine(ms(1700), "m")}},
		{name: "stored again, but not from a redelivery",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", forwardingLine(ms(1400), "m") + "\n" + storedLine(ms(1600), "m", false) + "\n" + forwardingLine(ms(1700), "m")},
			want: 1},
		{name: "a redelivery stored as send 2: the first was leased again, being forwarded",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", storedSendLine(ms(1350), "m", 2, true) + "\n" + forwardingLine(ms(1400), "m") + "\n" + forwardingLine(ms(1700), "m\x1f2")}},
		{name: "a send 2 stored from a first delivery explains nothing",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", storedSendLine(ms(1350), "m", 2, false) + "\n" + forwardingLine(ms(1400), "m") + "\n" + forwardingLine(ms(1700), "m\x1f2")},
			want: 1},
		{name: "a redelivery stored before anything forwarded it",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", storedLine(ms(1350), "m", true) + "\n" + forwardingLine(ms(1400), "m") + "\n" + forwardingLine(ms(1700), "m")},
			want: 1},
		{name: "a redelivery stored by the first process, which no kill preceded",
			due: ms(100), arrivals: []time.Time{ms(350), ms(550)},
			logs: []string{forwardingLine(ms(300), "m") + "\n" + storedLine(ms(400), "m", true) + "\n" + forwardingLine(ms(500), "m")},
			want: 1},
		{name: "a second commit of another id",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800)},
			logs: []string{"", forwardingLine(ms(1400), "n") + "\n" + storedLine(ms(1600), "n", true) + "\n" + forwardingLine(ms(1700), "m")},
			want: 1},
		{name: "one second commit explains one extra delivery",
			due: ms(1200), arrivals: []time.Time{ms(1500), ms(1800), ms(1900)},
			logs: []string{"", forwardingLine(ms(1400), "m") + "\n" + storedLine(ms(1600), "m", true) + "\n" + forwardingLine(ms(1700), "m", "m")},
			want: 1},
		{name: "both causes for one message",
			due: ms(500), arrivals: []time.Time{ms(800), ms(2500), ms(2800)},
			logs: []string{forwardingLine(ms(700), "m"),
				forwardingLine(ms(2400), "m") + "\n" + storedLine(ms(2600), "m", true) + "\n" + forwardingLine(ms(2700), "m")}},
		{name: "both kinds of duplicate, evidence for one",
			due: ms(500), arrivals: []time.Time{ms(800), ms(2500), ms(2800)},
			logs: []string{forwardingLine(ms(700), "m"), forwardingLine(ms(2400), "m") + "\n" + forwardingLine(ms(2700), "m")},
			want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := faultReport{arrivals: map[string][]faultArrival{}, dupIDs: []string{"m"}}
			for _, at := range tc.arrivals {
				rep.arrivals["m"] = append(rep.arrivals["m"], faultArrival{ID: "m", Queue: "q", At: at})
			}
			var v verdicts
			checkDuplicatesExplainedByKills(&v, rep, map[string]time.Time{"m": tc.due}, kills, restoredAfterKills(tc.logs))
			if got := v.unexplained(); got != tc.want {
				t.Errorf("%d duplicate deliveries left unexplained, want %d; errors %q, logs %q", got, tc.want, v.errors, v.logs)
			}
			if (tc.want > 0) != (len(v.errors) > 0) {
				t.Errorf("errors %q, want them only for unexplained duplicates", v.errors)
			}
		})
	}
}
