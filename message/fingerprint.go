package message

import (
	"crypto/sha256"
	"encoding/binary"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

// RedeliveryHeaders are the headers a broker adds or changes when it
// delivers a message again (quorum queues count deliveries in
// x-delivery-count, and RabbitMQ 4 also in x-acquired-count): a redelivery
// differs from its first delivery in these alone.
var RedeliveryHeaders = []string{"x-delivery-count", "x-acquired-count"}

// FingerprintBytes is the length of a fingerprint.
const FingerprintBytes = 16

// Fingerprint identifies one send of a message (docs/contract.md §2.4): the
// first 16 bytes of a SHA-256 of what its publisher sent: the exchange and
// routing key it was published with, every property, every header except
// RedeliveryHeaders, and the body. A broker's redelivery, and a publisher's
// repeat of one publish, have the fingerprint of the first delivery; a send
// that differs in any of these (a retry with a new retry count, a timeout
// set again for another time) does not. It fails only for header values
// AMQP cannot carry, as Encode does.
func Fingerprint(d *amqp.Delivery) ([]byte, error) {
	p := FromDelivery(d)
	for _, h := range RedeliveryHeaders {
		if _, ok := p.Headers[h]; ok {
			p.Headers = without(p.Headers, RedeliveryHeaders)
			break
		}
	}
	// The body is hashed where it lies, not copied into the encoding.
	body := p.Body
	p.Body = nil
	b := codec.AppendString(codec.AppendString(make([]byte, 0, 256), d.Exchange), d.RoutingKey)
	b, err := Encode(b, &p)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(binary.AppendUvarint(b, uint64(len(body))))
	h.Write(body)
	return h.Sum(nil)[:FingerprintBytes], nil
}

// without returns a copy of t without the names.
func without(t amqp.Table, names []string) amqp.Table {
	c := make(amqp.Table, len(t))
	for k, v := range t {
		c[k] = v
	}
	for _, n := range names {
		delete(c, n)
	}
	return c
}
