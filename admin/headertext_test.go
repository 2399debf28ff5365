package admin

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/wire"
)

// Every other part of the bridge reads text headers sent as byte arrays;
// replay must too, or this endpoint's own failure reads as another's.
func TestReplayReadsTextHeadersSentAsBytes(t *testing.T) {
	rp := &Replayer{TimeoutsQueue: "e.Timeouts"}
	d := &amqp.Delivery{MessageId: "m", Headers: amqp.Table{
		wire.HeaderNSBFailedQ: []byte("e.Timeouts"), wire.HeaderStage: []byte(wire.StageDispatch),
		wire.HeaderDestination: "orders",
	}}
	row, why := rp.rebuild(d, time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))
	if why != "" || row.Destination != "orders" {
		t.Fatalf("rebuild: %q, row %+v", why, row)
	}
}
