package nsbtimeout

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/errorqueue"
	"github.com/delaybridge/delaybridge/intake"
	"github.com/delaybridge/delaybridge/internal/servicecontrol"
	"github.com/delaybridge/delaybridge/wire"
)

// servicePulseRetry is what ServiceControl sends back to NServiceBus.FailedQ
// when an operator retries copy from ServicePulse. The message id is the
// staging message's own, so only the NServiceBus.MessageId header carries
// the original id (RabbitMQ transport: message-id property).
func servicePulseRetry(copyMsg amqp.Publishing, nativeID string) amqp.Delivery {
	h := servicecontrol.RetryHeaders(copyMsg.Headers, "5b3e7c0a-0000-4000-8000-000000000001")
	return amqp.Delivery{MessageId: nativeID, ContentType: copyMsg.ContentType, Body: copyMsg.Body, Headers: h}
}

func TestServicePulseRetryIsDueNow(t *testing.T) {
	now := time.Date(2026, 11, 23, 21, 0, 0, 0, time.UTC)
	for name, dest := range map[string]wire.Destination{
		"queue":    {Key: "orders"},
		"exchange": {Exchange: "events", Key: "order.placed"},
	} {
		t.Run(name, func(t *testing.T) {
			// As the bridge stores and forwards it: x-destination still
			// there, due-time headers gone.
			fwd := amqp.Publishing{MessageId: "m-1", ContentType: "application/json", Body: []byte(`{"a":1}`),
				Headers: amqp.Table{wire.HeaderDestination: "elsewhere", "NServiceBus.EnclosedMessageTypes": "Orders.Placed", "NServiceBus.SagaId": "s-1"}}
			copyMsg := errorqueue.Copy(fwd, errorqueue.Facts{Reason: "nack", Stage: wire.StageDispatch, Attempts: 6, FailedAt: now.Add(-time.Hour),
				FailedQ: "E.Timeouts", Forward: &dest, Processing: errorqueue.NewProcessing("E", "h")})
			d := servicePulseRetry(copyMsg, "staging-native-id")
			if !IsRetry(d.Headers) {
				t.Fatal("not recognised as a retry")
			}
			it := ParseHeaders(&d, now)
			if it.Op != intake.OpSchedule {
				t.Fatalf("op %v: %s", it.Op, it.Reason)
			}
			if it.Dest() != dest || !it.DueAt.Equal(now) || it.ID != "staging-native-id" || it.SagaID != "s-1" {
				t.Errorf("intake %+v", it)
			}
			for k := range it.Msg.Headers {
				if strings.HasPrefix(k, "x-delaybridge-") || strings.HasPrefix(k, "NServiceBus.ExceptionInfo.") {
					t.Errorf("forwarded with %s", k)
				}
			}
			for _, k := range []string{"ServiceControl.Retry.UniqueMessageId", "ServiceControl.Retry.AcknowledgementQueue", "NServiceBus.EnclosedMessageTypes", "NServiceBus.MessageId"} {
				if _, ok := it.Msg.Headers[k]; !ok {
					t.Errorf("forwarded without %s", k)
				}
			}
		})
	}

	// Given a due time again, it is an ordinary message; an ingest copy is
	// not a retry.
	d := amqp.Delivery{MessageId: "m", Headers: amqp.Table{wire.HeaderStage: wire.StageDispatch, wire.HeaderForwardRoutingKey: "q",
		wire.HeaderDestination: "later", wire.HeaderDueAt: now.Add(time.Hour).Format(time.RFC3339)}}
	if it := ParseHeaders(&d, now); IsRetry(d.Headers) || it.Op != intake.OpSchedule || it.Destination != "later" || !it.DueAt.Equal(now.Add(time.Hour)) {
		t.Errorf("copy with x-due-at: %+v", it)
	}
	d = amqp.Delivery{MessageId: "m", Headers: amqp.Table{wire.HeaderStage: wire.StageIngest, wire.HeaderDestination: "q"}}
	if it := ParseHeaders(&d, now); IsRetry(d.Headers) || it.Op != intake.OpReject || !strings.Contains(it.Reason, "no due time") {
		t.Errorf("ingest copy: %+v", it)
	}
	// A retried copy whose forward headers are unusable is refused.
	d = amqp.Delivery{MessageId: "m", Headers: amqp.Table{wire.HeaderStage: wire.StageDispatch, wire.HeaderForwardRoutingKey: int32(1)}}
	if it := ParseHeaders(&d, now); it.Op != intake.OpReject {
		t.Errorf("bad forward headers: %+v", it)
	}
}
