package wire

import (
	"errors"
	"strings"
	"testing"
)

// Each validator takes its valid values and refuses the others with its
// message and its kind of error, never the other kind.
func TestValidateIDAndDestination(t *testing.T) {
	for _, c := range []struct {
		name      string
		validate  func(what, s string) error
		what      string
		valid     []string
		invalid   map[string]string // value → error message
		is, isNot error
	}{{
		name: "ValidateID", validate: ValidateID, what: "id",
		valid: []string{"a", "order/42", " x ", "ünï", ".", "..", strings.Repeat("i", MaxIDBytes)},
		invalid: map[string]string{
			"":                                "id is empty",
			"  ":                              "id is empty",
			"a\x00b":                          "id contains control characters",
			"a\nb":                            "id contains control characters",
			"a\u0085":                         "id contains control characters",
			"\xff\xfe":                        "id is not valid UTF-8",
			strings.Repeat("i", MaxIDBytes+1): "id is 256 bytes; a message id is at most 255",
		},
		is: ErrInvalidID, isNot: ErrInvalidDestination,
	}, {
		name: "ValidateDestination", validate: ValidateDestination, what: "header x-destination",
		valid: []string{"q", " ", "orders.eu", "a/b", strings.Repeat("q", MaxDestinationBytes)},
		invalid: map[string]string{
			"":                          "header x-destination is empty",
			"a\x00":                     "header x-destination contains control characters",
			"\xc3":                      "header x-destination is not valid UTF-8",
			strings.Repeat("q", 300):    "header x-destination is 300 bytes; a queue name is at most 255",
			strings.Repeat("\xff", 300): "header x-destination is 300 bytes; a queue name is at most 255",
		},
		is: ErrInvalidDestination, isNot: ErrInvalidID,
	}} {
		for _, s := range c.valid {
			if err := c.validate(c.what, s); err != nil {
				t.Errorf("%s(%.20q) = %v", c.name, s, err)
			}
		}
		for s, want := range c.invalid {
			err := c.validate(c.what, s)
			if err == nil || err.Error() != want || !errors.Is(err, c.is) || errors.Is(err, c.isNot) {
				t.Errorf("%s(%.20q) = %v, want %q matching %v", c.name, s, err, want, c.is)
			}
		}
	}
}

func TestClip(t *testing.T) {
	s64 := strings.Repeat("a", 64)
	for in, want := range map[string]string{"": "", "short": "short", s64: s64, s64 + "b": s64 + "…"} {
		if got := Clip(in); got != want {
			t.Errorf("Clip(%d bytes) = %q, want %q", len(in), got, want)
		}
	}
	if got := ClipTo("abcdef", 3); got != "abc…" {
		t.Errorf("ClipTo(abcdef, 3) = %q", got)
	}
}
