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

// The dispatcher reads each token with the message id of its row key: a
// later send's key carries its send number, the id does not.
func TestDecodeLeasesReadsTheMessageIDOfEachKey(t *testing.T) {
	body, err := EncodeTokens([]Token{{ID: "m", Lock: "l1"}, {ID: SendKey("m", 2), Lock: "l2"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLeases(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []Lease{{Token: Token{ID: "m", Lock: "l1"}, MessageID: "m"}, {Token: Token{ID: "m\x1f2", Lock: "l2"}, MessageID: "m"}}
	if !slices.Equal(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	if _, err := DecodeLeases([]byte(`{"tokens":[{"id":"","lock":"x"}]}`)); err == nil {
		t.Error("a token with no id decoded without an error")
	}
}
