package bench

import (
	"errors"
	"testing"
)

// The bench redacts connection errors as the bridge does: structurally. Its
// own copy replaced the password's text everywhere, so a one-letter
// password garbled (and revealed itself in) the broker's answer.
func TestRedactErrIsStructural(t *testing.T) {
	msg := `Exception (403) Reason: "username or password not allowed"`
	if got := redactErr(errors.New(msg), "amqp://guest:x@localhost/"); got != msg {
		t.Errorf("redactErr changed a message without a URL: %q", got)
	}
	got := redactErr(errors.New(`cannot parse "postgres://app:a@b@db/x"`), "postgres://app:a@b@db/x")
	if want := `cannot parse "postgres://app:xxxxx@db/x"`; got != want {
		t.Errorf("redactErr = %q, want %q", got, want)
	}
}
