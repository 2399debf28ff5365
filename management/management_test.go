package management

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// The API's URL and credentials: given, or derived from the AMQP URL; the
// vhost always the AMQP URL's; the password never shown.
func TestNew(t *testing.T) {
	for _, c := range []struct {
		mgmt, amqp        string
		base, user, vhost string
	}{
		{"", "amqp://app:s3cret@rabbit:5672/", "http://rabbit:15672/", "app", "/"},
		{"", "amqps://app:s3cret@rabbit/orders", "https://rabbit:15671/", "app", "orders"},
		{"", "amqp://rabbit/%2F", "http://rabbit:15672/", "guest", "/"},
		{"https://ops:s3cret@mgmt.example:8443/rabbit", "amqp://app:pw@rabbit:5672/vh", "https://mgmt.example:8443/rabbit/", "ops", "vh"},
		{"http://mgmt:15672", "amqp://app:s3cret@rabbit:5672/", "http://mgmt:15672/", "app", "/"},
	} {
		cl, err := New(c.mgmt, c.amqp, nil)
		if err != nil {
			t.Fatalf("%q %q: %v", c.mgmt, c.amqp, err)
		}
		if cl.base.String() != c.base || cl.User() != c.user || cl.Vhost() != c.vhost {
			t.Errorf("%q %q: base %s user %s vhost %s, want %s %s %s", c.mgmt, c.amqp, cl.base, cl.User(), cl.Vhost(), c.base, c.user, c.vhost)
		}
		if strings.Contains(cl.String(), "s3cret") {
			t.Errorf("String shows the password: %s", cl)
		}
	}
	for _, c := range [][2]string{{"", "http://app:s3cret@rabbit/"}, {"amqp://app:s3cret@mgmt/", "amqp://rabbit/"}, {"http:///", "amqp://rabbit/"}} {
		if _, err := New(c[0], c[1], nil); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q %q: %v, want an error without the password", c[0], c[1], err)
		}
	}
}

// client is a client of the test broker's management API on a vhost of
// the test's own, and an AMQP connection there.
func client(t *testing.T) (*Client, *amqp.Connection) {
	t.Helper()
	amqpURL, _ := testenv.Vhost(t)
	c, err := New(testenv.ManagementURL(t), amqpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return c, conn
}

// Bindings are listed with their arguments as the API writes them, created
// (again: no change) and deleted; a missing exchange is ErrNotFound (its
// bindings list, the API answers, is empty).
func TestBindings(t *testing.T) {
	c, conn := client(t)
	ctx := context.Background()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range [][2]string{{"src", amqp.ExchangeHeaders}, {"dst", amqp.ExchangeTopic}} {
		if err := ch.ExchangeDeclare(x[0], x[1], true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ch.QueueDeclare("q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q", "", "src", false, amqp.Table{"x-match": "any-with-x", "x-delay": nil}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q", "orders.*", "src", false, nil); err != nil {
		t.Fatal(err)
	}
	x, err := c.Exchange(ctx, "src")
	if err != nil || x.Type != amqp.ExchangeHeaders || !x.Durable {
		t.Fatalf("exchange %+v, %v", x, err)
	}
	bs, err := c.BindingsFrom(ctx, "src")
	if err != nil || len(bs) != 2 {
		t.Fatalf("bindings %+v, %v", bs, err)
	}
	var plain Binding
	for _, b := range bs {
		if b.RoutingKey == "orders.*" {
			plain = b
		} else if v, ok := b.Arguments["x-delay"]; !ok || (v != nil && v != "undefined") || b.Arguments["x-match"] != "any-with-x" {
			t.Errorf("void argument listed as %#v", b.Arguments)
		}
	}
	if plain.Destination != "q" || plain.DestinationType != "queue" || plain.Source != "src" {
		t.Fatalf("binding %+v", plain)
	}
	moved := plain
	moved.Source = "dst"
	for range 2 {
		if err := c.Bind(ctx, moved); err != nil {
			t.Fatal(err)
		}
	}
	if bs, err := c.BindingsFrom(ctx, "dst"); err != nil || len(bs) != 1 || bs[0].RoutingKey != "orders.*" {
		t.Fatalf("bindings of dst %+v, %v", bs, err)
	}
	if err := c.Unbind(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if err := c.Unbind(ctx, plain); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting it again: %v, want ErrNotFound", err)
	}
	if bs, _ := c.BindingsFrom(ctx, "src"); len(bs) != 1 {
		t.Fatalf("bindings of src after the removal: %+v", bs)
	}
	if _, err := c.Exchange(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a missing exchange: %v, want ErrNotFound", err)
	}
}

// Nothing listening, a wrong password and a user the API refuses are told
// apart, and no error shows the password.
func TestErrors(t *testing.T) {
	m := testenv.ManagementURL(t)
	amqpURL := testenv.AMQPURL(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	_ = ln.Close()
	off, err := New(closed, amqpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := off.BindingsFrom(ctx, "x"); !errors.Is(err, ErrUnreachable) {
		t.Errorf("nothing listening: %v, want ErrUnreachable", err)
	}
	u, err := url.Parse(m)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "wrong-s3cret")
	wrong, err := New(u.String(), amqpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = wrong.BindingsFrom(ctx, "amq.direct")
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "wrong-s3cret") {
		t.Errorf("a wrong password: %v, want ErrUnauthorized without the password", err)
	}
}
