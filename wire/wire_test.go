package wire

import (
	"slices"
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
	if _, err := DecodeTokens([]byte("{nope")); err == nil {
		t.Fatal("garbage decoded without an error")
	}
}

func TestQueueNames(t *testing.T) {
	if TimeoutsQueue("sales") != "sales.Timeouts" || DispatcherQueue("sales") != "sales.TimeoutsDispatcher" {
		t.Fatalf("%s, %s", TimeoutsQueue("sales"), DispatcherQueue("sales"))
	}
}
