package dispatch

import (
	"context"
	"testing"

	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// A later send of a message is stored under its id and send number
// (wire.SendKey); the error-queue copy of its corrupt record carries the
// message id alone.
func TestCorruptLaterSendCopyCarriesTheMessageID(t *testing.T) {
	f := newFixture(t, 5)
	for range 2 {
		row := storage.Timeout{ID: "m", Destination: "orders", DueAt: t0, Message: []byte{99, 1, 2}, Fingerprint: storage.NewSendFingerprint()}
		if _, err := f.store.Insert(context.Background(), []storage.Timeout{row}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := f.pending(wire.SendKey("m", 2)); !ok {
		t.Fatal("the second send is not stored under its send key")
	}
	if _, err := f.deliver(f.lease()...); err != nil {
		t.Fatal(err)
	}
	eq := f.pub.To("error")
	if len(eq) != 2 {
		t.Fatalf("%d on the error queue, want 2", len(eq))
	}
	for _, m := range eq {
		if m.Msg.MessageId != "m" {
			t.Errorf("error copy's message id %q, want %q", m.Msg.MessageId, "m")
		}
	}
	for _, key := range []string{"m", wire.SendKey("m", 2)} {
		if _, ok := f.pending(key); ok {
			t.Errorf("%q still pending", key)
		}
	}
}
