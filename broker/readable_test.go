package broker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

// Test encoders of AMQP field values (type octet included).

func u32be(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

func fVoid() []byte { return []byte{'V'} }

func fString(s string) []byte { return append(append([]byte{'S'}, u32be(len(s))...), s...) }

// entry is one table entry: a short-string key and a value.
func entry(key string, value []byte) []byte {
	return append(append([]byte{byte(len(key))}, key...), value...)
}

// tableBody is a table's entries without its length prefix.
func tableBody(entries ...[]byte) []byte {
	var b []byte
	for _, e := range entries {
		b = append(b, e...)
	}
	return b
}

func fTable(entries ...[]byte) []byte {
	body := tableBody(entries...)
	return append(append([]byte{'F'}, u32be(len(body))...), body...)
}

func fArray(elems ...[]byte) []byte {
	body := tableBody(elems...)
	return append(append([]byte{'A'}, u32be(len(body))...), body...)
}

// voidEntries returns n entries "k0", "k1", … with void values.
func voidEntries(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = entry(fmt.Sprintf("k%d", i), fVoid())
	}
	return out
}

// nestedTables is a value of depth tables nested in each other (0: void).
func nestedTables(depth int) []byte {
	v := fVoid()
	for range depth {
		v = fTable(entry("n", v))
	}
	return v
}

// nestedArrays is a value of depth arrays nested in each other (0: void).
func nestedArrays(depth int) []byte {
	v := fVoid()
	for range depth {
		v = fArray(v)
	}
	return v
}

// props is a content header's property flags and list with these headers
// (the table's entries) and message-id.
func props(messageID string, headers ...[]byte) []byte {
	body := tableBody(headers...)
	b := binary.BigEndian.AppendUint16(nil, propHeaders|propDeliveryMode|propMessageID)
	b = append(b, u32be(len(body))...)
	b = append(b, body...)
	b = append(b, 2) // persistent
	return append(append(b, byte(len(messageID))), messageID...)
}

// readableCases are content headers next to whether amqp091-go reads them
// and, when not, what the reason must say.
var readableCases = []struct {
	name     string
	props    []byte
	readable bool
	reason   string
}{
	{"no headers", props("m"), true, ""},
	{"8192 entries", props("m", voidEntries(8192)...), true, ""},
	{"8193 entries", props("m", voidEntries(8193)...), false, "8193 entries in one table (limit 8192)"},
	{"8191 entries and a repeated key", props("m", append(voidEntries(8191), entry("k0", fVoid()))...), true, ""},
	// The client refuses any entry once it holds 8192 keys, even one that
	// would only replace a value.
	{"8192 entries and a repeated key", props("m", append(voidEntries(8192), entry("k0", fVoid()))...), false, "8193 entries in one table"},
	{"8193 entries in a nested table", props("m", entry("t", fTable(voidEntries(8193)...))), false, "8193 entries in one table"},
	{"tables nested 32 deep", props("m", entry("n", nestedTables(32))), true, ""},
	{"tables nested 33 deep", props("m", entry("n", nestedTables(33))), false, "nested more than 32 levels deep"},
	{"arrays nested 32 deep", props("m", entry("n", nestedArrays(32))), true, ""},
	{"arrays nested 33 deep", props("m", entry("n", nestedArrays(33))), false, "nested more than 32 levels deep"},
	{"array then tables, 32 deep", props("m", entry("n", fArray(nestedTables(31)))), true, ""},
	{"array then tables, 33 deep", props("m", entry("n", fArray(nestedTables(32)))), false, "nested more than 32 levels deep"},
	{"array of 8192", props("m", entry("a", fArray(voidEntriesValues(8192)...))), true, ""},
	{"array of 8193", props("m", entry("a", fArray(voidEntriesValues(8193)...))), false, "8193 elements in one array (limit 8192)"},
	{"every scalar type", props("m",
		entry("t", []byte{'t', 1}), entry("b", []byte{'b', 1}), entry("B", []byte{'B', 1}),
		entry("s", []byte{'s', 0, 1}), entry("u", []byte{'u', 0, 1}), entry("I", []byte{'I', 0, 0, 0, 1}),
		entry("i", []byte{'i', 0, 0, 0, 1}), entry("f", []byte{'f', 0, 0, 0, 0}), entry("l", append([]byte{'l'}, make([]byte, 8)...)),
		entry("d", append([]byte{'d'}, make([]byte, 8)...)), entry("T", append([]byte{'T'}, make([]byte, 8)...)),
		entry("D", []byte{'D', 2, 0, 0, 0, 5}), entry("S", fString("text")), entry("x", []byte{'x', 0, 0, 0, 2, 'h', 'i'}),
	), true, ""},
	{"unknown field type", props("m", entry("z", []byte{'z'})), false, "unknown field type"},
}

func voidEntriesValues(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fVoid()
	}
	return out
}

func TestDecodePropertiesAppliesTheClientsLimits(t *testing.T) {
	for _, tc := range readableCases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := decodeProperties(tc.props)
			if tc.readable {
				if err != nil {
					t.Fatalf("decodeProperties: %v, want readable", err)
				}
			} else {
				if !errors.Is(err, ErrUnreadable) {
					t.Fatalf("decodeProperties: %v, want ErrUnreadable", err)
				}
				if !strings.Contains(err.Error(), tc.reason) {
					t.Errorf("reason %q does not say %q", err, tc.reason)
				}
			}
			// The properties after the headers are read either way.
			if p.MessageId != "m" || p.DeliveryMode != 2 {
				t.Errorf("message-id %q, delivery-mode %d; want \"m\", 2", p.MessageId, p.DeliveryMode)
			}
		})
	}
}

// TestDecodePropertiesAgreesWithAMQP091 feeds each content header to
// amqp091-go itself, through a fake broker, and checks that it fails the
// connection exactly when decodeProperties calls the header unreadable, and
// that unreadableFrame recognises that failure.
func TestDecodePropertiesAgreesWithAMQP091(t *testing.T) {
	for _, tc := range readableCases {
		t.Run(tc.name, func(t *testing.T) {
			e := amqp091Verdict(t, tc.props)
			if got := !unreadableFrame(e); got != tc.readable {
				t.Fatalf("amqp091-go closed the connection with %v: readable=%v, want %v", e, got, tc.readable)
			}
			if tc.readable && (e == nil || e.Code != 200 || !e.Server) {
				t.Fatalf("amqp091-go closed the connection with %v, want the fake broker's 200", e)
			}
		})
	}
}

func TestDecodePropertiesAllProperties(t *testing.T) {
	b := binary.BigEndian.AppendUint16(nil, 0xFFFC) // every property
	str := func(s string) { b = append(append(b, byte(len(s))), s...) }
	str("text/plain")
	str("gzip")
	body := tableBody(voidEntries(8193)...)
	b = append(append(b, u32be(len(body))...), body...)
	b = append(b, 2, 7)
	str("corr")
	str("reply")
	str("60000")
	str("id-1")
	b = binary.BigEndian.AppendUint64(b, 1700000000)
	str("type")
	str("user")
	str("app")
	str("cluster")
	p, err := decodeProperties(b)
	if !errors.Is(err, ErrUnreadable) {
		t.Fatalf("err %v, want ErrUnreadable", err)
	}
	want := amqp.Publishing{ContentType: "text/plain", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 7,
		CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000", MessageId: "id-1",
		Timestamp: time.Unix(1700000000, 0), Type: "type", UserId: "user", AppId: "app"}
	if fmt.Sprint(p) != fmt.Sprint(want) {
		t.Errorf("got  %+v\nwant %+v", p, want)
	}
	short := props("id-1")
	if _, err := decodeProperties(short[:len(short)-1]); !errors.Is(err, ErrUnreadable) || !errors.Is(err, errMalformed) {
		t.Errorf("truncated properties: err %v, want ErrUnreadable wrapping errMalformed", err)
	}
}

// amqp091Verdict opens an amqp091-go connection to a fake broker that sends
// a content header with props, then closes the connection with 200. It
// returns the error amqp091-go closed the connection with: the broker's 200
// when it read the header.
func amqp091Verdict(t *testing.T, props []byte) *amqp.Error {
	t.Helper()
	client, server := net.Pipe()
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- fakeBroker(server, props, ready) }()
	conn, err := amqp.Open(client, amqp.Config{
		SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "u", Password: "p"}}, Locale: "en_US",
	})
	if err != nil {
		t.Fatalf("amqp.Open on the fake broker: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	close(ready)
	var e *amqp.Error
	select {
	case e = <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("amqp091-go did not close the connection")
	}
	_ = conn.Close()
	_ = server.Close()
	if err := <-served; err != nil {
		t.Fatalf("fake broker: %v", err)
	}
	return e
}

// fakeBroker speaks the broker's side of the handshake on nc, waits for
// ready, sends a content header on channel 1 and a connection.close.
func fakeBroker(nc net.Conn, props []byte, ready <-chan struct{}) error {
	r, w := bufio.NewReader(nc), bufio.NewWriter(nc)
	method := func(class, id uint16, args []byte) error {
		p := append(binary.BigEndian.AppendUint32(nil, uint32(class)<<16|uint32(id)), args...)
		if err := codec.WriteFrame(w, codec.FrameMethod, 0, p); err != nil {
			return err
		}
		return w.Flush()
	}
	var hdr [8]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	b := codec.AppendLongBytes([]byte{0, 9}, nil)
	b = codec.AppendLongBytes(b, []byte("PLAIN"))
	b = codec.AppendLongBytes(b, []byte("en_US"))
	if err := method(10, 10, b); err != nil {
		return err
	}
	if _, err := codec.ReadFrame(r, 1<<20); err != nil { // start-ok
		return err
	}
	b = binary.BigEndian.AppendUint16(nil, 0)
	b = binary.BigEndian.AppendUint32(b, 1<<17)
	b = binary.BigEndian.AppendUint16(b, 0)
	if err := method(10, 30, b); err != nil {
		return err
	}
	for range 2 { // tune-ok, open
		if _, err := codec.ReadFrame(r, 1<<20); err != nil {
			return err
		}
	}
	if err := method(10, 41, []byte{0}); err != nil {
		return err
	}
	<-ready
	// Past this point the client may drop the connection at any time.
	header := binary.BigEndian.AppendUint16(nil, 60)
	header = binary.BigEndian.AppendUint16(header, 0)
	header = binary.BigEndian.AppendUint64(header, 0)
	header = append(header, props...)
	if codec.WriteFrame(w, codec.FrameHeader, 1, header) != nil || w.Flush() != nil {
		return nil
	}
	b = codec.AppendShortString(binary.BigEndian.AppendUint16(nil, 200), "bye")
	if method(10, 50, append(b, 0, 0, 0, 0)) != nil {
		return nil
	}
	for {
		if _, err := codec.ReadFrame(r, 1<<20); err != nil {
			return nil
		}
	}
}
