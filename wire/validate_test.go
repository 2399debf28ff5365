package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "order/42", " x ", "ünï", ".", "..", strings.Repeat("i", MaxIDBytes)} {
		if err := ValidateID("id", id); err != nil {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
	for id, want := range map[string]string{
		"":                                "id is empty",
		"  ":                              "id is empty",
		"a\x00b":                          "id contains control characters",
		"a\nb":                            "id contains control characters",
		"a\u0085":                         "id contains control characters",
		"\xff\xfe":                        "id is not valid UTF-8",
		strings.Repeat("i", MaxIDBytes+1): "id is 256 bytes; a message id is at most 255",
	} {
		err := ValidateID("id", id)
		if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidID) || errors.Is(err, ErrInvalidDestination) {
			t.Errorf("ValidateID(%q) = %v, want %q matching ErrInvalidID", id, err, want)
		}
	}
}

func TestValidateDestination(t *testing.T) {
	for _, q := range []string{"q", " ", "orders.eu", "a/b", strings.Repeat("q", MaxDestinationBytes)} {
		if err := ValidateDestination("header x-destination", q); err != nil {
			t.Errorf("ValidateDestination(%q) = %v", q, err)
		}
	}
	for q, want := range map[string]string{
		"":                          "header x-destination is empty",
		"a\x00":                     "header x-destination contains control characters",
		"\xc3":                      "header x-destination is not valid UTF-8",
		strings.Repeat("q", 300):    "header x-destination is 300 bytes; a queue name is at most 255",
		strings.Repeat("\xff", 300): "header x-destination is 300 bytes; a queue name is at most 255",
	} {
		err := ValidateDestination("header x-destination", q)
		if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidDestination) || errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateDestination(%.20q) = %v, want %q matching ErrInvalidDestination", q, err, want)
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
