package broker

import (
	"maps"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Forwardable returns the message as the bridge forwards it: without the
// due-time headers (so it cannot loop back into a delay) and without user-id.
func Forwardable(p amqp.Publishing, dropHeaders []string) amqp.Publishing {
	if p.Headers != nil {
		h := make(amqp.Table, len(p.Headers))
		maps.Copy(h, p.Headers)
		for _, k := range dropHeaders {
			delete(h, k)
		}
		p.Headers = h
	}
	p.UserId = ""
	return p
}
