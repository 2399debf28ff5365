package integration

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/wire"
)

// Operating a recurring schedule (docs/contract.md §2.11, §5.5, §6.2-§6.4):
// made every second over AMQP, listed and shown by the CLI, paused (no
// fires), resumed (fires again), fired now (one extra fire, its own id),
// counted in /metrics, listed on the status page, and cancelled through
// the admin API (no fires after, 404 then).
func TestScheduleOperations(t *testing.T) {
	b := startBridge(t, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken, "DELAYBRIDGE_MISFIRE_THRESHOLD": "2s"})
	conn := dial(t)
	dest := b.Endpoint + ".ops"
	deleteQueuesOnCleanup(t, dest)
	ticks := declareAndConsume(t, conn, dest)
	pub := newPublisher(t, conn)

	const id, key = "ops-every-second", "amqp:ops-every-second"
	pub.Publish(b.TimeoutsQueue(), scheduleMsg(id, dest, nil))
	once(t, fireTimes(t, ticks.WaitFor(3, 30*time.Second), id))

	out := mustCLI(t, b, "schedules")
	if !regexp.MustCompile(`(?m)^`+key+`\s+active\s`).MatchString(out) || !strings.Contains(out, "Europe/Berlin") {
		t.Fatalf("schedules lists:\n%s", out)
	}
	out = mustCLI(t, b, "schedules", "show", key)
	if !strings.Contains(out, "next fires:") || strings.Count(out, "+01:00") < 5 || !strings.Contains(out, "tick") {
		t.Fatalf("schedules show:\n%s", out)
	}

	// Paused: no fire for a fire time after the pause, but for those
	// stored or leased a lookahead before it.
	if out := mustCLI(t, b, "schedules", "pause", key); out != "paused "+key+"\n" {
		t.Fatalf("pause: %q", out)
	}
	paused := time.Now()
	for _, ft := range fireTimes(t, ticks.Quiet(4*time.Second), id) {
		if ft.After(paused.Add(1500 * time.Millisecond)) {
			t.Fatalf("fire for %s while paused (since %s)", ft.Format(time.RFC3339Nano), paused.Format(time.RFC3339Nano))
		}
	}
	if out := mustCLI(t, b, "schedules"); !regexp.MustCompile(`(?m)^` + key + `\s+paused\s`).MatchString(out) {
		t.Fatalf("schedules while paused:\n%s", out)
	}

	if out := mustCLI(t, b, "schedules", "resume", key); out != "resumed "+key+"\n" {
		t.Fatalf("resume: %q", out)
	}
	resumed := time.Now().Truncate(time.Second)
	ticks.WaitUntil(30*time.Second, "a fire after the resume", func(got []arrival) bool {
		for _, ft := range fireTimes(t, got, id) {
			if ft.After(resumed) {
				return true
			}
		}
		return false
	})

	out = mustCLI(t, b, "schedules", "fire", key)
	m := regexp.MustCompile(`^fired ` + key + `: (\S+) due `).FindStringSubmatch(out)
	if m == nil || !strings.Contains(m[1], "@now") {
		t.Fatalf("fire: %q", out)
	}
	fireID := m[1]
	got := ticks.WaitUntil(30*time.Second, "the extra fire "+fireID, func(got []arrival) bool {
		return len(byMessageID(got)[fireID]) > 0
	})
	extra := byMessageID(got)[fireID][0]
	if headerString(extra.Headers, wire.HeaderScheduleID) != id || string(extra.Body) != "tick" {
		t.Fatalf("the extra fire: headers %v, body %q", extra.Headers, extra.Body)
	}

	code, body := adminDo(t, b, http.MethodGet, "/api/v1/schedules/"+key)
	if code != 200 || !strings.Contains(body, `"state": "active"`) || !strings.Contains(body, `"next_fire_times"`) {
		t.Fatalf("GET the schedule: %d %s", code, body)
	}
	metricsText := httpGet(t, b, "/metrics")
	if !strings.Contains(metricsText, `delaybridge_schedules{state="active"} 1`) ||
		!regexp.MustCompile(`(?m)^delaybridge_schedule_fires_total [1-9]`).MatchString(metricsText) ||
		!strings.Contains(metricsText, "delaybridge_schedule_misfires_total") {
		t.Fatalf("/metrics lacks the schedule series:\n%s", linesWith(metricsText, "schedule"))
	}
	if page := httpGet(t, b, "/"); !strings.Contains(page, key) || !strings.Contains(page, `id="schedule-rows"`) {
		t.Fatal("the status page does not list the schedule")
	}

	if code, body := adminDo(t, b, http.MethodDelete, "/api/v1/schedules/"+key); code != http.StatusNoContent {
		t.Fatalf("DELETE the schedule: %d %s", code, body)
	}
	cancelled := time.Now()
	all := ticks.Quiet(4 * time.Second)
	var cron []arrival
	for _, a := range all {
		if a.MessageId != fireID {
			cron = append(cron, a)
		}
	}
	fts := fireTimes(t, cron, id)
	once(t, fts)
	for _, ft := range fts {
		if ft.After(cancelled.Add(1500 * time.Millisecond)) {
			t.Fatalf("fire for %s after the cancel at %s", ft.Format(time.RFC3339Nano), cancelled.Format(time.RFC3339Nano))
		}
	}
	if code, body := adminDo(t, b, http.MethodGet, "/api/v1/schedules/"+key); code != http.StatusNotFound || !strings.Contains(body, "no schedule with key") {
		t.Fatalf("GET after the cancel: %d %s", code, body)
	}
	if code, _, errOut := runCLI(t, b, true, "schedules", "fire", key); code != 1 || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("schedules fire after the cancel: exit %d, %q", code, errOut)
	}
}

// linesWith returns the lines of s that contain sub.
func linesWith(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
