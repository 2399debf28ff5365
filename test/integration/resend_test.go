package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/confirmed"
	"github.com/delaybridge/delaybridge/internal/nsbendpoint"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/wire"
	"github.com/delaybridge/delaybridge/wire/nsbdelay"
)

// Sends that reuse an id (docs/contract.md §2.4): a client sends its
// message again the moment it arrives, with the same id, as NServiceBus's
// recoverability does with a delayed retry of a handler that failed fast,
// a saga that sets its timeout again, a Rebus handler deferring again, a
// MassTransit token scheduled again, a plugin user re-publishing. Each of
// those sends reaches the bridge while the previous one is being
// forwarded, or just after, before its removal is committed; each must be
// delivered, once, never early. Every intake at once, through one bridge
// (bbolt) and through two sharing PostgreSQL.

const (
	resendIDs    = 40 // per intake
	resendRounds = 3  // the first send and two re-sends
)

// TestResendsOfAnIDAreDelivered runs the loop with bbolt, then with two
// instances on PostgreSQL, each in a virtual host of its own: the
// NServiceBus delay levels and MassTransit's message-type exchanges are
// names every endpoint of a vhost shares.
func TestResendsOfAnIDAreDelivered(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	t.Run("bbolt", func(t *testing.T) {
		h := newResendHarness(t)
		h.start(func(env map[string]string) { h.bridges = append(h.bridges, startBridge(t, env)) }, nil)
		h.run(t)
	})
	t.Run("postgres", func(t *testing.T) {
		pg := requirePostgres(t)
		h := newResendHarness(t)
		h.start(func(env map[string]string) {
			for range 2 {
				h.bridges = append(h.bridges, startBridge(t, env))
			}
		}, pg)
		h.run(t)
	})
}

// resendCase is one intake and the way its clients send a message again.
type resendCase struct {
	name  string
	queue string // where it arrives
	// send publishes send r (0, 1, …) of message i and returns when it is
	// due at the earliest.
	send func(p *confirmed.Publisher, i, r int) (time.Time, error)
}

type resendHarness struct {
	t       *testing.T
	url     string // of the test's vhost
	conn    *amqp.Connection
	ep      string
	bridges []*bridgeProc
	cases   []resendCase
}

func newResendHarness(t *testing.T) *resendHarness {
	vhostURL, _ := testenv.Vhost(t)
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatalf("dial the test's vhost: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &resendHarness{t: t, url: vhostURL, conn: conn, ep: uniqueEndpoint(t)}
}

// start declares the intakes' entities as their frameworks do, starts the
// bridges through startBridges (with every intake on; pg: on PostgreSQL),
// and builds the cases.
func (h *resendHarness) start(startBridges func(env map[string]string), pg *pgTest) {
	t, conn, ep := h.t, h.conn, h.ep
	install(t, conn, nsbdelay.V2)
	install(t, conn, nsbdelay.V1)
	rebusQ, rebusX, mtQ, dx := ep+".rebus", ep+".RebusDirect", ep+".quartz", ep+".dx"
	env := map[string]string{
		"DELAYBRIDGE_AMQP_URL": h.url, "DELAYBRIDGE_ENDPOINT": ep, "DELAYBRIDGE_POLL_INTERVAL": "100ms",
		"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true",
		"DELAYBRIDGE_REBUS_QUEUE":       rebusQ, "DELAYBRIDGE_REBUS_DIRECT_EXCHANGE": rebusX,
		"DELAYBRIDGE_MASSTRANSIT_QUEUE": mtQ,
		"DELAYBRIDGE_DELAYED_EXCHANGES": dx + ":direct",
	}
	if pg != nil {
		env, _, _ = pg.sharedEnv(t, env)
		env["DELAYBRIDGE_ENDPOINT"], env["DELAYBRIDGE_AMQP_URL"] = ep, h.url
		env["DELAYBRIDGE_ERROR_QUEUE"] = ep + ".error"
	}
	startBridges(env)
	waitConsumed(t, conn, nsbdelay.V2)
	waitConsumed(t, conn, nsbdelay.V1)

	dest := func(name string) string {
		q := ep + "." + name
		declareQueue(t, conn, q)
		return q
	}
	timeouts := wire.TimeoutsQueue(ep)
	// E.Timeouts, x-delay: the very same message again (id, headers, body).
	xdelay := dest("x-delay")
	// E.Timeouts, x-due-at: set again for a later time.
	xdue := dest("x-due-at")
	// NServiceBus's timeout manager: a second-level retry, to E.Timeouts.
	tm := dest("nsb-tm")
	// NServiceBus native delays: a delayed retry, through each chain.
	v2, v1 := dest("nsb-v2"), dest("nsb-v1")
	for c, q := range map[nsbdelay.Chain]string{nsbdelay.V2: v2, nsbdelay.V1: v1} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := nsbendpoint.Bind(ch, c, nsbendpoint.Direct, q); err != nil {
			t.Fatal(err)
		}
		_ = ch.Close()
	}
	// Rebus: the same message deferred again (Defer in its handler).
	rebus := dest("rebus-dest")
	bindQueue(t, conn, rebus, rebus, rebusX)
	// MassTransit: the token scheduled again when it fired.
	billing := dest("billing")
	declareExchange(t, conn, billing, amqp.ExchangeFanout)
	bindQueue(t, conn, billing, "", billing)
	// A delayed exchange: the very same message published again.
	dxq := dest("dx")
	bindQueue(t, conn, dxq, "k", dx+".route")

	id := func(c string, i int) string { return fmt.Sprintf("%s-%s-%03d", ep, c, i) }
	later := func(d time.Duration) time.Time { return time.Now().Add(d) }
	h.cases = []resendCase{
		{"x-delay", xdelay, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			due := later(500 * time.Millisecond)
			return due, p.Publish("", timeouts, amqp.Publishing{MessageId: id("xd", i), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{wire.HeaderDestination: xdelay, wire.HeaderDelay: int32(500)}, Body: []byte("again")})
		}},
		{"x-due-at", xdue, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			due := later(500 * time.Millisecond)
			return due, p.Publish("", timeouts, amqp.Publishing{MessageId: id("xa", i), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{wire.HeaderDestination: xdue, wire.HeaderDueAt: due.UTC().Format(time.RFC3339Nano)},
				Body:    []byte("re-armed")})
		}},
		{"nsb-timeout-manager", tm, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			expire, due := nsbExpire(later(500 * time.Millisecond))
			mid := id("tm", i)
			return due, p.Publish("", timeouts, amqp.Publishing{MessageId: mid, DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{wire.HeaderNSBExpire: expire, wire.HeaderNSBDestination: tm, wire.HeaderNSBMessageID: mid,
					"NServiceBus.Retries": strconv.Itoa(r), "NServiceBus.Retries.Timestamp": wire.FormatNSBTime(time.Now())},
				Body: []byte(`{"OrderId":1}`)})
		}},
		h.nsbNative("nsb-v2", nsbdelay.V2, v2, func(i int) string { return id("v2", i) }),
		h.nsbNative("nsb-v1", nsbdelay.V1, v1, func(i int) string { return id("v1", i) }),
		{"rebus", rebus, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			msg, due := rebusDeferred(id("rb", i), rebus, later(500*time.Millisecond), strconv.Itoa(r+1))
			return due, p.Publish(rebusX, rebusQ, msg)
		}},
		{"masstransit", billing, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			token := fmt.Sprintf("9f1c2a7e-4b3d-4e8f-a1c2-%012d", i)
			at := later(500 * time.Millisecond)
			msg, _, _ := mtSchedule(fmt.Sprintf("3c0b0000-5d3f-0015-2b1e-%06d%06d", i, r), token, "queue:"+billing, at, `{"invoiceId":1}`)
			return at.Truncate(100), p.Publish(mtQ, "", msg)
		}},
		{"delayed-exchange", dxq, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
			due := later(500 * time.Millisecond)
			return due, p.Publish(dx, "k", amqp.Publishing{MessageId: id("dx", i), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{wire.HeaderDelay: int32(500)}, Body: []byte("again")})
		}},
	}
}

// nsbNative is the case of chain c: a delayed retry (NServiceBus.Retries
// counted up, its timestamp now, a delay of 1 s) of the message the
// endpoint's handler just failed.
func (h *resendHarness) nsbNative(name string, c nsbdelay.Chain, q string, id func(int) string) resendCase {
	var mu sync.Mutex
	sent := map[int]time.Time{} // each message's time sent, which its retries keep
	return resendCase{name, q, func(p *confirmed.Publisher, i, r int) (time.Time, error) {
		now := time.Now()
		mu.Lock()
		if r == 0 {
			sent[i] = now
		}
		s := nsbMessage(id(i), q, 1, sent[i])
		mu.Unlock()
		if r > 0 {
			s.Retried = now
			s.Headers = map[string]string{"NServiceBus.Retries": strconv.Itoa(r)}
		}
		key, level := s.Key()
		return now.Truncate(time.Microsecond).Add(time.Second), p.Publish(c.Level(level), key, s.Publishing())
	}}
}

// run sends the first send of every message of every case, and each next
// one the moment the previous one arrives; then checks that each case got
// every send of every message once, none early, and nothing else.
func (h *resendHarness) run(t *testing.T) {
	type got struct {
		due []time.Time // of each send, in order
		at  []time.Time // of each arrival, in order
	}
	var (
		mu      sync.Mutex
		arrived = map[string]map[string]*got{} // case, message id
		total   int
		errs    []string
		done    = make(chan struct{})
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := make([]string, resendIDs)
	for i := range resendIDs {
		keys[i] = strconv.Itoa(i)
	}
	for _, c := range h.cases { // all of it before any consumer reads it
		arrived[c.name] = map[string]*got{}
		for _, k := range keys {
			arrived[c.name][k] = &got{}
		}
	}
	var wg sync.WaitGroup
	for _, c := range h.cases {
		p := confirmedPublisher(t, h.conn)
		ch, err := h.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume(c.queue, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		send := func(i, r int, key string) {
			due, err := c.send(p, i, r)
			if err != nil {
				fail("%s: send %d of message %d: %v", c.name, r, i, err)
				return
			}
			mu.Lock()
			arrived[c.name][key].due = append(arrived[c.name][key].due, due)
			mu.Unlock()
		}
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case d, ok := <-ds:
					if !ok {
						return
					}
					at := time.Now()
					i, ok := resendIndex(d.MessageId)
					if !ok || i >= resendIDs {
						fail("%s: a message not sent here: id %q", c.name, d.MessageId)
						continue
					}
					mu.Lock()
					g := arrived[c.name][keys[i]]
					g.at = append(g.at, at)
					r := len(g.at)
					total++
					if total == len(h.cases)*resendIDs*resendRounds {
						close(done)
					}
					mu.Unlock()
					if r < resendRounds {
						send(i, r, keys[i])
					}
				}
			}
		})
		for i := range resendIDs {
			send(i, 0, keys[i])
		}
	}
	select {
	case <-done:
	case <-time.After(livenessBound):
		t.Errorf("not every send arrived within %s", livenessBound)
	}
	time.Sleep(quietPeriod) // a duplicate would come now
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, e := range errs {
		t.Error(e)
	}
	for _, c := range h.cases {
		lost, extra, early := 0, 0, 0
		for _, k := range slices.Sorted(maps.Keys(arrived[c.name])) {
			g := arrived[c.name][k]
			switch {
			case len(g.at) < resendRounds:
				lost += resendRounds - len(g.at)
			case len(g.at) > resendRounds:
				extra += len(g.at) - resendRounds
			}
			for r := range min(len(g.at), len(g.due)) {
				if g.at[r].Round(0).Before(g.due[r].Round(0)) { // wall clocks, as the bridge keeps due times
					early++
					t.Errorf("%s: message %s, send %d arrived %s EARLY", c.name, k, r, g.due[r].Sub(g.at[r]))
				}
			}
		}
		if lost > 0 || extra > 0 {
			t.Errorf("%s: %d sends of %d lost, %d delivered twice", c.name, lost, resendIDs*resendRounds, extra)
		} else {
			t.Logf("%s: %d messages, each sent %d times the moment it arrived: every send delivered once, %d early",
				c.name, resendIDs, resendRounds, early)
		}
	}
	for _, b := range h.bridges {
		if strings.Contains(b.Stderr(), `"reason":"duplicate"`) {
			t.Errorf("bridge %s dropped a send as a duplicate", b.HTTPAddr)
		}
	}
}

// resendIndex reads the message number of an arrival: the last digits of
// its message id, or for MassTransit (whose forwards carry the
// ScheduleMessage's id) those of its id's second-last group.
func resendIndex(id string) (int, bool) {
	if strings.HasPrefix(id, "3c0b0000-5d3f-0015-2b1e-") {
		n, err := strconv.Atoi(id[len(id)-12 : len(id)-6])
		return n, err == nil
	}
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	return n, err == nil
}
