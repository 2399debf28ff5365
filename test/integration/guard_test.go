package integration

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestSecondBboltInstanceRefused: a bbolt file serves one instance. A second
// instance on the same endpoint (with a store of its own) would take the
// first one's dispatcher tokens for rows it does not have and drop them, so
// it must stop at start, before taking in a single message, and say to use
// the PostgreSQL store.
func TestSecondBboltInstanceRefused(t *testing.T) {
	t.Parallel()
	first := startBridge(t, nil)
	second := execBridge(t, bridgeEnv(t, map[string]string{
		"DELAYBRIDGE_ENDPOINT":    first.Endpoint,
		"DELAYBRIDGE_ERROR_QUEUE": first.ErrorQ,
	}), "run")
	if code := second.Wait(20 * time.Second); code != 1 {
		t.Fatalf("second instance exit code %d, want 1\n%s", code, second.Stderr())
	}
	if !strings.Contains(second.Stderr(), "DELAYBRIDGE_STORE=postgres") {
		t.Fatalf("the refusal must point to the PostgreSQL store:\n%s", second.Stderr())
	}
	if strings.Contains(second.Stderr(), "ingest consuming") {
		t.Fatal("the second instance started consuming E.Timeouts before it was refused")
	}

	// The first instance is unaffected and still delivers.
	conn := dial(t)
	dest := first.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	newPublisher(t, conn).Publish(first.TimeoutsQueue(), amqp.Publishing{MessageId: "after", Body: []byte("x"),
		Headers: amqp.Table{"x-destination": dest, "x-delay": int32(200)}})
	if got := c.WaitFor(1, 10*time.Second); len(got) != 1 || got[0].MessageId != "after" {
		t.Fatalf("the first instance did not deliver after the refusal: %v", got)
	}
}
