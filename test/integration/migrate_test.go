package integration

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/logtest"
	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/management"
)

// bindingsOf lists the bindings whose source is exchange x, through the
// management API.
func bindingsOf(t *testing.T, x string) []management.Binding {
	t.Helper()
	c, err := management.New(testenv.ManagementURL(t), amqpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := c.BindingsFrom(context.Background(), x)
	if err != nil {
		t.Fatalf("the bindings of %s: %v", x, err)
	}
	return bs
}

// describeBindings is each binding's destination and key, sorted.
func describeBindings(bs []management.Binding) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.DestinationType+" "+b.Destination+" "+b.RoutingKey)
	}
	slices.Sort(out)
	return out
}

// TestMigrateBindings: a consumer's queue bound by amqplib to a delayed
// exchange itself, as it was bound to the plugin's exchange, gets a delayed
// message at once; the bridge reports that binding (one warning in its log,
// the metric, a problem on the status page). delaybridge migrate-bindings
// shows the move and changes nothing, with --apply moves the binding to
// <name>.route (same queue, same key) and leaves the bridge's own, and run
// again moves nothing. Then the bridge's report clears, and delays work.
func TestMigrateBindings(t *testing.T) {
	t.Parallel()
	node := amqplibNode(t)
	mgmt := testenv.ManagementURL(t)
	name := delayedExchange(t, "migrate")
	b := startBridge(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic", "DELAYBRIDGE_POLL_INTERVAL": "100ms",
		"DELAYBRIDGE_MANAGEMENT_URL": mgmt, "DELAYBRIDGE_BINDING_CHECK_INTERVAL": "1s"})
	q := b.Endpoint + ".orders"
	deleteQueuesOnCleanup(t, q)
	var bound struct{ Bound bool }
	runNode(t, node, "plugin-way.js", map[string]any{"op": "bind", "url": amqpURL, "exchange": name, "queue": q, "pattern": "orders.*"}, &bound)
	if !bound.Bound {
		t.Fatal("amqplib did not bind")
	}

	series := `delaybridge_delayed_exchange_foreign_bindings{exchange="` + name + `"}`
	waitMetrics(t, b, livenessBound, "the foreign binding counted", func(m map[string]float64) bool { return m[series] == 1 })
	waitLog(t, b, "foreign bindings on a delayed exchange", name)
	if page := getStatusPage(t, b); !strings.Contains(page, "foreign binding on a delayed exchange") || !strings.Contains(page, q) {
		t.Errorf("the status page does not name the foreign binding")
	}
	// What it breaks: a message delayed by a minute reaches the queue at once.
	conn := dial(t)
	got := consume(t, conn, q)
	pub := newPublisher(t, conn)
	pub.PublishTo(name, "orders.created", amqp.Publishing{MessageId: "at-once", Headers: amqp.Table{"x-delay": int32(60000)}})
	if a := got.WaitFor(1, livenessBound); a[0].MessageId != "at-once" || a[0].Exchange != name {
		t.Fatalf("got %q through %q, want at-once through %q at once", a[0].MessageId, a[0].Exchange, name)
	}

	env := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint, "DELAYBRIDGE_MANAGEMENT_URL": mgmt}
	migrate := func(args ...string) string {
		t.Helper()
		p := execBridge(t, env, append([]string{"migrate-bindings", "--exchange", name}, args...)...)
		if code := p.Wait(time.Minute); code != 0 {
			t.Fatalf("migrate-bindings %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, p.stdout.String(), p.Stderr())
		}
		return p.stdout.String()
	}
	own := "queue " + b.TimeoutsQueue() + " "
	before := describeBindings(bindingsOf(t, name))
	if !slices.Equal(before, []string{own, "queue " + q + " orders.*"}) {
		t.Fatalf("bindings of %s before: %q", name, before)
	}
	out := migrate()
	if !strings.Contains(out, `queue "`+q+`", routing key "orders.*"`) || !strings.Contains(out, "dry run") || strings.Contains(out, b.TimeoutsQueue()) {
		t.Errorf("the dry run printed:\n%s", out)
	}
	if after := describeBindings(bindingsOf(t, name)); !slices.Equal(after, before) {
		t.Errorf("the dry run changed the bindings: %q", after)
	}
	out = migrate("--apply")
	if !strings.Contains(out, `moved queue "`+q+`", routing key "orders.*"`) {
		t.Errorf("--apply printed:\n%s", out)
	}
	if after := describeBindings(bindingsOf(t, name)); !slices.Equal(after, []string{own}) {
		t.Errorf("bindings of %s after --apply: %q, want the bridge's own", name, after)
	}
	if route := describeBindings(bindingsOf(t, name+".route")); !slices.Equal(route, []string{"queue " + q + " orders.*"}) {
		t.Errorf("bindings of %s.route after --apply: %q", name, route)
	}
	if out := migrate("--apply"); !strings.Contains(out, "nothing to move") || strings.Contains(out, "moved") {
		t.Errorf("run again, --apply printed:\n%s", out)
	}

	waitMetrics(t, b, livenessBound, "no foreign binding counted", func(m map[string]float64) bool { return m[series] == 0 })
	waitLog(t, b, "no foreign binding any more", name)
	if page := getStatusPage(t, b); strings.Contains(page, "foreign binding on a delayed exchange") {
		t.Errorf("the status page still names a foreign binding")
	}
	if n := logtest.CountLines(b.Stderr(), "foreign bindings on a delayed exchange"); n != 1 {
		t.Errorf("%d log lines about the foreign binding, want 1", n)
	}
	// Delays work again: through the bridge, to <name>.route, not before.
	sent := time.Now()
	pub.PublishTo(name, "orders.paid", amqp.Publishing{MessageId: "delayed", Headers: amqp.Table{"x-delay": int32(1500)}})
	a := got.WaitUntil(livenessBound, "the delayed message", func(as []arrival) bool {
		return slices.ContainsFunc(as, func(a arrival) bool { return a.MessageId == "delayed" })
	})
	for _, d := range a {
		if d.MessageId == "delayed" && (d.Exchange != name+".route" || d.At.Before(sent.Add(1500*time.Millisecond))) {
			t.Errorf("delayed came through %q after %s", d.Exchange, d.At.Sub(sent))
		}
	}
}

// migrate-bindings says what is wrong, exit 1, and changes nothing: the
// management API off, a user it refuses (no permission on the vhost), an
// exchange that is not a delayed one, and a delayed exchange bound by a
// bridge of another endpoint than DELAYBRIDGE_ENDPOINT (moving that binding
// would send every message to that bridge). No message shows a password.
// Usage errors exit 2.
func TestMigrateBindingsRefuses(t *testing.T) {
	t.Parallel()
	mgmt := testenv.ManagementURL(t)
	name := delayedExchange(t, "refuses")
	b := startBridge(t, map[string]string{"DELAYBRIDGE_DELAYED_EXCHANGES": name + ":topic"})
	conn := dial(t)
	plain := b.Endpoint + ".plain"
	deleteExchangesOnCleanup(t, plain)
	declareExchange(t, conn, plain, amqp.ExchangeTopic)
	q := b.Endpoint + ".orders"
	bindAndConsume(t, conn, q, name, "orders.*", nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	_ = ln.Close()
	user, password := testenv.ManagementUser(t, "management")
	m, err := url.Parse(mgmt)
	if err != nil {
		t.Fatal(err)
	}
	m.User = url.UserPassword(user, password)
	base := map[string]string{"DELAYBRIDGE_AMQP_URL": amqpURL, "DELAYBRIDGE_ENDPOINT": b.Endpoint, "DELAYBRIDGE_MANAGEMENT_URL": mgmt}
	for _, c := range []struct {
		name  string
		env   map[string]string
		args  []string
		code  int
		hints []string
	}{
		{"management API off", nil, []string{"--exchange", name, "--apply", "--management-url", closed},
			1, []string{"does not answer", "rabbitmq-plugins enable rabbitmq_management"}},
		{"no permission", nil, []string{"--exchange", name, "--apply", "--management-url", m.String()},
			1, []string{"refused", user, "read permission"}},
		{"not a delayed exchange", nil, []string{"--exchange", plain, "--apply"},
			1, []string{"is not a delayed exchange of the bridge", "DELAYBRIDGE_DELAYED_EXCHANGES"}},
		{"another endpoint", map[string]string{"DELAYBRIDGE_ENDPOINT": b.Endpoint + "-other"}, []string{"--exchange", name, "--apply"},
			1, []string{"a bridge's binding", b.TimeoutsQueue(), "DELAYBRIDGE_ENDPOINT", "nothing was moved"}},
		{"no exchange", nil, nil, 2, []string{"name a delayed exchange with --exchange"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range c.env {
				env[k] = v
			}
			p := execBridge(t, env, append([]string{"migrate-bindings"}, c.args...)...)
			if code := p.Wait(time.Minute); code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, p.stdout.String(), p.Stderr())
			}
			msg := p.Stderr()
			for _, h := range c.hints {
				if !strings.Contains(msg, h) {
					t.Errorf("stderr does not say %q:\n%s", h, msg)
				}
			}
			if strings.Contains(msg+p.stdout.String(), password) {
				t.Errorf("the output shows the password")
			}
		})
	}
	if bs := describeBindings(bindingsOf(t, name)); !slices.Equal(bs, []string{"queue " + b.TimeoutsQueue() + " ", "queue " + q + " orders.*"}) {
		t.Errorf("bindings of %s after the refusals: %q", name, bs)
	}
}

// TestAmqplibDeclaresThePluginsExchange: without the delayed-message-exchange
// plugin, amqplib's declaration of an x-delayed-message exchange, which
// code written for the plugin makes on every start, is refused; RabbitMQ
// before rabbitmq-server PR #11214 (3.10 here) refuses it with 503
// COMMAND_INVALID, a connection error: amqplib's connection closes with every
// channel on it (docs/protocols/delayed-exchange.md). With that PR (4.x) it
// is a 406 channel error and the connection lives on.
func TestAmqplibDeclaresThePluginsExchange(t *testing.T) {
	t.Parallel()
	node := amqplibNode(t)
	conn := dial(t)
	version, _ := conn.Properties["version"].(string)
	name := delayedExchange(t, "plugin")
	var res struct {
		Declared         bool
		Error            *string
		ChannelClosed    bool
		ConnectionClosed bool
		ConnectionError  *string
		ConnectionUsable bool
	}
	runNode(t, node, "plugin-way.js", map[string]any{"op": "declare", "url": amqpURL, "exchange": name, "delayedType": "topic"}, &res)
	t.Logf("RabbitMQ %s: %+v", version, res)
	if res.Declared {
		t.Fatalf("RabbitMQ %s took an x-delayed-message exchange: is the plugin enabled?", version)
	}
	switch {
	case strings.HasPrefix(version, "3.10.") || strings.HasPrefix(version, "3.11."):
		if !res.ConnectionClosed || res.ConnectionUsable || res.ConnectionError == nil ||
			!strings.Contains(*res.ConnectionError, "503") || !strings.Contains(*res.ConnectionError, "unknown exchange type 'x-delayed-message'") {
			t.Errorf("RabbitMQ %s: want the connection closed with 503 unknown exchange type, got %+v", version, res)
		}
	case strings.HasPrefix(version, "4."):
		if res.ConnectionClosed || !res.ConnectionUsable || !res.ChannelClosed {
			t.Errorf("RabbitMQ %s: want a channel error, the connection alive, got %+v", version, res)
		}
	default:
		t.Logf("RabbitMQ %s: 3.12 and 3.13 got the change in a patch release; not asserted", version)
	}
}
