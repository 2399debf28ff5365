package integration

import (
	"fmt"
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
	endpoint := uniqueEndpoint(t)
	errorQ := endpoint + ".error"
	shared := map[string]string{
		"DELAYBRIDGE_ENDPOINT":        endpoint,
		"DELAYBRIDGE_ERROR_QUEUE":     errorQ,
		"DELAYBRIDGE_STORE":           "postgres",
		"DELAYBRIDGE_POSTGRES_URL":    pg.URL,
		"DELAYBRIDGE_POSTGRES_SCHEMA": pg.Schema,
	}
	// Registered before the processes' own cleanups: runs after they are gone.
	deleteQueuesOnCleanup(t, endpoint+".Timeouts", endpoint+".TimeoutsDispatcher", errorQ)
	insts := []*bridgeProc{execBridge(t, bridgeEnv(t, shared)), execBridge(t, bridgeEnv(t, shared))}
	for _, b := range insts {
		b.waitReady(30 * time.Second)
	}
	conn := dial(t)
	dest := endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	pub := newPublisher(t, conn)

	// Due well after the last cancel is published: a cancel that reaches a
	// message already being forwarded comes too late, by design.
	due := time.Now().Add(10 * time.Second)
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
	if left := time.Until(due); left < 3*time.Second {
		t.Fatalf("publishing took until %s before the messages were due: the test shows nothing", left)
	}
	controlDue := due.Add(time.Second)
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
