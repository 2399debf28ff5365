package bench

import (
	"errors"
	"io"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// teardownBencher connects a bencher to the test broker and declares one
// queue and one exchange of its run; check is a connection of the test's
// own, which deletes both at the end, whatever the teardown did.
func teardownBencher(t *testing.T) (b *bencher, check *amqp.Connection, queue, exchange string) {
	t.Helper()
	b = &bencher{opts: Options{AMQPURL: testenv.AMQPURL(t)}, log: io.Discard, res: &Results{}, runID: randHex(4)}
	if err := b.connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.closeConns)
	queue, exchange = b.name("teardown", "q"), b.name("teardown", "x")
	check = testenv.DialAMQP(t)
	t.Cleanup(func() {
		if ch, err := check.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
			_ = ch.Close()
		}
	})
	if err := b.declareQueue(queue, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.declareExchange(exchange, amqp.ExchangeTopic); err != nil {
		t.Fatal(err)
	}
	return b, check, queue, exchange
}

// exists tells whether the broker has the queue or exchange name.
func exists(t *testing.T, conn *amqp.Connection, kind, name string) bool {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if kind == "queue" {
		_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	} else {
		err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	}
	var aerr *amqp.Error
	if err != nil && !(errors.As(err, &aerr) && aerr.Code == amqp.NotFound) {
		t.Fatalf("passive declare %s %s: %v", kind, name, err)
	}
	return err == nil
}

func TestTeardownAfterTheAdminConnectionWasLost(t *testing.T) {
	b, check, queue, exchange := teardownBencher(t)
	if err := b.adminConn.Close(); err != nil {
		t.Fatal(err)
	}
	b.teardown()
	if len(b.res.Warnings) > 0 {
		t.Errorf("warnings: %q", b.res.Warnings)
	}
	if exists(t, check, "queue", queue) || exists(t, check, "exchange", exchange) {
		t.Errorf("queue %s or exchange %s left on the broker", queue, exchange)
	}
}

func TestTeardownWarnsWhenItCannotReconnect(t *testing.T) {
	b, check, queue, exchange := teardownBencher(t)
	if err := b.adminConn.Close(); err != nil {
		t.Fatal(err)
	}
	b.opts.AMQPURL = "amqp://guest:guest@127.0.0.1:1/" // nothing listens there
	b.teardown()
	w := strings.Join(b.res.Warnings, "\n")
	if !strings.Contains(w, "teardown: bench: connect to the broker") || !strings.Contains(w, "could not delete queue "+queue) {
		t.Errorf("warnings: %q", b.res.Warnings)
	}
	if !exists(t, check, "queue", queue) || !exists(t, check, "exchange", exchange) {
		t.Errorf("queue %s or exchange %s gone without a connection", queue, exchange)
	}
}
