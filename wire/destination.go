package wire

import "fmt"

// Destination is where the bridge forwards a message (docs/contract.md
// §2.2): a queue, through the default exchange (Exchange ""), or an exchange
// with a routing key. It is comparable, so it keys maps.
type Destination struct {
	Exchange string
	// Key is the queue of a queue destination, else the routing key.
	Key string
}

// Queue is the destination of queue q.
func Queue(q string) Destination { return Destination{Key: q} }

// IsQueue reports whether d is a queue destination.
func (d Destination) IsQueue() bool { return d.Exchange == "" }

// String is d for people: the queue's name, or
// exchange "X" routing key "K" for an exchange destination.
func (d Destination) String() string {
	if d.IsQueue() {
		return d.Key
	}
	return fmt.Sprintf("exchange %q routing key %q", d.Exchange, d.Key)
}

// Quoted is d in error text: the queue's name quoted, or as String.
func (d Destination) Quoted() string {
	if d.IsQueue() {
		return fmt.Sprintf("%q", d.Key)
	}
	return d.String()
}

// AllowName is what DELAYBRIDGE_ALLOWED_DESTINATIONS patterns match: the
// queue's name, or exchange:X for an exchange destination (whatever its
// routing key), so that a queue pattern never admits an exchange.
func (d Destination) AllowName() string {
	if d.IsQueue() {
		return d.Key
	}
	return ExchangePatternPrefix + d.Exchange
}

// ExchangePatternPrefix starts an allow-list pattern for exchanges.
const ExchangePatternPrefix = "exchange:"

// Validate applies ValidateDestination to a queue destination, and
// ValidateExchange and ValidateRoutingKey to an exchange destination.
func (d Destination) Validate(what string) error {
	if d.IsQueue() {
		return ValidateDestination(what, d.Key)
	}
	if err := ValidateExchange(what+" exchange", d.Exchange); err != nil {
		return err
	}
	return ValidateRoutingKey(what+" routing key", d.Key)
}
