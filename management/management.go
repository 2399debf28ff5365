// Package management is a client of the few parts of RabbitMQ's management
// HTTP API (the rabbitmq_management plugin) that delaybridge uses: an
// exchange's description and the bindings whose source it is, and creating
// and deleting a binding. AMQP has no way to list bindings; the bridge
// uses it to see foreign bindings on its delayed exchanges, and the
// migrate-bindings command to move them (docs/contract.md §2.7, §5.5).
// The paths and JSON fields are those of rabbitmq/rabbitmq-server,
// deps/rabbitmq_management/priv/www/api/index.html (rabbit_mgmt_wm_bindings.erl,
// rabbit_mgmt_wm_binding.erl, rabbit_mgmt_wm_exchange.erl).
//
// Credentials go in the Authorization header only: no error, log line or
// String shows them.
package management

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Sentinel errors callers match with errors.Is.
var (
	// ErrUnreachable: nothing answers at the URL (the plugin is not
	// enabled, or another port or host), or not an HTTP server.
	ErrUnreachable = errors.New("the management API does not answer")
	// ErrUnauthorized: 401, the credentials were refused, or the user may
	// not use the management API (it needs the management, monitoring,
	// policymaker or administrator tag) or that vhost.
	ErrUnauthorized = errors.New("the management API refused the credentials")
	// ErrForbidden: 403, the user lacks a permission the request needs.
	ErrForbidden = errors.New("the management API refused the request: permission missing")
	// ErrNotFound: 404, no such exchange, queue or binding (or vhost).
	ErrNotFound = errors.New("not found")
)

// DefaultPort and DefaultTLSPort are the management plugin's listeners
// unless configured otherwise (management.tcp.port, management.ssl.port).
const (
	DefaultPort    = "15672"
	DefaultTLSPort = "15671"
)

// Client talks to one management API on behalf of one user and vhost.
type Client struct {
	base       *url.URL // scheme, host and path prefix; no credentials
	user, pass string
	vhost      string
	http       *http.Client
}

// New returns a client of the management API at managementURL, for the
// vhost of amqpURL. managementURL's user and password are used when it has
// them, else amqpURL's. An empty managementURL means the management API of
// amqpURL's host: http on DefaultPort, https on DefaultTLSPort for
// amqps://. tlsCfg, when not nil, configures https (a copy is used).
func New(managementURL, amqpURL string, tlsCfg *tls.Config) (*Client, error) {
	a, err := url.Parse(amqpURL)
	if err != nil || (a.Scheme != "amqp" && a.Scheme != "amqps") || a.Host == "" {
		// Never echo the URL: it may carry the password.
		return nil, errors.New("the AMQP URL is not an amqp:// or amqps:// URL with a host")
	}
	vhost := "/"
	if p := strings.TrimPrefix(a.Path, "/"); a.Path != "" && p != "" {
		vhost = p
	}
	var m *url.URL
	if managementURL == "" {
		m = &url.URL{Scheme: "http", Host: net.JoinHostPort(a.Hostname(), DefaultPort), Path: "/"}
		if a.Scheme == "amqps" {
			m.Scheme, m.Host = "https", net.JoinHostPort(a.Hostname(), DefaultTLSPort)
		}
	} else {
		m, err = url.Parse(managementURL)
		if err != nil || (m.Scheme != "http" && m.Scheme != "https") || m.Host == "" {
			return nil, errors.New("the management URL is not an http:// or https:// URL with a host")
		}
	}
	creds := a.User
	if m.User != nil {
		creds = m.User
	}
	c := &Client{base: &url.URL{Scheme: m.Scheme, Host: m.Host, Path: strings.TrimSuffix(m.Path, "/") + "/"}, vhost: vhost}
	if creds != nil {
		c.user = creds.Username()
		c.pass, _ = creds.Password()
	} else {
		// What amqp091-go uses without credentials in the URL.
		c.user, c.pass = "guest", "guest"
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if tlsCfg != nil {
		transport.TLSClientConfig = tlsCfg.Clone()
	}
	c.http = &http.Client{Transport: transport, Timeout: 30 * time.Second}
	return c, nil
}

// String names the API and the user, for messages: never the password.
func (c *Client) String() string { return c.base.String() + " as user " + strconvQuote(c.user) }

// User is the user the client authenticates as.
func (c *Client) User() string { return c.user }

// Vhost is the vhost the client acts on.
func (c *Client) Vhost() string { return c.vhost }

// Exchange is what the API says of one exchange.
type Exchange struct {
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	Durable   bool           `json:"durable"`
	Arguments map[string]any `json:"arguments"`
}

// Binding is one binding as the API lists it.
type Binding struct {
	Source          string `json:"source"`
	Destination     string `json:"destination"`
	DestinationType string `json:"destination_type"` // "queue" or "exchange"
	RoutingKey      string `json:"routing_key"`
	// Arguments as the API writes them: JSON values, void as null.
	Arguments map[string]any `json:"arguments"`
	// PropertiesKey names the binding among those of its source and
	// destination, for deleting it.
	PropertiesKey string `json:"properties_key"`
}

// String describes the binding for people: its destination, key and
// arguments.
func (b Binding) String() string {
	s := fmt.Sprintf("%s %s, routing key %s", b.DestinationType, strconvQuote(b.Destination), strconvQuote(b.RoutingKey))
	if len(b.Arguments) > 0 {
		args, _ := json.Marshal(b.Arguments)
		s += ", arguments " + string(args)
	}
	return s
}

// Exchange describes the exchange name.
func (c *Client) Exchange(ctx context.Context, name string) (Exchange, error) {
	var x Exchange
	err := c.do(ctx, http.MethodGet, "exchanges/"+seg(c.vhost)+"/"+seg(name), nil, &x)
	return x, err
}

// BindingsFrom lists the bindings whose source is the exchange name.
func (c *Client) BindingsFrom(ctx context.Context, name string) ([]Binding, error) {
	var bs []Binding
	err := c.do(ctx, http.MethodGet, "exchanges/"+seg(c.vhost)+"/"+seg(name)+"/bindings/source", nil, &bs)
	return bs, err
}

// Bind creates b (its source, destination, routing key and arguments).
// Binding what is bound already changes nothing.
func (c *Client) Bind(ctx context.Context, b Binding) error {
	body := map[string]any{"routing_key": b.RoutingKey, "arguments": b.Arguments}
	if b.Arguments == nil {
		body["arguments"] = map[string]any{}
	}
	return c.do(ctx, http.MethodPost, "bindings/"+seg(c.vhost)+"/e/"+seg(b.Source)+"/"+destKind(b)+"/"+seg(b.Destination), body, nil)
}

// Unbind deletes b, named by its properties key; ErrNotFound when it is
// gone already.
func (c *Client) Unbind(ctx context.Context, b Binding) error {
	return c.do(ctx, http.MethodDelete, "bindings/"+seg(c.vhost)+"/e/"+seg(b.Source)+"/"+destKind(b)+"/"+seg(b.Destination)+"/"+seg(b.PropertiesKey), nil, nil)
}

// destKind is the path segment of b's destination type.
func destKind(b Binding) string {
	if b.DestinationType == "exchange" {
		return "e"
	}
	return "q"
}

// seg escapes one path segment ("/" is a vhost name, %2F in a path).
func seg(s string) string { return url.PathEscape(s) }

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// do sends one request to api/path with body as JSON, and decodes a 2xx
// answer into out (when not nil). Errors wrap the sentinels above and say
// what the API said; never the credentials.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("management API %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	target := c.base.String() + "api/" + path
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return fmt.Errorf("management API %s: %w", method, err)
	}
	req.SetBasicAuth(c.user, c.pass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w at %s: %s", ErrUnreachable, c.base, cause(err))
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode/100 == 2 {
		if out == nil || len(bytes.TrimSpace(raw)) == 0 {
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%w at %s: %s %s answered what is not the management API's JSON: %v", ErrUnreachable, c.base, method, path, err)
		}
		return nil
	}
	reason := apiReason(raw)
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return fmt.Errorf("%w of user %s at %s (%s)", ErrUnauthorized, strconvQuote(c.user), c.base, reason)
	case http.StatusForbidden:
		return fmt.Errorf("%w: user %s, %s %s (%s)", ErrForbidden, strconvQuote(c.user), method, path, reason)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %s %s (%s)", ErrNotFound, method, path, reason)
	}
	return fmt.Errorf("management API %s %s: %s (%s)", method, path, resp.Status, reason)
}

// apiReason is the reason the API gave in its JSON error body, short.
func apiReason(raw []byte) string {
	var e struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(raw, &e) == nil && (e.Error != "" || e.Reason != "") {
		return strings.TrimSpace(strings.Trim(e.Error+": "+e.Reason, ": "))
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		return "no reason given"
	}
	return s
}

// cause is the part of a transport error worth showing: the *url.Error's
// inner error (its URL has no credentials anyway, but say it once).
func cause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}
