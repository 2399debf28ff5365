package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// NServiceBus native delays (DELAYBRIDGE_NSB_NATIVE_DELAYS, docs/contract.md
// §2.9): the bridge consumes the delay-level queues that NServiceBus
// endpoints' installers declare, and delivers through the chain's delivery
// exchange. The chains are declared and the messages sent exactly as the
// transport does (internal/nsbendpoint).

// TestNSBNative runs the tests of native delays one after the other, as the
// only user of the transport's names on the broker: it waits for
// nsbendpoint's lock, and each test starts with neither chain declared.
func TestNSBNative(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	lockNSBNames(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Delivers", testNSBNativeDelivers},
		{"NeverBeforeTheChainCould", testNSBNativeNeverBeforeTheChainCould},
		{"ListAndCancel", testNSBNativeListAndCancel},
		{"V1", testNSBNativeV1},
		{"WaitsForTheLevelQueues", testNSBNativeWaitsForTheLevelQueues},
		{"FailSafe", testNSBNativeFailSafe},
		{"DrainsPendingDelays", testNSBNativeDrainsPendingDelays},
		{"BadInputGoesToTheErrorQueue", testNSBNativeBadInputGoesToTheErrorQueue},
	} {
		t.Run(tc.name, tc.run)
	}
}

// lockNSBNames waits until t holds nsbendpoint.LockQueue, for the rest of
// t, and checks that a second holder is refused.
func lockNSBNames(t *testing.T) {
	t.Helper()
	dialLock := func() (*amqp.Connection, error) {
		return amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	lock, err := nsbendpoint.Lock(ctx, dialLock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Close() })
	if c, err := nsbendpoint.TryLock(dialLock); !errors.Is(err, nsbendpoint.ErrLocked) {
		if c != nil {
			_ = c.Close()
		}
		t.Fatalf("a second holder of the lock got %v, want ErrLocked", err)
	}
}

// nsbClean removes both chains (what a test before may have left), and
// again when t ends. It returns a connection for the test.
func nsbClean(t *testing.T) *amqp.Connection {
	t.Helper()
	conn := dial(t)
	uninstall := func() {
		for _, c := range []nsbdelay.Chain{nsbdelay.V2, nsbdelay.V1} {
			_ = nsbendpoint.Uninstall(conn, c) // what does not exist is no error to the broker
		}
	}
	uninstall()
	t.Cleanup(uninstall)
	return conn
}

// install declares chain c as an endpoint's installer does.
func install(t *testing.T, conn *amqp.Connection, c nsbdelay.Chain) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := nsbendpoint.Install(ch, c); err != nil {
		t.Fatalf("install the %s chain: %v", c.Version, err)
	}
}

// nsbDestination declares queue q, hangs it off c's delivery exchange as an
// endpoint of topology topo does, and consumes it.
func nsbDestination(t *testing.T, conn *amqp.Connection, c nsbdelay.Chain, topo nsbendpoint.Topology, q string) *consumer {
	t.Helper()
	declareQueue(t, conn, q)
	if topo == nsbendpoint.Conventional {
		deleteExchangesOnCleanup(t, q)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := nsbendpoint.Bind(ch, c, topo, q); err != nil {
		t.Fatalf("bind %s (%s): %v", q, topo, err)
	}
	return consume(t, conn, q)
}

// startNSBNative removes both chains (nsbClean), installs chain c and
// starts a bridge with DELAYBRIDGE_NSB_NATIVE_DELAYS and extra settings; it
// returns once the bridge consumes c's level queues.
func startNSBNative(t *testing.T, c nsbdelay.Chain, extra map[string]string) (*amqp.Connection, *bridgeProc) {
	t.Helper()
	conn := nsbClean(t)
	install(t, conn, c)
	env := map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true"}
	maps.Copy(env, extra)
	b := startBridge(t, env)
	waitConsumed(t, conn, c)
	return conn, b
}

// waitConsumed waits until every level queue of c has a consumer: the bridge
// took them on.
func waitConsumed(t *testing.T, conn *amqp.Connection, c nsbdelay.Chain) {
	t.Helper()
	deadline := time.Now().Add(livenessBound + 20*time.Second)
	for k := 0; k < nsbdelay.Levels; k++ {
		for {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			q, err := ch.QueueDeclarePassive(c.Level(k), true, false, false, false, nil)
			_ = ch.Close()
			if err != nil {
				t.Fatalf("inspect %s: %v", c.Level(k), err)
			}
			if q.Consumers > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has no consumer", c.Level(k))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// nsbPublish sends s into chain c as the transport does, and returns when
// the broker confirmed it.
func nsbPublish(t *testing.T, pub *publisher, c nsbdelay.Chain, s nsbendpoint.Send) {
	t.Helper()
	key, level := s.Key()
	pub.PublishTo(c.Level(level), key, s.Publishing())
}

// nsbMessage is a message an NServiceBus 9 endpoint sends with
// DelayDeliveryWith(delay) at sent: NServiceBus.DeliverAt is the time sent
// plus the delay.
func nsbMessage(id, address string, delay int32, sent time.Time) nsbendpoint.Send {
	return nsbendpoint.Send{MessageID: id, Address: address, Delay: delay, TimeSent: sent,
		DeliverAt: sent.Add(time.Duration(delay) * time.Second), Body: []byte(`{"OrderId":"` + id + `"}`), SeqNo: 3}
}

// checkAsSent asserts that d is s exactly as the endpoint sent it: body,
// properties, every header and its AMQP type, through c's delivery exchange
// with the routing key it was sent with. Anything the chain adds (x-death)
// is absent: the bridge, not the chain, delivered it.
func checkAsSent(t *testing.T, d arrival, c nsbdelay.Chain, s nsbendpoint.Send) {
	t.Helper()
	want := s.Publishing()
	key, _ := s.Key()
	if d.Exchange != c.Delivery || d.RoutingKey != key {
		t.Errorf("%s arrived through %q with key %q, want %q with %q", s.MessageID, d.Exchange, d.RoutingKey, c.Delivery, key)
	}
	if string(d.Body) != string(want.Body) || d.MessageId != want.MessageId || d.CorrelationId != want.CorrelationId ||
		d.Type != want.Type || d.ContentType != want.ContentType || d.ReplyTo != want.ReplyTo || d.DeliveryMode != want.DeliveryMode ||
		d.Expiration != "" || !d.Timestamp.IsZero() || d.AppId != "" || d.UserId != "" || d.Priority != 0 {
		t.Errorf("%s: body or properties differ from what was sent: %+v", s.MessageID, d.Delivery)
	}
	if diff := cmp.Diff(want.Headers, d.Headers); diff != "" {
		t.Errorf("%s: headers (-sent +received):\n%s", s.MessageID, diff)
	}
}

// An NServiceBus message at any level reaches its destination once, in both
// routing topologies, as it was sent, never before its time sent plus its
// delay; and it was the bridge that delivered it: no x-death.
func testNSBNativeDelivers(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V2, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	dests := map[nsbendpoint.Topology]*consumer{}
	for _, topo := range []nsbendpoint.Topology{nsbendpoint.Conventional, nsbendpoint.Direct} {
		dests[topo] = nsbDestination(t, conn, nsbdelay.V2, topo, b.Endpoint+"."+topo.String())
	}
	pub := newPublisher(t, conn)
	errs := consume(t, conn, b.ErrorQ)
	sent := map[string]nsbendpoint.Send{}
	for topo := range dests {
		for _, delay := range []int32{1, 2, 3, 5} { // levels 0, 1, 1 (2+1), 2 (4+1)
			s := nsbMessage(fmt.Sprintf("%s-%d", topo, delay), b.Endpoint+"."+topo.String(), delay, time.Now())
			s.SeqNo = int64(len(sent) + 1)
			nsbPublish(t, pub, nsbdelay.V2, s)
			sent[s.MessageID] = s
		}
	}
	for topo, got := range dests {
		got.WaitFor(4, livenessBound)
		for id, as := range byMessageID(got.Quiet(quietPeriod)) {
			s, ok := sent[id]
			if !ok || !strings.HasPrefix(id, topo.String()) || len(as) != 1 {
				t.Errorf("%s: %d deliveries of %q", topo, len(as), id)
				continue
			}
			if due := s.TimeSent.Truncate(time.Microsecond).Add(time.Duration(s.Delay) * time.Second); as[0].At.Before(due) {
				t.Errorf("%s delivered %s EARLY", id, due.Sub(as[0].At))
			}
			checkAsSent(t, as[0], nsbdelay.V2, s)
		}
	}
	if n := errs.Count(); n != 0 {
		t.Errorf("%d messages on the error queue", n)
	}
	for k := 0; k < nsbdelay.Levels; k++ {
		if n := queueDepth(t, conn, nsbdelay.V2.Level(k)); n != 0 {
			t.Errorf("%s holds %d messages", nsbdelay.V2.Level(k), n)
		}
	}
}

// A message is never delivered before the chain itself could deliver it,
// whatever its NServiceBus.TimeSent says: a handler that sent a message
// with DelayDeliveryWith(4 s) and worked 3 s more dispatches it 3 s after
// its time sent, and the chain delivers it 4 s after the publish. So does
// the bridge, with no NServiceBus.DeliverAt (NServiceBus 7.0 to 7.6) and
// with a delayed retry's stale one (the failed message's, an hour old);
// with a DeliverAt of its own (DoNotDeliverBefore, NServiceBus 7.7 and
// later) it is delivered at that time, never before.
func testNSBNativeNeverBeforeTheChainCould(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V2, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	dest := b.Endpoint + ".dst"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Direct, dest)
	pub := newPublisher(t, conn)
	now := time.Now()
	late := nsbMessage("nsb-handler-7.6", dest, 4, now.Add(-3*time.Second))
	late.DeliverAt = time.Time{}
	retry := nsbMessage("nsb-retry", dest, 3, now.Add(-time.Hour))
	retry.DeliverAt, retry.Retried = now.Add(-time.Hour+time.Minute), now
	asked := nsbMessage("nsb-handler-9", dest, 3, now.Add(-3*time.Second))
	asked.DeliverAt = now.Add(3 * time.Second)
	notBefore := map[string]time.Time{}
	for _, s := range []nsbendpoint.Send{late, retry, asked} {
		published := time.Now()
		nsbPublish(t, pub, nsbdelay.V2, s)
		notBefore[s.MessageID] = published.Add(time.Duration(s.Delay) * time.Second)
	}
	notBefore[asked.MessageID] = asked.DeliverAt.Truncate(time.Microsecond)
	got.WaitFor(3, livenessBound)
	for id, as := range byMessageID(got.Quiet(quietPeriod)) {
		if len(as) != 1 {
			t.Errorf("%s: %d deliveries", id, len(as))
			continue
		}
		if as[0].At.Before(notBefore[id]) {
			t.Errorf("%s delivered %s EARLY: before the chain could", id, notBefore[id].Sub(as[0].At))
		}
	}
}

// nsbRow is a row of the admin API's list.
type nsbRow struct {
	ID         string    `json:"id"`
	Exchange   string    `json:"exchange"`
	RoutingKey string    `json:"routing_key"`
	DueAt      time.Time `json:"due_at"`
}

// waitListed waits until the admin API lists id and returns its row.
func waitListed(t *testing.T, b *bridgeProc, id string) nsbRow {
	t.Helper()
	deadline := time.Now().Add(livenessBound)
	for {
		var page struct{ Timeouts []nsbRow }
		out := mustCLI(t, b, "ls", "--json", "--all")
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("ls --json: %v: %s", err, out)
		}
		for _, r := range page.Timeouts {
			if r.ID == id {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listed: %s", id, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A pending NServiceBus message is a row like any other: listed with its
// delivery exchange, routing key and due time (its NServiceBus.DeliverAt,
// the time sent plus the delay, to the microsecond), on the status page,
// and cancelled by its NServiceBus message id, over the admin API or AMQP.
// The chain holds no copy.
func testNSBNativeListAndCancel(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V2, map[string]string{"DELAYBRIDGE_ADMIN_TOKEN": adminToken,
		"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	dest := b.Endpoint + ".dst"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Direct, dest)
	pub := newPublisher(t, conn)
	sent := time.Now().Add(-1500 * time.Millisecond)
	one, two := nsbMessage("nsb-list-1", dest, 3600, sent), nsbMessage("nsb-list-2", dest, 7200, sent)
	nsbPublish(t, pub, nsbdelay.V2, one)
	nsbPublish(t, pub, nsbdelay.V2, two)

	row := waitListed(t, b, "nsb-list-1")
	key, _ := one.Key()
	if want := sent.Truncate(time.Microsecond).Add(time.Hour); row.Exchange != nsbdelay.V2.Delivery || row.RoutingKey != key || !row.DueAt.Equal(want) {
		t.Errorf("listed %+v, want exchange %q key %q due %v", row, nsbdelay.V2.Delivery, key, want)
	}
	waitListed(t, b, "nsb-list-2")
	if page := getStatusPage(t, b); !strings.Contains(page, "nsb-list-1") || !strings.Contains(page, nsbdelay.V2.Delivery) {
		t.Errorf("the status page does not show nsb-list-1 and its exchange")
	}
	for k := 0; k < nsbdelay.Levels; k++ {
		if n := queueDepth(t, conn, nsbdelay.V2.Level(k)); n != 0 {
			t.Errorf("%s holds %d messages: the chain kept a copy", nsbdelay.V2.Level(k), n)
		}
	}

	mustCLI(t, b, "cancel", "nsb-list-1")
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{Headers: amqp.Table{"x-delaybridge-cancel": "nsb-list-2"}})
	deadline := time.Now().Add(livenessBound)
	for len(listIDs(t, b)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still listed after the cancels: %v", listIDs(t, b))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := got.Count(); n != 0 {
		t.Errorf("%d deliveries of cancelled messages", n)
	}
}

// The v1 chain's level queues (transport 6 and before) are consumed too, and
// their messages delivered through the v1 chain's delivery exchange, where
// endpoints of that transport bind.
func testNSBNativeV1(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V1, map[string]string{"DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	dest := b.Endpoint + ".v1"
	got := nsbDestination(t, conn, nsbdelay.V1, nsbendpoint.Conventional, dest)
	sendOne(t, conn, got, nsbdelay.V1, nsbMessage("nsb-v1", dest, 3, time.Now()))
}

// sendOne sends s into chain c and checks that got receives it once, as
// sent, not before its time sent plus its delay.
func sendOne(t *testing.T, conn *amqp.Connection, got *consumer, c nsbdelay.Chain, s nsbendpoint.Send) {
	t.Helper()
	nsbPublish(t, newPublisher(t, conn), c, s)
	as := byMessageID(got.WaitFor(1, livenessBound))[s.MessageID]
	if len(as) != 1 {
		t.Fatalf("%d deliveries of %s", len(as), s.MessageID)
	}
	if due := s.TimeSent.Truncate(time.Microsecond).Add(time.Duration(s.Delay) * time.Second); as[0].At.Before(due) {
		t.Errorf("%s delivered %s EARLY", s.MessageID, due.Sub(as[0].At))
	}
	checkAsSent(t, as[0], c, s)
}

// Installers may run after the bridge started: it waits for the level
// queues (one line in its log per chain, not one per check) and consumes
// them once they appear.
func testNSBNativeWaitsForTheLevelQueues(t *testing.T) {
	conn := nsbClean(t)
	b := startBridge(t, map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true", "DELAYBRIDGE_POLL_INTERVAL": "100ms"})
	waitLog(t, b, nsbdelay.V2.Level(0), "waiting for the queue")
	waitLog(t, b, nsbdelay.V1.Level(0), "waiting for the queue")
	time.Sleep(2 * time.Second) // a few checks find nothing
	install(t, conn, nsbdelay.V2)
	waitConsumed(t, conn, nsbdelay.V2)
	dest := b.Endpoint + ".late"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Direct, dest)
	sendOne(t, conn, got, nsbdelay.V2, nsbMessage("nsb-late", dest, 2, time.Now()))
	logs := b.Stderr()
	for _, q := range []string{nsbdelay.V2.Level(0), nsbdelay.V1.Level(0)} {
		if n := logtest.CountLines(logs, `"level":"info"`, q, "waiting for the queue"); n != 1 {
			t.Errorf("%d info lines waiting for %s, want 1", n, q)
		}
	}
	if n := logtest.CountLines(logs, nsbdelay.V2.Level(0), "queue found"); n != 1 {
		t.Errorf("%d lines saying %s was found, want 1", n, nsbdelay.V2.Level(0))
	}
	if n := logtest.CountLines(logs, `"level":"warn"`); n != 0 {
		t.Errorf("%d warnings in the log", n)
	}
}

// waitLog waits until the bridge logged a line holding every one of parts.
func waitLog(t *testing.T, b *bridgeProc, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(livenessBound)
	for logtest.CountLines(b.Stderr(), parts...) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q", parts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With the bridge down the chain works by itself: messages sent while it is
// stopped reach their destination through the TTL chain (x-death shows it),
// each once, not before their delay.
func testNSBNativeFailSafe(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V2, nil)
	b.Stop()
	dest := b.Endpoint + ".failsafe"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Conventional, dest)
	pub := newPublisher(t, conn)
	sends := []nsbendpoint.Send{nsbMessage("nsb-fs-1", dest, 1, time.Now()), nsbMessage("nsb-fs-3", dest, 3, time.Now())}
	published := map[string]time.Time{}
	for _, s := range sends {
		published[s.MessageID] = time.Now()
		nsbPublish(t, pub, nsbdelay.V2, s)
	}
	got.WaitFor(len(sends), livenessBound)
	byID := byMessageID(got.Quiet(quietPeriod))
	for _, s := range sends {
		as := byID[s.MessageID]
		if len(as) != 1 {
			t.Errorf("%s: %d deliveries", s.MessageID, len(as))
			continue
		}
		if due := published[s.MessageID].Add(time.Duration(s.Delay) * time.Second); as[0].At.Before(due) {
			t.Errorf("%s delivered %s before its delay ran out", s.MessageID, due.Sub(as[0].At))
		}
		if _, ok := as[0].Headers["x-death"]; !ok {
			t.Errorf("%s has no x-death: the chain did not deliver it", s.MessageID)
		}
		key, _ := s.Key()
		if as[0].RoutingKey != key || string(as[0].Body) != string(s.Body) {
			t.Errorf("%s arrived with key %q body %q", s.MessageID, as[0].RoutingKey, as[0].Body)
		}
	}
}

// Messages already in the level queues when the bridge starts are taken in
// (the migration of pending delays): one still at its first level keeps its
// due time, its NServiceBus.DeliverAt (the time sent plus the delay); one
// the chain moved down a level while the bridge was down is due when the
// chain would deliver it. Neither is delivered early, and both come from the
// bridge (no x-death).
func testNSBNativeDrainsPendingDelays(t *testing.T) {
	conn := nsbClean(t)
	install(t, conn, nsbdelay.V2)
	ep := uniqueEndpoint(t)
	dest := ep + ".dst"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Direct, dest)
	pub := newPublisher(t, conn)
	// 24 s = 16 + 8: at level 4 for 16 s, then at level 3. 33 s = 32 + 1:
	// still at level 5 when the bridge starts.
	moved, waiting := nsbMessage("nsb-moved", dest, 24, time.Now()), nsbMessage("nsb-waiting", dest, 33, time.Now())
	nsbPublish(t, pub, nsbdelay.V2, moved)
	nsbPublish(t, pub, nsbdelay.V2, waiting)
	deadline := time.Now().Add(16*time.Second + livenessBound)
	for queueDepth(t, conn, nsbdelay.V2.Level(3)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("nsb-moved never reached %s", nsbdelay.V2.Level(3))
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := startBridge(t, map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true", "DELAYBRIDGE_ADMIN_TOKEN": adminToken,
		"DELAYBRIDGE_POLL_INTERVAL": "100ms", "DELAYBRIDGE_ENDPOINT": ep})

	row := waitListed(t, b, "nsb-waiting")
	if want := waiting.TimeSent.Truncate(time.Microsecond).Add(33 * time.Second); !row.DueAt.Equal(want) {
		t.Errorf("nsb-waiting due %v, want %v (time sent + 33 s)", row.DueAt, want)
	}
	// Dead-lettered at level 4's expiry, 16 s after it was published: due
	// the end of that (whole) second plus 8 s, so up to a second late and
	// never early.
	row = waitListed(t, b, "nsb-moved")
	if earliest := moved.TimeSent.Add(24 * time.Second); row.DueAt.Before(earliest) || row.DueAt.After(earliest.Add(livenessBound)) {
		t.Errorf("nsb-moved due %v, want from %v to %v later", row.DueAt, earliest, livenessBound)
	}
	got.WaitFor(2, 33*time.Second+livenessBound)
	byID := byMessageID(got.Quiet(quietPeriod))
	for _, s := range []nsbendpoint.Send{moved, waiting} {
		as := byID[s.MessageID]
		if len(as) != 1 {
			t.Errorf("%s: %d deliveries", s.MessageID, len(as))
			continue
		}
		if due := s.TimeSent.Add(time.Duration(s.Delay) * time.Second); as[0].At.Before(due) {
			t.Errorf("%s delivered %s EARLY", s.MessageID, due.Sub(as[0].At))
		}
		checkAsSent(t, as[0], nsbdelay.V2, s)
	}
}

// What no NServiceBus endpoint sends goes to the error queue with the
// reason and the level queue it came from, and leaves the chain (which
// would have delivered the last two within 2 s): a message published
// straight into a level queue (no delay routing key), a time sent in another
// format, a delay that is not a number.
func testNSBNativeBadInputGoesToTheErrorQueue(t *testing.T) {
	conn, b := startNSBNative(t, nsbdelay.V2, nil)
	dest := b.Endpoint + ".dst"
	got := nsbDestination(t, conn, nsbdelay.V2, nsbendpoint.Direct, dest)
	errs := consume(t, conn, b.ErrorQ)
	pub := newPublisher(t, conn)
	before := time.Now()

	raw := nsbMessage("nsb-bad-key", dest, 10, time.Now()).Publishing()
	pub.Publish(nsbdelay.V2.Level(5), raw) // the default exchange: routing key = the queue's name
	iso := nsbMessage("nsb-bad-time", dest, 2, time.Now())
	iso.Headers = map[string]string{nsbdelay.HeaderTimeSent: time.Now().UTC().Format(time.RFC3339)}
	nsbPublish(t, pub, nsbdelay.V2, iso)
	word := nsbMessage("nsb-bad-delay", dest, 2, time.Now())
	msg := word.Publishing()
	msg.Headers[nsbdelay.HeaderDelay] = "ten"
	key, level := word.Key()
	pub.PublishTo(nsbdelay.V2.Level(level), key, msg)

	errs.WaitFor(3, livenessBound)
	copies := byMessageID(errs.Quiet(quietPeriod))
	for id, c := range map[string]struct {
		queue string
		hints []string
	}{
		"nsb-bad-key":   {nsbdelay.V2.Level(5), []string{"not an NServiceBus delay routing key"}},
		"nsb-bad-time":  {nsbdelay.V2.Level(1), []string{nsbdelay.HeaderTimeSent + " " + `"`}},
		"nsb-bad-delay": {nsbdelay.V2.Level(1), []string{nsbdelay.HeaderDelay + ` "ten"`}},
	} {
		as := copies[id]
		if len(as) != 1 {
			t.Errorf("%s: %d error copies", id, len(as))
			continue
		}
		checkErrorHeaders(t, as[0].Headers, "ingest", 0, c.queue, c.hints, before)
		if string(as[0].Body) != `{"OrderId":"`+id+`"}` {
			t.Errorf("%s: error copy body %q", id, as[0].Body)
		}
	}
	time.Sleep(3 * time.Second) // the chain would have delivered them by now
	for k := 0; k < nsbdelay.Levels; k++ {
		if n := queueDepth(t, conn, nsbdelay.V2.Level(k)); n != 0 {
			t.Errorf("%s holds %d messages", nsbdelay.V2.Level(k), n)
		}
	}
	if n := got.Count(); n != 0 {
		t.Errorf("%d deliveries of refused messages", n)
	}
}
