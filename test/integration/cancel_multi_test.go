package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCancelAcrossTwoPostgresInstances: two bridges share one PostgreSQL
// store and consume one E.Timeouts. 1,000 messages are each followed at
// once by their cancel, so a cancel often reaches the instance that has not
// stored its message yet. A cancel applies to what was published before it
// (docs/contract.md §2.5): none of them is delivered, and the store ends
// empty. A control message, due after all of them, shows when they would
// have arrived.
func TestCancelAcrossTwoPostgresInstances(t *testing.T) {
	t.Parallel()
	const n, pairsPerBatch = 1000, 250
	pg := requirePostgres(t)
	shared, endpoint, _ := pg.sharedEnv(t, nil)
	insts := []*bridgeProc{execBridge(t, bridgeEnv(t, shared)), execBridge(t, bridgeEnv(t, shared))}
	for _, b := range insts {
		b.waitReady(30 * time.Second)
	}
	conn := dial(t)
	dest := endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	pub := newPublisher(t, conn)

	// Due in an hour: the test waits until every cancel has been taken in
	// by one instance or the other, however long a loaded machine takes,
	// and then requires the store to be empty. A fixed due time ten seconds
	// out made a slow intake look like lost cancels (a cancel that reaches
	// a message already being forwarded comes too late, by design).
	due := time.Now().Add(time.Hour)
	headers := amqp.Table{"x-destination": dest, "x-due-at": due.UTC().Format(time.RFC3339Nano)}
	for lo := 0; lo < n; lo += pairsPerBatch {
		var msgs []amqp.Publishing
		for i := lo; i < min(lo+pairsPerBatch, n); i++ {
			id := fmt.Sprintf("cancelled-%04d", i)
			msgs = append(msgs,
				amqp.Publishing{MessageId: id, Body: []byte(id), Headers: headers},
				amqp.Publishing{Headers: amqp.Table{"x-delaybridge-cancel": id}})
		}
		pub.PublishAll(endpoint+".Timeouts", msgs)
	}
	// Every cancel is logged once by the instance that took it in: as
	// cancelled, or as finding nothing (its message not stored yet; the
	// tombstone then keeps it from being stored).
	cancels := func() int {
		k := 0
		for _, b := range insts {
			logs := b.Stderr()
			k += strings.Count(logs, `"message":"cancelled over AMQP"`) +
				strings.Count(logs, `"message":"cancel: nothing pending with this id`)
		}
		return k
	}
	deadline := time.Now().Add(3 * time.Minute)
	for cancels() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d cancels taken in after 3 minutes", cancels(), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rows, total := pg.rows(t, 5); total != 0 {
		t.Errorf("%d cancelled messages stored after every cancel was taken in, e.g. %+v", total, rows)
	}
	controlDue := time.Now().Add(time.Second)
	pub.Publish(endpoint+".Timeouts", amqp.Publishing{MessageId: "control", Body: []byte("control"),
		Headers: amqp.Table{"x-destination": dest, "x-due-at": controlDue.UTC().Format(time.RFC3339Nano)}})

	c.WaitUntil(time.Until(controlDue)+30*time.Second, "the control message", func(got []arrival) bool {
		for _, a := range got {
			if a.Delivery.MessageId == "control" {
				return true
			}
		}
		return false
	})
	got := c.Quiet(time.Second)
	if len(got) != 1 {
		t.Errorf("%d of %d cancelled messages were delivered (first: %q)", len(got)-1, n, firstOtherThan(got, "control"))
	}
	if rows, total := pg.rows(t, 5); total != 0 {
		t.Errorf("%d rows left in the store, e.g. %+v", total, rows)
	}
}

func firstOtherThan(got []arrival, id string) string {
	for _, a := range got {
		if a.Delivery.MessageId != id {
			return a.Delivery.MessageId
		}
	}
	return ""
}
