package integration

import (
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestRedeliveriesAreNotStoredTwice: what the bridge stored and could not
// acknowledge (it was killed, or its connection cut, between the commit and
// the ack) comes back from the broker; each such redelivery finds its send
// pending and is not stored again (docs/contract.md §2.4). The messages are
// due in an hour, so none is being dispatched when its redelivery comes:
// the store must end up with exactly one row per message. The bridges' logs
// must show the redeliveries dropped, so the test saw the window it tests
// (it cuts again, up to 5 times, until they do).
func TestRedeliveriesAreNotStoredTwice(t *testing.T) {
	t.Parallel()
	t.Run("kill -9", func(t *testing.T) {
		t.Parallel()
		b := startBridge(t, map[string]string{"DELAYBRIDGE_LOG_LEVEL": "debug"})
		bridges := []*bridgeProc{b}
		redeliveriesUnstored(t, b.TimeoutsQueue(), b.Endpoint, func() *bridgeProc {
			b := bridges[len(bridges)-1]
			b.KillWhileLogging(300 * time.Millisecond) // blocked between a commit and its ack
			b = b.Restart(nil)
			bridges = append(bridges, b)
			return b
		}, &bridges)
	})
	t.Run("connection lost", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		host := u.Host
		if _, _, err := net.SplitHostPort(host); err != nil {
			host = net.JoinHostPort(host, "5672")
		}
		proxy := startProxy(t, host)
		u.Host = proxy.Addr()
		b := startBridge(t, map[string]string{"DELAYBRIDGE_LOG_LEVEL": "debug", "DELAYBRIDGE_AMQP_URL": u.String()})
		bridges := []*bridgeProc{b}
		redeliveriesUnstored(t, b.TimeoutsQueue(), b.Endpoint, func() *bridgeProc {
			proxy.Refuse() // every connection of the bridge, cut
			time.Sleep(200 * time.Millisecond)
			proxy.Resume() // and it reconnects
			return b
		}, &bridges)
	})
}

// redeliveriesUnstored publishes 3,000 messages due in an hour while cut
// interrupts the bridge's intake (and returns the bridge running after it),
// then checks that each is stored once and that redeliveries were dropped.
func redeliveriesUnstored(t *testing.T, queue, endpoint string, cut func() *bridgeProc, bridges *[]*bridgeProc) {
	const n, batch = 3000, 100
	dest := endpoint + ".dst"
	declareQueue(t, dial(t), dest)
	pub, err := newFaultPublisher("it-redelivery-publisher")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	published := make(chan error, 1)
	go func() {
		_, err := publishWave(pub, queue, []string{dest}, "r-", n, batch, 50*time.Millisecond, time.Hour, time.Hour+time.Second)
		published <- err
	}()
	var b *bridgeProc
	for cuts := 1; ; cuts++ {
		time.Sleep(400 * time.Millisecond) // some stored, more coming
		b = cut()
		if d := droppedRedeliveries(*bridges); d > 0 || cuts == 5 {
			t.Logf("%d cuts; %d redeliveries not stored so far", cuts, d)
			break
		}
	}
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	m := waitMetrics(t, b, livenessBound, "every message taken in", func(m map[string]float64) bool {
		return m["delaybridge_pending"] >= n && queueDepth(t, dial(t), queue) == 0
	})
	time.Sleep(quietPeriod) // a late redelivery would be stored now
	m = scrape(t, b)
	if p := m["delaybridge_pending"]; p != n {
		t.Errorf("the store holds %v messages, want %d: a redelivery was stored again", p, n)
	}
	if d := droppedRedeliveries(*bridges); d == 0 {
		t.Errorf("no redelivery was dropped in 5 cuts: the test did not hit the window between commit and ack")
	} else {
		t.Logf("%d redeliveries of pending sends not stored; %v pending for %d published", d, m["delaybridge_pending"], n)
	}
}

// droppedRedeliveries counts the redelivered messages the bridges did not
// store because their send was pending (ingest's debug line).
func droppedRedeliveries(bs []*bridgeProc) int {
	n := 0
	for _, b := range bs {
		for _, l := range bridgeLogLines(b.Stderr()) {
			if strings.HasPrefix(l.Message, "not stored: a redelivery") && l.Fields["redelivered"] == true {
				n++
			}
		}
	}
	return n
}
