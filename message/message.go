// Package message encodes what the bridge keeps of an AMQP message (body,
// properties and typed headers) into bytes for the store, and back.
//
// The encoding keeps every AMQP field-table type distinct, so a header that
// arrived as an int16 leaves as an int16: forwarding is faithful on the wire,
// which JSON or gob round trips would not guarantee.
package message

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

const version = 1

// ErrCorrupt is returned for bytes that are not a valid encoding.
var ErrCorrupt = errors.New("message: corrupt encoding")

// FromDelivery copies the publishable parts of a delivery.
func FromDelivery(d *amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// Encode appends the encoding of p to dst and returns it. It fails only for
// header values that AMQP cannot carry.
func Encode(dst []byte, p *amqp.Publishing) ([]byte, error) {
	b := append(dst, version)
	for _, s := range [...]string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		b = codec.AppendString(b, s)
	}
	b = append(b, p.DeliveryMode, p.Priority)
	b = codec.AppendUnixTime(b, p.Timestamp)
	if p.Headers == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		var err error
		if b, err = codec.AppendTable(b, p.Headers); err != nil {
			return nil, err
		}
	}
	return codec.AppendBytes(b, p.Body), nil
}

// Decode rebuilds the publishing encoded in b. The result does not alias b.
func Decode(b []byte) (amqp.Publishing, error) {
	d := codec.NewDecoder(b, ErrCorrupt)
	var p amqp.Publishing
	if v := d.Byte(); v != version {
		return p, fmt.Errorf("%w: unknown version %d", ErrCorrupt, v)
	}
	for _, s := range [...]*string{&p.ContentType, &p.ContentEncoding, &p.CorrelationId, &p.ReplyTo,
		&p.Expiration, &p.MessageId, &p.Type, &p.UserId, &p.AppId} {
		*s = d.String()
	}
	p.DeliveryMode = d.Byte()
	p.Priority = d.Byte()
	p.Timestamp = d.UnixTime()
	if d.Byte() == 1 {
		p.Headers = d.Table()
	}
	p.Body = d.Bytes()
	if err := d.End(); err != nil {
		return amqp.Publishing{}, err
	}
	return p, nil
}

// HeaderIs reports whether the message encoded in b has header name with
// the text value: a string, or a byte array as some clients send text, equal
// to value; an integer or a boolean whose decimal (true/false) form is value.
// Other types never match. It is the header selector of bulk actions
// (storage.ListFilter), so an operator can pick a tenant's or a
// correlation's messages.
func HeaderIs(b []byte, name, value string) (bool, error) {
	p, err := Decode(b)
	if err != nil {
		return false, err
	}
	v, ok := p.Headers[name]
	if !ok {
		return false, nil
	}
	switch v := v.(type) {
	case string:
		return v == value, nil
	case []byte:
		return string(v) == value, nil
	case bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, int:
		return fmt.Sprint(v) == value, nil
	}
	return false, nil
}
