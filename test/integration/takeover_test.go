package integration

// Fail-over of bridge instances on one PostgreSQL store: a dead instance's
// leases are taken over at once, judged by its liveness session, not when
// they expire (docs/contract.md §7.1).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestTakeOverStallKillStop: three bridges share one PostgreSQL schema,
// with a one-minute lease, under a steady flow (300 messages a second for
// 20 s, each due 1–5 s after its publish). 3 s in, instance 2 is stopped
// (SIGSTOP) for 6 s and continued; 11 s in, instance 1 is killed
// (SIGKILL); 16 s in, instance 0 is stopped gracefully (SIGTERM), leaving
// instance 2 alone.
//
// Asserted: every message arrives and none early; every message arrives
// within 15 s of its due time, where a lease the killed instance held when
// it died would make its row a minute late (the lease); the killed
// instance is forgotten by the survivors (they saw its session end); every
// duplicate is either a forward the killed instance left unsettled (its
// debug log says "forwarding" for it more often than "removed"), or came
// from a take-over past the grace (its second arrival at least 1 s after
// its due time), the only windows §7.1 states for these events: the
// stall, shorter than the lease, forwards nothing twice.
func TestTakeOverStallKillStop(t *testing.T) {
	t.Parallel()
	const (
		rate      = 300
		runFor    = 20 * time.Second
		batch     = 30
		dueFrom   = 1 * time.Second
		dueTo     = 5 * time.Second
		lease     = time.Minute
		stopAt    = 3 * time.Second
		stopFor   = 6 * time.Second
		killAt    = 11 * time.Second
		termAt    = 16 * time.Second
		lateBound = 15 * time.Second
		grace     = time.Second // postgres.DefaultTakeoverGrace
	)
	testStart := time.Now()
	pg := requirePostgres(t)
	env, endpoint, _ := pg.sharedEnv(t, map[string]string{
		"DELAYBRIDGE_LOCK_LEASE_DURATION": lease.String(),
		"DELAYBRIDGE_LOG_LEVEL":           "debug", // "forwarding"/"removed": what the kill left unsettled
	})
	insts := make([]*bridgeProc, 3)
	for i := range insts {
		insts[i] = execBridge(t, bridgeEnv(t, env))
	}
	owners := make([]string, len(insts))
	for i, b := range insts {
		b.waitReady(30 * time.Second)
		owners[i] = bridgeOwner(b)
	}
	termed, victim, stalled := insts[0], insts[1], insts[2]
	t.Cleanup(func() { _ = stalled.cmd.Process.Signal(syscall.SIGCONT) }) // never left stopped
	dests := []string{endpoint + ".dst-a", endpoint + ".dst-b"}
	_, c, pub := startFaultClients(t, "it-takeover-publisher", dests...)
	defer func() {
		for i, b := range insts {
			summarizeBridgeLog(t, fmt.Sprintf("instance %d (%s)", i, owners[i]), b)
		}
		t.Logf("runtime %s", time.Since(testStart).Round(time.Millisecond))
	}()

	start := time.Now()
	n := int(rate * runFor / time.Second)
	pubDone := publishWaveAsync(pub, endpoint+".Timeouts", dests, "takeover-", n, batch, time.Second*batch/rate, dueFrom, dueTo)

	time.Sleep(time.Until(start.Add(stopAt)))
	if err := stalled.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	time.Sleep(stopFor)
	if err := stalled.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
	t.Logf("instance 2 stopped from +%s for %s", stopAt, stopFor)

	time.Sleep(time.Until(start.Add(killAt)))
	// Frozen first, so that the leases read are exactly those it dies
	// with; its session ends with the kill, as with a kill alone.
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	leased := pg.leasedBy(t, owners[1], time.Now())
	victim.Kill()
	kill := time.Now()
	vlog := &dispatchLog{}
	vlog.update(victim.Stderr())
	t.Logf("killed instance 1 at +%s holding %d live leases; forwards it left unsettled: %d",
		kill.Sub(start).Round(time.Millisecond), len(leased), len(vlog.inFlight()))

	time.Sleep(time.Until(start.Add(termAt)))
	termed.Stop()
	t.Logf("instance 0 stopped gracefully at +%s", time.Since(start).Round(time.Millisecond))

	res := awaitWave(t, pubDone)
	due := res.due
	if missing := c.waitAll(due, time.Until(latestDue(due).Add(lateBound))); missing > 0 {
		t.Errorf("%d of %d messages still missing %s after the last due time (a lease left to expire takes %s)", missing, len(due), lateBound, lease)
	}
	time.Sleep(2 * time.Second) // late duplicates
	rep := checkFaultRun(t, due, c.All())

	late, lateOver := time.Duration(0), 0
	var afterKill []time.Duration
	for id, as := range rep.arrivals {
		l := as[0].At.Sub(due[id])
		late = max(late, l)
		if l > lateBound {
			lateOver++
			if lateOver <= 10 {
				t.Errorf("message %s (due %s) arrived %s late, more than %s", id, due[id].Format("15:04:05.000"), l.Round(time.Millisecond), lateBound)
			}
		}
		if d := due[id]; !d.Before(kill) && d.Before(kill.Add(10*time.Second)) {
			afterKill = append(afterKill, l)
		}
	}
	// The killed instance's leases: forwarded under its lease by whoever
	// got its tokens, or freed by a take-over past the grace.
	var leasedLate []time.Duration
	for id := range leased {
		if as := rep.arrivals[id]; len(as) > 0 {
			leasedLate = append(leasedLate, as[0].At.Sub(due[id]))
		}
	}
	tookOver := 0
	for _, b := range insts {
		tookOver += strings.Count(b.Stderr(), "took over the leases of instances that stopped")
	}
	unexplained := 0
	for _, id := range rep.dupIDs {
		as := rep.arrivals[id]
		if vlog.forwarded[id] > vlog.removed[id] {
			continue
		}
		if as[1].At.Sub(due[id]) >= grace {
			continue
		}
		unexplained++
		if unexplained <= 10 {
			var at []string
			for _, a := range as {
				at = append(at, a.At.Format("15:04:05.000"))
			}
			t.Errorf("DUPLICATE NOT EXPLAINED: %s due %s arrived at %s", id, due[id].Format("15:04:05.000"), strings.Join(at, ", "))
		}
	}
	t.Logf("FIGURES: %d messages: %d lost, %d early, %d duplicate deliveries (%d unexplained); latest first arrival %s after its due time; due in the 10 s after the kill: %d, latest %s; the killed instance's leases at the kill: %d, latest %s; take-over passes that freed leases: %d",
		len(due), rep.lost, rep.early, rep.dups, unexplained, late.Round(time.Millisecond), len(afterKill), maxDur(afterKill).Round(time.Millisecond),
		len(leased), maxDur(leasedLate).Round(time.Millisecond), tookOver)

	// The survivors judged the killed and the stopped instance gone: no
	// row of theirs is left in the instances table once they hold nothing.
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		left = pg.instances(t)
		if !slices.Contains(left, owners[0]) && !slices.Contains(left, owners[1]) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if slices.Contains(left, owners[0]) || slices.Contains(left, owners[1]) {
		t.Errorf("instances still registered after the kill and the stop: %q (owners %q)", left, owners)
	}
	if !slices.Contains(left, owners[2]) {
		t.Errorf("the running instance %s is not registered: %q", owners[2], left)
	}
	total := 0
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, total = pg.rows(t, 0); total == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if total != 0 {
		t.Errorf("the store's table holds %d rows at the end, want 0", total)
	}
	stalled.Stop()
}

func maxDur(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// instances are the owners registered in the schema's instances table.
func (p *pgTest) instances(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := p.conn.Query(ctx, `SELECT owner FROM `+p.table("instances")+` ORDER BY owner`)
	if err != nil {
		t.Fatalf("read %s: %v", p.table("instances"), err)
	}
	var out []string
	var o string
	if _, err := pgx.ForEachRow(rs, []any{&o}, func() error { out = append(out, o); return nil }); err != nil {
		t.Fatalf("read %s: %v", p.table("instances"), err)
	}
	return out
}
