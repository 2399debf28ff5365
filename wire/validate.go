package wire

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on names (docs/contract.md §2.6): the message-id property and
// queue names are AMQP short strings.
const (
	MaxIDBytes          = 255
	MaxDestinationBytes = 255
)

// Sentinels matched with errors.Is on what ValidateID and
// ValidateDestination return.
var (
	ErrInvalidID          = errors.New("invalid message id")
	ErrInvalidDestination = errors.New("invalid destination")
)

// invalidName is a refused id or destination. Its text names where the value
// came from and what is wrong, never the value itself: it may be huge, or
// not text at all.
type invalidName struct {
	kind error
	msg  string
}

func (e *invalidName) Error() string { return e.msg }
func (e *invalidName) Unwrap() error { return e.kind }

// ValidateID reports why id cannot name a timeout, or nil. what says where
// the id came from ("message-id property", "header x-delaybridge-cancel");
// the error reads "<what> is not valid UTF-8". Every id that reaches a store
// passes here first: PostgreSQL refuses NUL and invalid UTF-8, and a refusal
// there would look like a store outage.
func ValidateID(what, id string) error {
	if strings.TrimSpace(id) == "" {
		return &invalidName{ErrInvalidID, what + " is empty"}
	}
	return validate(ErrInvalidID, what, id, "a message id", MaxIDBytes)
}

// ValidateDestination reports why q cannot be a destination queue, or nil;
// what is as for ValidateID. A name over 255 bytes cannot be a routing key
// at all: publishing it fails to encode and closes the connection.
func ValidateDestination(what, q string) error {
	if q == "" {
		return &invalidName{ErrInvalidDestination, what + " is empty"}
	}
	return validate(ErrInvalidDestination, what, q, "a queue name", MaxDestinationBytes)
}

func validate(kind error, what, s, noun string, limit int) error {
	switch {
	case len(s) > limit:
		return &invalidName{kind, fmt.Sprintf("%s is %d bytes; %s is at most %d", what, len(s), noun, limit)}
	case !utf8.ValidString(s):
		return &invalidName{kind, what + " is not valid UTF-8"}
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return &invalidName{kind, what + " contains control characters"}
	}
	return nil
}

// ValidateExchange reports why x cannot be an exchange destination, or nil.
// The default exchange is refused under either of its names: a forward
// through it is a queue destination, which x-destination names and the
// rules for queues check.
func ValidateExchange(what, x string) error {
	switch x {
	case "":
		return &invalidName{ErrInvalidDestination, what + " is empty (name a queue with " + HeaderDestination + " instead)"}
	case "amq.default":
		return &invalidName{ErrInvalidDestination, what + " names the default exchange (name the queue with " + HeaderDestination + " instead)"}
	}
	return validate(ErrInvalidDestination, what, x, "an exchange name", MaxDestinationBytes)
}

// ValidateRoutingKey reports why k cannot be the routing key of an exchange
// destination, or nil. An empty key is valid.
func ValidateRoutingKey(what, k string) error {
	return validate(ErrInvalidDestination, what, k, "a routing key", MaxDestinationBytes)
}

// Clip cuts s to 64 bytes, marked "…" when cut: an error that quotes a
// refused value, which may be huge, stays short.
func Clip(s string) string { return ClipTo(s, 64) }

// ClipTo cuts s to n bytes, marked "…" when cut.
func ClipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
