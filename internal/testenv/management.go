package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvManagementURL is the test broker's management HTTP API (default: the
// test broker's host on port 15672, http, with the AMQP URL's user and
// password). scripts/ensure-rabbitmq.sh enables the plugin on a local broker.
const EnvManagementURL = "DELAYBRIDGE_TEST_MANAGEMENT_URL"

// ManagementURLFromEnv returns $DELAYBRIDGE_TEST_MANAGEMENT_URL, or the
// management API of the test broker's host, with the AMQP URL's
// credentials; without checking it.
func ManagementURLFromEnv() string {
	if v := strings.TrimSpace(os.Getenv(EnvManagementURL)); v != "" {
		return v
	}
	u, err := url.Parse(AMQPURLFromEnv())
	if err != nil {
		return "http://127.0.0.1:15672/"
	}
	m := url.URL{Scheme: "http", Host: net.JoinHostPort(u.Hostname(), "15672"), Path: "/", User: u.User}
	if u.Scheme == "amqps" {
		m.Scheme, m.Host = "https", net.JoinHostPort(u.Hostname(), "15671")
	}
	return m.String()
}

var (
	mgmtOnce sync.Once
	mgmtErr  error
)

// ManagementURL returns the test broker's management API URL once it
// answers there (GET /api/overview with its credentials); if it does not,
// the test is Unavailable.
func ManagementURL(t testing.TB) string {
	t.Helper()
	AMQPURL(t)
	u := ManagementURLFromEnv()
	mgmtOnce.Do(func() {
		_, mgmtErr = managementDo(context.Background(), u, http.MethodGet, "api/overview", nil)
	})
	if mgmtErr != nil {
		Unavailable(t, "the RabbitMQ management API is not reachable at %s: %v\nenable it (rabbitmq-plugins enable rabbitmq_management; scripts/ensure-rabbitmq.sh does) or set %s",
			redact(u), mgmtErr, EnvManagementURL)
	}
	return u
}

// Vhost creates a virtual host of its own for t on the test broker, gives
// the test broker's user every permission on it, and deletes it (and all in
// it) when t ends. It returns the AMQP URL of the test broker on that vhost.
// For tests of names every endpoint on a vhost shares (MassTransit's
// message-type exchanges, Rebus's direct exchange, NServiceBus's error
// queue), which must not meet another test's.
func Vhost(t testing.TB) (amqpURL, vhost string) {
	t.Helper()
	m := ManagementURL(t)
	a, err := url.Parse(AMQPURL(t))
	if err != nil {
		t.Fatalf("the test broker's URL: %v", err)
	}
	vhost = "delaybridge-test-" + randomHex()
	managementCreate(t, m, "vhost "+vhost, "api/vhosts/"+url.PathEscape(vhost), []byte(`{}`))
	user := a.User.Username()
	perm := []byte(`{"configure":".*","write":".*","read":".*"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := managementDo(ctx, m, http.MethodPut, "api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(user), perm); err != nil {
		t.Fatalf("grant %s on vhost %s: %v", user, vhost, err)
	}
	a.Path, a.RawPath = "/"+vhost, "/"+url.PathEscape(vhost)
	return a.String(), vhost
}

// managementDo sends one request to the management API at base, with the
// credentials in base, and returns the body of a 2xx answer.
func managementDo(ctx context.Context, base, method, path string, body []byte) ([]byte, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("management URL: %w", err)
	}
	user := u.User
	u.User = nil
	target := strings.TrimSuffix(u.String(), "/") + "/" + path
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if user != nil {
		pass, _ := user.Password()
		req.SetBasicAuth(user.Username(), pass)
	}
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: dialTimeout * 2}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s %s", method, path, resp.Status, bytes.TrimSpace(out))
	}
	return out, nil
}

// ManagementUser creates a user of the test broker with the given tags
// ("management", "" for none) and no permissions on any vhost, deleted
// when t ends, and returns its name and password.
func ManagementUser(t testing.TB, tags string) (user, password string) {
	t.Helper()
	m := ManagementURL(t)
	suffix := randomHex()
	user, password = "delaybridge-test-"+suffix, "pw-"+suffix
	body, _ := json.Marshal(map[string]string{"password": password, "tags": tags})
	managementCreate(t, m, "user "+user, "api/users/"+url.PathEscape(user), body)
	return user, password
}

// managementCreate PUTs body to path on the management API at m, failing t
// on an error, and DELETEs path when t ends; what names the object in the
// messages.
func managementCreate(t testing.TB, m, what, path string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := managementDo(ctx, m, http.MethodPut, path, body); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := managementDo(ctx, m, http.MethodDelete, path, nil); err != nil {
			t.Logf("delete %s: %v", what, err)
		}
	})
}

// randomHex is 8 random hex digits, for names of the test's own.
func randomHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
