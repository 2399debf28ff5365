package message

import (
	"bytes"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func sampleDelivery() amqp.Delivery {
	return amqp.Delivery{
		Exchange: "x", RoutingKey: "k", MessageId: "m", ContentType: "text/plain", DeliveryMode: 2, Priority: 3,
		Timestamp: time.Unix(1700000000, 0), CorrelationId: "c", ReplyTo: "r", Type: "t", AppId: "a",
		Headers: amqp.Table{"NServiceBus.Retries": int32(1), "x-destination": "q", "nested": amqp.Table{"b": "2", "a": int64(1)},
			"list": []any{"one", int8(2)}},
		Body: []byte("body"),
	}
}

// The fingerprint names what the publisher sent: the same delivery, its
// headers in any order, a quorum queue's delivery counts and the broker's
// redelivered flag and tags aside, has the same one; any change to the
// exchange, routing key, a property, a header or the body gives another.
func TestFingerprint(t *testing.T) {
	fp := func(d amqp.Delivery) []byte {
		t.Helper()
		b, err := Fingerprint(&d)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != FingerprintBytes {
			t.Fatalf("fingerprint of %d bytes", len(b))
		}
		return b
	}
	base := fp(sampleDelivery())
	for i := range 20 { // map order differs from run to run
		if got := fp(sampleDelivery()); !bytes.Equal(got, base) {
			t.Fatalf("run %d: fingerprint %x, first %x", i, got, base)
		}
	}
	same := map[string]func(d *amqp.Delivery){
		"redelivered":       func(d *amqp.Delivery) { d.Redelivered, d.DeliveryTag, d.ConsumerTag = true, 7, "ctag" },
		"x-delivery-count":  func(d *amqp.Delivery) { d.Headers["x-delivery-count"] = int64(3) },
		"x-acquired-count":  func(d *amqp.Delivery) { d.Headers["x-acquired-count"] = int64(3) },
		"headers in a copy": func(d *amqp.Delivery) { d.Headers = amqp.Table(mapsClone(d.Headers)) },
	}
	for name, change := range same {
		d := sampleDelivery()
		change(&d)
		if got := fp(d); !bytes.Equal(got, base) {
			t.Errorf("%s: fingerprint changed", name)
		}
	}
	differ := map[string]func(d *amqp.Delivery){
		"exchange":         func(d *amqp.Delivery) { d.Exchange = "y" },
		"routing key":      func(d *amqp.Delivery) { d.RoutingKey = "k2" },
		"message id":       func(d *amqp.Delivery) { d.MessageId = "n" },
		"timestamp":        func(d *amqp.Delivery) { d.Timestamp = d.Timestamp.Add(time.Second) },
		"priority":         func(d *amqp.Delivery) { d.Priority = 4 },
		"a retry count":    func(d *amqp.Delivery) { d.Headers["NServiceBus.Retries"] = int32(2) },
		"a header's type":  func(d *amqp.Delivery) { d.Headers["NServiceBus.Retries"] = int64(1) },
		"a new header":     func(d *amqp.Delivery) { d.Headers["x-due-at"] = "2026-11-28T00:00:00Z" },
		"a nested value":   func(d *amqp.Delivery) { d.Headers["nested"] = amqp.Table{"b": "2", "a": int64(2)} },
		"the body":         func(d *amqp.Delivery) { d.Body = []byte("bodx") },
		"the body's end":   func(d *amqp.Delivery) { d.Body = append(d.Body, 0) },
		"no headers":       func(d *amqp.Delivery) { d.Headers = nil },
		"a moved boundary": func(d *amqp.Delivery) { d.Exchange, d.RoutingKey = "xk", "" },
	}
	for name, change := range differ {
		d := sampleDelivery()
		change(&d)
		if got := fp(d); bytes.Equal(got, base) {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	d := sampleDelivery()
	d.Headers["bad"] = struct{}{}
	if _, err := Fingerprint(&d); err == nil {
		t.Error("a header value AMQP cannot carry has a fingerprint")
	}
}

func mapsClone(t amqp.Table) map[string]any {
	c := make(map[string]any, len(t))
	for k, v := range t {
		c[k] = v
	}
	return c
}
