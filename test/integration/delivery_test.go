package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	amqp "github.com/rabbitmq/amqp091-go"
)

// livenessBound is how long a due message may take to show up before the
// test calls it lost. It is a liveness check only, never a latency claim.
const livenessBound = 10 * time.Second

// quietPeriod is how long a test keeps listening after the expected
// deliveries arrived, to catch duplicates.
const quietPeriod = 1500 * time.Millisecond

// TestHeaderStyles: every accepted spelling of destination and due time
// (docs/contract.md §2) delivers exactly once, never early, without the due-time
// headers.
func TestHeaderStyles(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, nil)

	plus2 := time.FixedZone("+02:00", 2*60*60)
	type tc struct {
		name string
		// headers builds the due-time and destination headers for queue
		// dest given the time just before publishing; it returns the
		// earliest instant the message may arrive.
		headers func(dest string, before time.Time) (amqp.Table, time.Time)
	}
	delay := func(v any, ms int) func(string, time.Time) (amqp.Table, time.Time) {
		return func(dest string, before time.Time) (amqp.Table, time.Time) {
			return amqp.Table{"x-destination": dest, "x-delay": v}, before.Add(time.Duration(ms) * time.Millisecond)
		}
	}
	cases := []tc{
		{"x-due-at-Z", func(dest string, before time.Time) (amqp.Table, time.Time) {
			due := before.Add(1500 * time.Millisecond).UTC()
			return amqp.Table{"x-destination": dest, "x-due-at": due.Format(time.RFC3339Nano)}, due
		}},
		{"x-due-at-offset-fraction", func(dest string, before time.Time) (amqp.Table, time.Time) {
			due := before.Add(1700 * time.Millisecond).Truncate(time.Millisecond).In(plus2)
			// e.g. 2026-11-21T22:00:00.250+02:00
			return amqp.Table{"x-destination": dest, "x-due-at": due.Format("2006-01-02T15:04:05.000-07:00")}, due
		}},
		{"nsb-expire", func(dest string, before time.Time) (amqp.Table, time.Time) {
			s, due := nsbExpire(before.Add(1600 * time.Millisecond))
			return amqp.Table{"x-destination": dest, "NServiceBus.Timeout.Expire": s}, due
		}},
		{"nsb-expire-nsb-destination", func(dest string, before time.Time) (amqp.Table, time.Time) {
			s, due := nsbExpire(before.Add(1200 * time.Millisecond))
			return amqp.Table{"NServiceBus.Timeout.RouteExpiredTimeoutTo": dest, "NServiceBus.Timeout.Expire": s}, due
		}},
		{"x-delay-nsb-destination", func(dest string, before time.Time) (amqp.Table, time.Time) {
			return amqp.Table{"NServiceBus.Timeout.RouteExpiredTimeoutTo": dest, "x-delay": int32(1300)}, before.Add(1300 * time.Millisecond)
		}},
		{"x-delay-int8", delay(int8(120), 120)},
		{"x-delay-int16", delay(int16(1500), 1500)},
		{"x-delay-int32", delay(int32(1500), 1500)},
		{"x-delay-int64", delay(int64(1500), 1500)},
		{"x-delay-uint8", delay(uint8(250), 250)},
		{"x-delay-uint16", delay(uint16(1500), 1500)},
		{"x-delay-uint32", delay(uint32(1500), 1500)},
		{"x-delay-string", delay("1500", 1500)},
		// Truncated toward zero, as the delayed-message-exchange plugin does.
		{"x-delay-float64", delay(float64(1500.9), 1500)},
		{"x-delay-float32", delay(float32(1250.5), 1250)},
		{"x-due-at-wins-over-x-delay", func(dest string, before time.Time) (amqp.Table, time.Time) {
			// Several due-time headers: x-due-at comes first in §2's list.
			due := before.Add(2 * time.Second).UTC()
			return amqp.Table{"x-destination": dest, "x-due-at": due.Format(time.RFC3339Nano), "x-delay": int32(0)}, due
		}},
	}

	type sent struct {
		tc
		dest      string
		notBefore time.Time
		consumer  *consumer
	}
	var all []*sent
	for _, c := range cases {
		s := &sent{tc: c, dest: b.Endpoint + ".dst." + c.name}
		s.consumer = declareAndConsume(t, conn, s.dest)
		all = append(all, s)
	}
	for _, s := range all {
		before := time.Now()
		h, notBefore := s.headers(s.dest, before)
		h["test-case"] = s.name
		s.notBefore = notBefore
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{
			MessageId: "msg-" + s.name, Headers: h, Body: []byte("body of " + s.name),
		})
	}
	for _, s := range all {
		t.Run(s.name, func(t *testing.T) {
			s.consumer.WaitFor(1, livenessBound)
			got := s.consumer.Quiet(200 * time.Millisecond)
			if len(got) != 1 {
				t.Fatalf("got %d deliveries, want exactly 1", len(got))
			}
			d := got[0]
			if d.At.Before(s.notBefore) {
				t.Errorf("delivered %s EARLY: arrived %s, due no earlier than %s",
					s.notBefore.Sub(d.At), d.At.Format(time.RFC3339Nano), s.notBefore.Format(time.RFC3339Nano))
			}
			if string(d.Body) != "body of "+s.name {
				t.Errorf("body = %q", d.Body)
			}
			if d.MessageId != "msg-"+s.name {
				t.Errorf("message-id = %q, want %q", d.MessageId, "msg-"+s.name)
			}
			for _, h := range dueTimeHeaders {
				if v, ok := d.Headers[h]; ok {
					t.Errorf("forwarded message still has due-time header %s = %v", h, v)
				}
			}
			if headerString(d.Headers, "test-case") != s.name {
				t.Errorf("header test-case = %v, want %q", d.Headers["test-case"], s.name)
			}
			t.Logf("arrived %s after its earliest due time", d.At.Sub(s.notBefore).Round(time.Millisecond))
		})
	}
	// Everything delivered once; wait a little for late duplicates.
	time.Sleep(quietPeriod)
	for _, s := range all {
		if n := s.consumer.Count(); n != 1 {
			t.Errorf("%s: %d deliveries after the quiet period, want exactly 1", s.name, n)
		}
	}
}

// TestFaithfulForwarding: body, every property but user-id, and headers of
// every AMQP field type survive the delay unchanged (docs/contract.md §3).
func TestFaithfulForwarding(t *testing.T) {
	t.Parallel()
	b, conn, pub, dest, c := startWithDest(t)

	body := make([]byte, 256*4)
	for i := range body {
		body[i] = byte(i)
	}
	stamp := time.Unix(time.Now().Unix()-3600, 0) // AMQP timestamps carry whole seconds
	headers := amqp.Table{
		"x-destination": dest,
		"s-string":      "héllo wörld",
		"s-empty":       "",
		"x-bytes":       []byte{0, 1, 2, 0xfe, 0xff},
		"t-true":        true,
		"t-false":       false,
		"b-int8":        int8(-7),
		"B-uint8":       uint8(250),
		"s-int16":       int16(-30000),
		"u-uint16":      uint16(65000),
		"I-int32":       int32(-2000000000),
		"i-uint32":      uint32(4000000000),
		"l-int64":       int64(-9000000000000000000),
		"f-float32":     float32(3.25),
		"d-float64":     float64(-1.0e300),
		"D-decimal":     amqp.Decimal{Scale: 3, Value: -123456},
		"T-time":        stamp,
		"F-table": amqp.Table{
			"inner-string": "x",
			"inner-int64":  int64(42),
			"inner-table":  amqp.Table{"deep": true},
			"inner-array":  []any{int32(1), "two"},
		},
		"A-array": []any{"a", int64(1), true, nil, []byte("raw"), amqp.Table{"k": "v"}, []any{int16(3)}, float64(2.5), stamp},
		"A-empty": []any{},
		"V-void":  nil,
		// Look-alikes of bridge headers that are not due-time headers stay.
		"x-delayed":                  "not x-delay",
		"NServiceBus.MessageIntent":  "Send",
		"NServiceBus.ConversationId": "conv-1",
	}
	before := time.Now()
	due := before.Add(1200 * time.Millisecond).UTC()
	headers["x-due-at"] = due.Format(time.RFC3339Nano)

	sent := amqp.Publishing{
		Headers:         headers,
		ContentType:     "application/x-test",
		ContentEncoding: "identity",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-123",
		ReplyTo:         "reply-queue",
		Expiration:      "600000",
		MessageId:       "faithful-" + randomHex(4),
		Timestamp:       stamp,
		Type:            "test.type",
		UserId:          "guest",
		AppId:           "integration-test",
		Body:            body,
	}
	pub.Publish(b.TimeoutsQueue(), sent)
	// The same message published straight to a queue shows what the broker
	// and client library themselves do to it (for instance an empty array
	// reads back as a nil slice): the forward must be indistinguishable.
	control := b.Endpoint + ".control"
	cc := declareAndConsume(t, conn, control)
	direct := sent
	direct.Headers = amqp.Table{}
	for k, v := range headers {
		if k != "x-due-at" {
			direct.Headers[k] = v
		}
	}
	direct.UserId = ""
	pub.Publish(control, direct)
	ctl := cc.WaitFor(1, livenessBound)[0]

	c.WaitFor(1, livenessBound)
	got := c.Quiet(quietPeriod)
	if len(got) != 1 {
		t.Fatalf("got %d deliveries, want exactly 1", len(got))
	}
	d := got[0]
	if d.At.Before(due) {
		t.Errorf("delivered EARLY: at %s, due %s", d.At.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
	}

	wantHeaders := amqp.Table{}
	for k, v := range headers {
		wantHeaders[k] = v
	}
	delete(wantHeaders, "x-due-at")
	if diff := cmp.Diff(wantHeaders, d.Headers, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("forwarded headers differ (-sent minus due-time headers, +forwarded):\n%s", diff)
	}
	if diff := cmp.Diff(ctl.Headers, d.Headers); diff != "" {
		t.Errorf("forwarded headers differ from the same headers published directly (-direct, +forwarded):\n%s", diff)
	}
	type props struct {
		ContentType, ContentEncoding        string
		DeliveryMode, Priority              uint8
		CorrelationId, ReplyTo, Expiration  string
		MessageId                           string
		Timestamp                           time.Time
		Type, UserId, AppId, Exchange, RKey string
	}
	want := props{
		ContentType: sent.ContentType, ContentEncoding: sent.ContentEncoding,
		DeliveryMode: sent.DeliveryMode, Priority: sent.Priority,
		CorrelationId: sent.CorrelationId, ReplyTo: sent.ReplyTo, Expiration: sent.Expiration,
		MessageId: sent.MessageId, Timestamp: sent.Timestamp, Type: sent.Type,
		UserId: "", // dropped by contract
		AppId:  sent.AppId, Exchange: "", RKey: dest,
	}
	propsOf := func(a arrival) props {
		return props{
			ContentType: a.ContentType, ContentEncoding: a.ContentEncoding,
			DeliveryMode: a.DeliveryMode, Priority: a.Priority,
			CorrelationId: a.CorrelationId, ReplyTo: a.ReplyTo, Expiration: a.Expiration,
			MessageId: a.MessageId, Timestamp: a.Timestamp, Type: a.Type,
			UserId: a.UserId, AppId: a.AppId, Exchange: a.Exchange, RKey: a.RoutingKey,
		}
	}
	if diff := cmp.Diff(want, propsOf(d)); diff != "" {
		t.Errorf("forwarded properties differ (-want, +got):\n%s", diff)
	}
	want.RKey = control
	if diff := cmp.Diff(want, propsOf(ctl)); diff != "" {
		t.Errorf("sanity: the broker changed the properties of a direct publish (-want, +got):\n%s", diff)
	}
	if diff := cmp.Diff(body, d.Body); diff != "" {
		t.Errorf("forwarded body differs (-sent, +forwarded):\n%s", diff)
	}
}

var uuidForm = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// TestGeneratedMessageID: without message-id and NServiceBus.MessageId the
// bridge assigns a unique id and puts it in message-id (docs/contract.md §2).
func TestGeneratedMessageID(t *testing.T) {
	t.Parallel()
	b, _, pub, dest, c := startWithDest(t)

	for i := range 3 {
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{
			Headers: amqp.Table{"x-destination": dest, "x-delay": int32(300), "n": int32(i)},
			Body:    []byte(fmt.Sprint("no id ", i)),
		})
	}
	c.WaitFor(3, livenessBound)
	got := c.Quiet(quietPeriod)
	if len(got) != 3 {
		t.Fatalf("got %d deliveries, want 3 (messages without an id must not be merged or duplicated)", len(got))
	}
	seen := map[string]bool{}
	for _, d := range got {
		if !uuidForm.MatchString(d.MessageId) {
			t.Errorf("%q: forwarded message-id = %q, want a UUID", d.Body, d.MessageId)
		}
		if seen[d.MessageId] {
			t.Errorf("message-id %q assigned twice", d.MessageId)
		}
		seen[d.MessageId] = true
	}
}

// TestDueInThePast: a due time in the past is due at once (docs/contract.md §2).
func TestDueInThePast(t *testing.T) {
	t.Parallel()
	b, _, pub, dest, c := startWithDest(t)

	hourAgo := time.Now().Add(-time.Hour)
	expire, _ := nsbExpire(hourAgo)
	cases := map[string]amqp.Table{
		"x-due-at-hour-ago":     {"x-due-at": hourAgo.UTC().Format(time.RFC3339Nano)},
		"x-due-at-year-2000":    {"x-due-at": "2000-01-01T00:00:00Z"},
		"x-due-at-year-1":       {"x-due-at": "0001-01-01T00:00:00Z"},
		"x-due-at-year-1600":    {"x-due-at": "1600-06-01T12:00:00.5+01:00"},
		"nsb-expire-hour-ago":   {"NServiceBus.Timeout.Expire": expire},
		"x-delay-zero":          {"x-delay": int32(0)},
		"x-delay-negative":      {"x-delay": int32(-5000)},
		"x-delay-negative-i64":  {"x-delay": int64(-1 << 40)},
		"x-delay-negative-text": {"x-delay": "-250"},
	}
	start := time.Now()
	for name, h := range cases {
		h["x-destination"] = dest
		pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: name, Headers: h, Body: []byte(name)})
	}
	c.WaitFor(len(cases), livenessBound)
	got := c.Quiet(quietPeriod)
	count := map[string]int{}
	for _, d := range got {
		count[d.MessageId]++
		t.Logf("%s delivered %s after publishing started", d.MessageId, d.At.Sub(start).Round(time.Millisecond))
	}
	for name := range cases {
		if count[name] != 1 {
			t.Errorf("%s: %d deliveries, want exactly 1", name, count[name])
		}
	}
}

// TestScheduleCommand: `delaybridge schedule --to Q --in 1s hello` schedules
// a message the running bridge delivers after at least a second.
func TestScheduleCommand(t *testing.T) {
	t.Parallel()
	b, _, _, dest, c := startWithDest(t)

	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint}
	before := time.Now()
	p := execBridge(t, env, "schedule", "--to", dest, "--in", "1s", "hello")
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Fatalf("schedule exited with code %d, want 0; stderr:\n%s", code, p.Stderr())
	}
	c.WaitFor(1, livenessBound)
	got := c.Quiet(quietPeriod)
	if len(got) != 1 {
		t.Fatalf("got %d deliveries, want 1", len(got))
	}
	d := got[0]
	if string(d.Body) != "hello" {
		t.Errorf("body = %q, want %q", d.Body, "hello")
	}
	if earliest := before.Add(time.Second); d.At.Before(earliest) {
		t.Errorf("delivered EARLY: %s after starting schedule, want at least 1s", d.At.Sub(before))
	}
	for _, h := range dueTimeHeaders {
		if _, ok := d.Headers[h]; ok {
			t.Errorf("forwarded message has due-time header %s", h)
		}
	}

	t.Run("at", func(t *testing.T) {
		due := time.Now().Add(1500 * time.Millisecond).UTC().Truncate(time.Millisecond)
		p := execBridge(t, env, "schedule", "--to", dest, "--at", due.Format(time.RFC3339Nano),
			"--id", "sched-at", "--header", "k=v", "at body")
		if code := p.Wait(30 * time.Second); code != 0 {
			t.Fatalf("schedule --at exited with code %d, want 0; stderr:\n%s", code, p.Stderr())
		}
		got := c.WaitFor(2, livenessBound)
		d := got[1]
		if string(d.Body) != "at body" || d.MessageId != "sched-at" || headerString(d.Headers, "k") != "v" {
			t.Errorf("got body %q, message-id %q, header k=%v; want \"at body\", sched-at, v", d.Body, d.MessageId, d.Headers["k"])
		}
		if d.At.Before(due) {
			t.Errorf("delivered EARLY: at %s, due %s", d.At.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
		}
	})
}

// TestFaithfulForwardingExtremeTimestamps: AMQP timestamps are 64-bit
// seconds, so a timestamp property or header outside 1678–2262 (for example
// .NET's DateTime.MaxValue, 9999-12-31, a common "never" sentinel) must be
// forwarded unchanged like any other value (docs/contract.md §3 "Faithful").
func TestFaithfulForwardingExtremeTimestamps(t *testing.T) {
	t.Parallel()
	b, conn, pub, dest, c := startWithDest(t)
	control := b.Endpoint + ".control"
	cc := declareAndConsume(t, conn, control)

	far := time.Date(2300, 1, 2, 3, 4, 5, 0, time.UTC)
	headers := amqp.Table{
		"T-year-9999":   time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		"T-year-2300":   far,
		"T-year-1600":   time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC),
		"A-far-in-list": []any{far},
		"F-far-nested":  amqp.Table{"at": far},
		"x-destination": dest, // kept by the forward, so sent to the control queue too
	}
	direct := amqp.Publishing{MessageId: "extreme-ts", Timestamp: far, Headers: headers, Body: []byte("x")}
	pub.Publish(control, direct)
	ctl := cc.WaitFor(1, livenessBound)[0]

	delayed := direct
	delayed.Headers = amqp.Table{"x-delay": int32(0)}
	for k, v := range headers {
		delayed.Headers[k] = v
	}
	pub.Publish(b.TimeoutsQueue(), delayed)
	d := c.WaitFor(1, livenessBound)[0]

	if !ctl.Timestamp.Equal(far) {
		t.Fatalf("sanity: a direct publish changed the timestamp to %s", ctl.Timestamp)
	}
	if !d.Timestamp.Equal(ctl.Timestamp) {
		t.Errorf("timestamp property forwarded as %s, sent %s", d.Timestamp.UTC(), ctl.Timestamp.UTC())
	}
	if diff := cmp.Diff(ctl.Headers, d.Headers); diff != "" {
		t.Errorf("timestamp headers changed by the delay (-published directly, +forwarded):\n%s", diff)
	}
}

// TestDueAtLowercaseRFC3339: RFC 3339 §5.6 allows the "T" and "Z" of a
// timestamp to be lower case ("NOTE: Per [ABNF] and ISO8601, the "T" and "Z"
// characters in this syntax may alternatively be lower case"), and docs/contract.md
// §2 accepts any RFC 3339 timestamp in x-due-at.
func TestDueAtLowercaseRFC3339(t *testing.T) {
	t.Parallel()
	b, conn, pub := startWithPublisher(t, nil)
	errs := consume(t, conn, b.ErrorQ)
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)

	due := time.Now().Add(time.Second).UTC().Truncate(time.Millisecond)
	s := strings.ToLower(due.Format("2006-01-02T15:04:05.000Z")) // 2026-11-21t20:00:00.250z
	pub.Publish(b.TimeoutsQueue(), amqp.Publishing{MessageId: "lower", Body: []byte(s),
		Headers: amqp.Table{"x-destination": dest, "x-due-at": s}})
	got := c.WaitUntil(livenessBound, "the delivery", func(a []arrival) bool { return len(a) > 0 || errs.Count() > 0 })
	if len(got) == 0 {
		e := errs.All()[0]
		t.Fatalf("x-due-at %q (valid RFC 3339) was moved to the error queue: %s", s, headerString(e.Headers, hError))
	}
	if got[0].At.Before(due) {
		t.Errorf("delivered EARLY: at %s, due %s", got[0].At.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
	}
}
