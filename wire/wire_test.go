package wire

import (
	"slices"
	"strings"
	"testing"
)

// Dispatcher messages outlive a process: one written before an upgrade is
// read after it, so the bytes are fixed.
func TestTokensWireBytes(t *testing.T) {
	toks := []Token{{ID: "a", Lock: "host-1:7.1"}, {ID: "b\"c", Lock: ""}}
	const want = `{"tokens":[{"id":"a","lock":"host-1:7.1"},{"id":"b\"c","lock":""}]}`
	body, err := EncodeTokens(toks)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != want {
		t.Fatalf("encoded %s, want %s", body, want)
	}
	got, err := DecodeTokens([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, toks) {
		t.Fatalf("decoded %+v, want %+v", got, toks)
	}
	for _, bad := range []string{"{nope", `{"tokens":[{"id":"a\u0000b","lock":"x"}]}`, `{"tokens":[{"id":"","lock":"x"}]}`,
		`{"tokens":[{"id":"ok","lock":"x"},{"id":"` + strings.Repeat("i", 256) + `","lock":"x"}]}`} {
		if _, err := DecodeTokens([]byte(bad)); err == nil {
			t.Errorf("%.40s… decoded without an error", bad)
		}
	}
}

func TestQueueNames(t *testing.T) {
	if TimeoutsQueue("sales") != "sales.Timeouts" || DispatcherQueue("sales") != "sales.TimeoutsDispatcher" {
		t.Fatalf("%s, %s", TimeoutsQueue("sales"), DispatcherQueue("sales"))
	}
	if DelayedRoute("orders") != "orders.route" {
		t.Fatalf("%s", DelayedRoute("orders"))
	}
}
