package boltstore

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/delaybridge/delaybridge/internal/codec"
	"github.com/delaybridge/delaybridge/storage"
)

func sampleRecords() []*record {
	zone := time.FixedZone("plus-14", 14*3600)
	full := &record{
		Timeout: storage.Timeout{
			ID:            "id-1",
			Destination:   "orders",
			Exchange:      "events",
			SagaID:        "8e1f4c52-0d1b-4a2e-9c64-1b2f3a4d5e6f",
			DueAt:         time.Date(2026, 11, 21, 20, 0, 0, 250000001, zone),
			ReceivedAt:    time.Date(2026, 11, 21, 6, 0, 0, 1, time.UTC),
			Message:       []byte("\x00body\xff"),
			Attempts:      3,
			LastError:     "NO_ROUTE",
			Lock:          "host-1:42",
			LockExpiresAt: time.Date(2026, 11, 21, 6, 5, 0, 0, time.UTC),
			NotBefore:     time.Date(2026, 11, 21, 6, 1, 0, 999999999, time.UTC),
		},
		index: idxLeased,
		key:   indexKey(time.Date(2026, 11, 21, 6, 5, 0, 0, time.UTC), 42),
	}
	return []*record{
		full,
		{Timeout: storage.Timeout{ID: "z"}, index: idxReady},                                                    // zero times, nil message
		{Timeout: storage.Timeout{ID: "q", Destination: "orders"}, index: idxReady},                             // a queue
		{Timeout: storage.Timeout{ID: "k", Exchange: "amq.fanout"}, index: idxReady},                            // no routing key
		{Timeout: storage.Timeout{ID: "e", Message: []byte{}}, index: idxReady},                                 // empty, not nil
		{Timeout: storage.Timeout{ID: "n", Attempts: -7, DueAt: time.Unix(-1, 1).UTC()}, index: idxReady},       // negative
		{Timeout: storage.Timeout{ID: "old", DueAt: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)}, index: idxReady}, // 1ns after zero
		{Timeout: storage.Timeout{ID: "bc", DueAt: time.Date(-500, 3, 1, 0, 0, 0, 0, time.UTC)}, index: idxReady},
		{Timeout: storage.Timeout{ID: "far", DueAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), Attempts: math.MaxInt32}, index: idxReady,
			key: [keyLen]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8}},
	}
}

func checkRoundTrip(t *testing.T, in *record) {
	t.Helper()
	enc := encodeRecord(in)
	if enc[0] != recordVersion {
		t.Fatalf("encoding starts with %d, want version %d", enc[0], recordVersion)
	}
	out, err := decodeRecord(enc)
	if err != nil {
		t.Fatalf("decode(encode(%+v)): %v", in, err)
	}
	if diff := cmp.Diff(in, out, cmp.AllowUnexported(record{})); diff != "" {
		t.Fatalf("round trip (-in +out):\n%s", diff)
	}
	if (in.Message == nil) != (out.Message == nil) {
		t.Fatalf("Message nil %v became nil %v", in.Message == nil, out.Message == nil)
	}
	for _, tm := range []time.Time{out.DueAt, out.ReceivedAt, out.LockExpiresAt, out.NotBefore} {
		if tm.IsZero() {
			if tm != (time.Time{}) {
				t.Fatalf("zero time decoded as %#v, not time.Time{}", tm)
			}
		} else if tm.Location() != time.UTC {
			t.Fatalf("time %s decoded in %s, want UTC", tm, tm.Location())
		}
	}
	// The decoded record shares no memory with the encoding.
	if len(out.Message) > 0 {
		clear(enc)
		if !bytes.Equal(out.Message, in.Message) {
			t.Fatal("decoded Message aliases the encoded bytes")
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		checkRoundTrip(t, r)
	}
}

// A record of files written before exchange destinations, as version 1
// encoded it, the same record in version 2 with an exchange, and in
// version 3 with a saga id too: the bytes pin the format that files on disk
// hold.
var (
	recordHead = []byte{
		0x01,                                           // index: ready
		0x98, 0xea, 0x27, 0xd5, 0xdf, 0xfd, 0x4a, 0x00, // key: 2026-11-21T20:00:01Z
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, //      sequence 7
		0x02, 'v', '1', // ID
		0x06, 'o', 'r', 'd', 'e', 'r', 's', // Destination
	}
	recordTail = []byte{
		0x80, 0xbd, 0x9f, 0xa9, 0xdc, 0x03, 0x80, 0xe5, 0x9a, 0x77, // DueAt: 2026-11-21T20:00:00.25Z
		0xc0, 0xa9, 0x99, 0xa9, 0xdc, 0x03, 0xe8, 0x07, // ReceivedAt: 2026-11-21T06:00:00.000001Z
		0x05, 'b', 'o', 'd', 'y', // Message
		0x04,                                         // Attempts: 2
		0x08, 'N', 'O', '_', 'R', 'O', 'U', 'T', 'E', // LastError
		0x00,       // Lock
		0x00, 0x00, // LockExpiresAt: zero
		0x82, 0xbd, 0x9f, 0xa9, 0xdc, 0x03, 0x00, // NotBefore: 2026-11-21T20:00:01Z
	}
	recordV1 = slices.Concat([]byte{1}, recordHead, recordTail)
	recordV2 = slices.Concat([]byte{2}, recordHead, []byte{0x06, 'e', 'v', 'e', 'n', 't', 's'}, recordTail)
	recordV3 = slices.Concat([]byte{3}, recordHead, []byte{0x06, 'e', 'v', 'e', 'n', 't', 's'}, []byte{0x04, 's', 'a', 'g', 'a'}, recordTail)
)

// recordV1Decoded is what recordV1 holds.
func recordV1Decoded() *record {
	return &record{
		Timeout: storage.Timeout{
			ID:          "v1",
			Destination: "orders",
			DueAt:       time.Date(2026, 11, 21, 20, 0, 0, 250000000, time.UTC),
			ReceivedAt:  time.Date(2026, 11, 21, 6, 0, 0, 1000, time.UTC),
			Message:     []byte("body"),
			Attempts:    2,
			LastError:   "NO_ROUTE",
			NotBefore:   time.Date(2026, 11, 21, 20, 0, 1, 0, time.UTC),
		},
		index: idxReady,
		key:   indexKey(time.Date(2026, 11, 21, 20, 0, 1, 0, time.UTC), 7),
	}
}

// Records of versions 1 and 2 decode, are written back as version 3 (with
// no saga; version 1 with no exchange either), and a record cut short is
// corrupt.
func TestRecordOldVersions(t *testing.T) {
	for _, tc := range []struct {
		version  int
		raw      []byte
		exchange string
		rewrite  []byte // the exchange and saga fields of the version 3 record
	}{
		{1, recordV1, "", []byte{0, 0}},
		{2, recordV2, "events", []byte{0x06, 'e', 'v', 'e', 'n', 't', 's', 0}},
	} {
		want := recordV1Decoded()
		want.Exchange = tc.exchange
		got, err := decodeRecord(tc.raw)
		if err != nil {
			t.Fatalf("decode of a version %d record: %v", tc.version, err)
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(record{})); diff != "" {
			t.Fatalf("version %d record decoded (-want +got):\n%s", tc.version, diff)
		}
		if enc := encodeRecord(got); !bytes.Equal(enc, slices.Concat([]byte{3}, recordHead, tc.rewrite, recordTail)) {
			t.Fatalf("version %d record re-encoded as %x", tc.version, enc)
		}
		for n := range len(tc.raw) {
			if _, err := decodeRecord(tc.raw[:n]); !errors.Is(err, errCorrupt) {
				t.Fatalf("decode of %d of %d bytes of version %d: %v, want errCorrupt", n, len(tc.raw), tc.version, err)
			}
		}
	}
}

func TestRecordVersion3(t *testing.T) {
	want := recordV1Decoded()
	want.Exchange, want.SagaID = "events", "saga"
	if enc := encodeRecord(want); !bytes.Equal(enc, recordV3) {
		t.Fatalf("encoding:\n got %x\nwant %x", enc, recordV3)
	}
	got, err := decodeRecord(recordV3)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(record{})); diff != "" {
		t.Fatalf("version 3 record decoded (-want +got):\n%s", diff)
	}
}

func TestRecordDecodeRejects(t *testing.T) {
	good := encodeRecord(sampleRecords()[0])
	for n := range len(good) {
		if _, err := decodeRecord(good[:n]); !errors.Is(err, errCorrupt) {
			t.Fatalf("decode of %d of %d bytes: %v, want errCorrupt", n, len(good), err)
		}
	}
	bad := map[string][]byte{
		"version 0":     append([]byte{0}, good[1:]...),
		"version 4":     append([]byte{4}, good[1:]...),
		"index 0":       append([]byte{recordVersion, 0}, good[2:]...),
		"index 3":       append([]byte{recordVersion, 3}, good[2:]...),
		"trailing byte": append(slices.Clone(good), 0),
	}
	// Nanoseconds of 1e9 in the last time field (NotBefore is last).
	z := encodeRecord(&record{Timeout: storage.Timeout{ID: "z"}, index: idxReady})
	bad["nanoseconds 1e9"] = append(z[:len(z)-1], 0x80, 0x94, 0xeb, 0xdc, 0x03)
	// Seconds so low that converting them to Unix time would overflow.
	lowSec := append(slices.Clone(z[:len(z)-2]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00)
	bad["seconds out of range"] = lowSec
	for name, b := range bad {
		if r, err := decodeRecord(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: decode = %+v, %v; want errCorrupt", name, r, err)
		}
	}
}

func TestKeyOrder(t *testing.T) {
	times := []time.Time{
		{},
		time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, math.MinInt64),
		time.Unix(0, math.MinInt64+1),
		time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(-1, 999999999),
		time.Unix(0, 0),
		time.Unix(0, 1),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, math.MaxInt64),
		time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := 1; i < len(times); i++ {
		a, b := keyTime(times[i-1]), keyTime(times[i])
		inRange := !times[i-1].Before(minKeyTime) && !times[i].After(maxKeyTime)
		if a > b || (inRange && a == b) {
			t.Errorf("keyTime(%s) = %x, keyTime(%s) = %x: not ordered", times[i-1], a, times[i], b)
		}
	}
	k1, k2 := indexKey(times[6], 2), indexKey(times[6], 10)
	if bytes.Compare(k1[:], k2[:]) >= 0 {
		t.Error("equal times do not order by sequence")
	}
}

// FuzzRecordRoundTrip encodes a record built from the inputs and decodes it
// back; it also decodes the raw input as a record, which must fail cleanly or
// give a record that survives another round trip.
func FuzzRecordRoundTrip(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(r.ID, r.Destination, r.Exchange, r.LastError, r.Lock, r.Message, r.Message == nil, int64(r.Attempts),
			r.DueAt.Unix(), r.ReceivedAt.Unix(), r.LockExpiresAt.Unix(), r.NotBefore.Unix(), uint64(r.DueAt.Nanosecond()),
			r.index == idxLeased, uint64(42), encodeRecord(r))
	}
	f.Add("", "", "", "", "", []byte(nil), true, int64(0), int64(0), int64(0), int64(0), int64(0), uint64(0), false, uint64(0), []byte{1, 1})
	f.Add("", "", "", "", "", []byte(nil), true, int64(0), int64(0), int64(0), int64(0), int64(0), uint64(0), false, uint64(0), recordV1)
	f.Fuzz(func(t *testing.T, id, dest, exchange, lastErr, lock string, msg []byte, nilMsg bool, attempts int64,
		due, recv, lexp, nb int64, nsec uint64, leased bool, seq uint64, raw []byte) {
		// Keep times within what time.Time represents without overflow.
		tm := func(sec int64, ns uint64) time.Time {
			return time.Unix(sec%(1<<60), int64(ns%1e9))
		}
		if nilMsg {
			msg = nil
		}
		in := &record{
			Timeout: storage.Timeout{
				ID: id, Destination: dest, Exchange: exchange, LastError: lastErr, Lock: lock,
				Message:       msg,
				Attempts:      int(attempts),
				DueAt:         tm(due, nsec).UTC(),
				ReceivedAt:    tm(recv, nsec/3).UTC(),
				LockExpiresAt: tm(lexp, nsec/7).UTC(),
				NotBefore:     tm(nb, nsec/11).UTC(),
			},
			index: idxReady,
		}
		if leased {
			in.index = idxLeased
		}
		in.key = indexKey(in.LockExpiresAt, seq)
		// time.Time{} and the zero instant in UTC compare equal with cmp
		// (Equal) but the codec returns time.Time{}: normalise the input.
		for _, p := range []*time.Time{&in.DueAt, &in.ReceivedAt, &in.LockExpiresAt, &in.NotBefore} {
			if p.IsZero() {
				*p = time.Time{}
			}
		}
		checkRoundTrip(t, in)
		fuzzRecord(t, raw) // as FuzzDecoders checks it
	})
}

// rowDest reads the destination decodeRow would, and fails on a row cut
// before the end of its exchange or of another version.
func TestRowDest(t *testing.T) {
	for _, r := range sampleRecords() {
		row := encodeRow(&r.Timeout)
		full, err := decodeRow(row, false)
		if err != nil {
			t.Fatal(err)
		}
		exchange, key, err := rowDest(row)
		if err != nil || string(exchange) != full.Exchange || string(key) != full.Destination {
			t.Fatalf("rowDest = %q, %q, %v; want %q, %q", exchange, key, err, full.Exchange, full.Destination)
		}
		head := len(codec.AppendString(codec.AppendString(codec.AppendString([]byte{rowVersion}, r.ID), r.Destination), r.Exchange))
		for n := range head {
			if _, _, err := rowDest(row[:n]); !errors.Is(err, errCorrupt) {
				t.Fatalf("rowDest of %d of %d bytes: %v, want errCorrupt", n, head, err)
			}
		}
		for _, v := range []byte{rowVersion4 - 1, rowVersion + 1} {
			if _, _, err := rowDest(append([]byte{v}, row[1:]...)); !errors.Is(err, errCorrupt) {
				t.Fatalf("rowDest of version %d: %v, want errCorrupt", v, err)
			}
		}
	}
}

// A row of version 4 (format 2 before fingerprints) and the same row in
// version 5 with a fingerprint: the bytes pin what files on disk hold. A
// version 4 row decodes without a fingerprint; version 5 keeps nil and
// empty apart, as Message.
func TestRowVersions(t *testing.T) {
	head := slices.Concat(
		[]byte{0x02, 'v', '4'},                     // ID
		[]byte{0x06, 'o', 'r', 'd', 'e', 'r', 's'}, // Destination
		[]byte{0x00},                     // Exchange
		[]byte{0x00},                     // SagaID
		recordTail[:10],                  // DueAt: 2026-11-21T20:00:00.25Z
		recordTail[10:18],                // ReceivedAt
		[]byte{0x05, 'b', 'o', 'd', 'y'}, // Message
		[]byte{0x04},                     // Attempts: 2
		[]byte{0x00},                     // LastError
		[]byte{0x00, 0x00},               // NotBefore: zero
	)
	want := storage.Timeout{ID: "v4", Destination: "orders",
		DueAt:      time.Date(2026, 11, 21, 20, 0, 0, 250000000, time.UTC),
		ReceivedAt: time.Date(2026, 11, 21, 6, 0, 0, 1000, time.UTC),
		Message:    []byte("body"), Attempts: 2}
	v4 := slices.Concat([]byte{4}, head)
	got, err := decodeRow(v4, true)
	if err != nil {
		t.Fatalf("decode of a version 4 row: %v", err)
	}
	if diff := cmp.Diff(&want, got); diff != "" || got.Fingerprint != nil {
		t.Fatalf("version 4 row (-want +got):\n%s (fingerprint %x)", diff, got.Fingerprint)
	}
	want.Fingerprint = []byte{0xab, 0xcd}
	v5 := slices.Concat([]byte{5}, head, []byte{0x03, 0xab, 0xcd})
	if enc := encodeRow(&want); !bytes.Equal(enc, v5) {
		t.Fatalf("encodeRow = %x, want %x", enc, v5)
	}
	for _, fp := range [][]byte{nil, {}, want.Fingerprint} {
		in := want
		in.Fingerprint = fp
		out, err := decodeRow(encodeRow(&in), true)
		if err != nil {
			t.Fatalf("decode of a version 5 row: %v", err)
		}
		if !bytes.Equal(out.Fingerprint, fp) || (out.Fingerprint == nil) != (fp == nil) {
			t.Fatalf("fingerprint %#v came back %#v", fp, out.Fingerprint)
		}
	}
	if _, err := decodeRow(append(v5, 0), true); !errors.Is(err, errCorrupt) {
		t.Fatalf("a version 5 row with a trailing byte: %v, want errCorrupt", err)
	}
	if _, err := decodeRow(v5[:len(v5)-1], true); !errors.Is(err, errCorrupt) {
		t.Fatalf("a version 5 row cut in its fingerprint: %v, want errCorrupt", err)
	}
}
