package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/broker"
	"github.com/delaybridge/delaybridge/internal/testenv"
)

// TLS end to end without reconfiguring the shared broker: a TLS-terminating
// proxy that requires a client certificate signed by a test CA sits in front
// of the plain AMQP port, and the bridge talks amqps:// to the proxy.
//
// The bridge reads DELAYBRIDGE_TLS_CA_FILE, DELAYBRIDGE_TLS_CERT_FILE,
// DELAYBRIDGE_TLS_KEY_FILE and DELAYBRIDGE_TLS_SERVER_NAME (amqps:// only).

const tlsClientCN = "delaybridge-it-client"

func TestTLS(t *testing.T) {
	t.Parallel()
	requireBroker(t)
	pki := newTLSPKI(t)
	localhost := pki.serverCert(t, "localhost", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	mutual := broker.TLSFiles{CAFile: pki.caFile, CertFile: pki.clientCert, KeyFile: pki.clientKey}

	// The proxy itself, with amqp091-go as the client: independent of the
	// bridge's wiring of the DELAYBRIDGE_TLS_* variables.
	t.Run("proxy", func(t *testing.T) {
		t.Parallel()
		p := startTLSProxy(t, localhost, pki.caPool)

		cfg, err := mutual.Config()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := amqp.DialTLS(p.URL(t, "localhost", ""), cfg)
		if err != nil {
			t.Fatalf("amqps through the proxy: %v", err)
		}
		defer conn.Close()
		amqpRoundTrip(t, conn)
		v := p.waitStats(t, "one verified connection", func(s tlsProxyStats) bool { return len(s.verified) >= 1 })
		if len(v.verified) != 1 || v.verified[0].cn != tlsClientCN || v.verified[0].sni != "localhost" || len(v.failed) != 0 {
			t.Fatalf("proxy saw %+v; want one verified connection from %q with SNI localhost", v, tlsClientCN)
		}

		// The proxy really requires a client certificate...
		noCert, err := broker.TLSFiles{CAFile: pki.caFile}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if c, err := amqp.DialTLS(p.URL(t, "localhost", ""), noCert); err == nil {
			_ = c.Close()
			t.Fatal("the proxy let a client without a certificate through")
		} else {
			t.Logf("without a client certificate: %v", err)
		}
		p.waitStats(t, "a rejected handshake", func(s tlsProxyStats) bool { return len(s.failed) >= 1 })

		// ...and amqp091-go checks the server against the given CA (and
		// against the system roots without one).
		noCA, err := broker.TLSFiles{CertFile: pki.clientCert, KeyFile: pki.clientKey}.Config()
		if err != nil {
			t.Fatal(err)
		}
		var uae x509.UnknownAuthorityError
		if c, err := amqp.DialTLS(p.URL(t, "localhost", ""), noCA); !errors.As(err, &uae) {
			if c != nil {
				_ = c.Close()
			}
			t.Fatalf("without the CA: err = %v; want x509.UnknownAuthorityError", err)
		}

		// amqp091-go fills an empty ServerName from the URL host: through
		// 127.0.0.1 the name to verify is the IP (in the certificate's SANs).
		cfg, err = mutual.Config()
		if err != nil {
			t.Fatal(err)
		}
		conn2, err := amqp.DialTLS(p.URL(t, "127.0.0.1", ""), cfg)
		if err != nil {
			t.Fatalf("amqps via 127.0.0.1: %v", err)
		}
		_ = conn2.Close()
		if cfg.ServerName != "127.0.0.1" {
			t.Errorf("after DialTLS ServerName = %q; amqp091-go was expected to set it from the URL host", cfg.ServerName)
		}
	})

	// The bridge works over mutual TLS: a message scheduled through plain
	// AMQP is stored and forwarded by a bridge whose only broker URL is
	// the TLS proxy.
	t.Run("bridge-over-mutual-tls", func(t *testing.T) {
		t.Parallel()
		p := startTLSProxy(t, localhost, pki.caPool)
		b := startBridge(t, map[string]string{
			"DELAYBRIDGE_AMQP_URL":      p.URL(t, "localhost", ""),
			"DELAYBRIDGE_TLS_CA_FILE":   pki.caFile,
			"DELAYBRIDGE_TLS_CERT_FILE": pki.clientCert,
			"DELAYBRIDGE_TLS_KEY_FILE":  pki.clientKey,
		})
		scheduleAndExpect(t, b)
		s := p.stats()
		if len(s.verified) == 0 {
			t.Fatalf("the proxy saw no verified TLS connection: %+v", s)
		}
		for _, v := range s.verified {
			if v.cn != tlsClientCN || v.sni != "localhost" {
				t.Errorf("verified connection %+v; want client %q and SNI localhost", v, tlsClientCN)
			}
		}
		if len(s.failed) != 0 {
			t.Errorf("failed handshakes at the proxy: %v", s.failed)
		}
		t.Logf("the bridge made %d verified mutual-TLS connections", len(s.verified))
		b.Stop()
	})

	// DELAYBRIDGE_TLS_SERVER_NAME: the URL says 127.0.0.1, the server's
	// certificate only names rabbit.delaybridge.test.
	t.Run("bridge-server-name-override", func(t *testing.T) {
		t.Parallel()
		const name = "rabbit.delaybridge.test"
		p := startTLSProxy(t, pki.serverCert(t, name, []string{name}, nil), pki.caPool)
		b := startBridge(t, map[string]string{
			"DELAYBRIDGE_AMQP_URL":        p.URL(t, "127.0.0.1", ""),
			"DELAYBRIDGE_TLS_CA_FILE":     pki.caFile,
			"DELAYBRIDGE_TLS_CERT_FILE":   pki.clientCert,
			"DELAYBRIDGE_TLS_KEY_FILE":    pki.clientKey,
			"DELAYBRIDGE_TLS_SERVER_NAME": name,
		})
		scheduleAndExpect(t, b)
		s := p.stats()
		if len(s.verified) == 0 {
			t.Fatalf("the proxy saw no verified TLS connection: %+v", s)
		}
		for _, v := range s.verified {
			if v.sni != name {
				t.Errorf("SNI %q, want %q", v.sni, name)
			}
		}
		b.Stop()
	})

	// Without the CA the proxy's certificate is untrusted: the bridge exits
	// 1 at start-up, says why, and never prints the password.
	t.Run("bridge-without-ca-fails", func(t *testing.T) {
		t.Parallel()
		const secret = "s3cretTLSpw"
		p := startTLSProxy(t, localhost, pki.caPool)
		env := bridgeEnv(t, map[string]string{
			"DELAYBRIDGE_AMQP_URL":      p.URL(t, "localhost", secret),
			"DELAYBRIDGE_TLS_CERT_FILE": pki.clientCert,
			"DELAYBRIDGE_TLS_KEY_FILE":  pki.clientKey,
			"DELAYBRIDGE_LOG_LEVEL":     "debug",
		})
		proc := execBridge(t, env)
		code := proc.Wait(60 * time.Second)
		stderr := proc.Stderr()
		if code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
		if !regexp.MustCompile(`(?i)x509|certificate`).MatchString(stderr) {
			t.Errorf("stderr does not mention the certificate problem:\n%s", stderr)
		} else if !strings.Contains(stderr, "unknown authority") {
			t.Logf("note: stderr does not say \"unknown authority\":\n%s", stderr)
		}
		if strings.Contains(stderr, secret) {
			t.Errorf("stderr contains the AMQP password:\n%s", stderr)
		}
		s := p.waitStats(t, "a failed handshake", func(s tlsProxyStats) bool { return len(s.failed) >= 1 })
		if len(s.verified) != 0 {
			t.Errorf("the proxy completed %d handshakes with a bridge that has no CA", len(s.verified))
		}
		t.Logf("stderr:\n%s", stderr)
	})

	// Unusable TLS files are a configuration error (docs/contract.md §5): exit 2,
	// one line naming the variable, no password, no key material.
	t.Run("bad-tls-files-exit-2", func(t *testing.T) {
		t.Parallel()
		const secret = "s3cretTLSpw"
		missing := filepath.Join(pki.dir, "missing.pem")
		keyPEM, err := os.ReadFile(pki.clientKey)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name  string
			env   map[string]string
			names []string // the error must name one of these
		}{
			{"ca-missing", map[string]string{"DELAYBRIDGE_TLS_CA_FILE": missing},
				[]string{"DELAYBRIDGE_TLS_CA_FILE"}},
			{"ca-is-a-key", map[string]string{"DELAYBRIDGE_TLS_CA_FILE": pki.clientKey},
				[]string{"DELAYBRIDGE_TLS_CA_FILE"}},
			{"cert-without-key", map[string]string{"DELAYBRIDGE_TLS_CA_FILE": pki.caFile, "DELAYBRIDGE_TLS_CERT_FILE": pki.clientCert},
				[]string{"DELAYBRIDGE_TLS_KEY_FILE"}},
			{"key-without-cert", map[string]string{"DELAYBRIDGE_TLS_KEY_FILE": pki.clientKey},
				[]string{"DELAYBRIDGE_TLS_CERT_FILE"}},
			{"key-does-not-match", map[string]string{"DELAYBRIDGE_TLS_CERT_FILE": pki.caFile, "DELAYBRIDGE_TLS_KEY_FILE": pki.clientKey},
				[]string{"DELAYBRIDGE_TLS_CERT_FILE", "DELAYBRIDGE_TLS_KEY_FILE"}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				env := map[string]string{"DELAYBRIDGE_AMQP_URL": "amqps://guest:" + secret + "@localhost:1/"}
				for k, v := range c.env {
					env[k] = v
				}
				proc := execBridge(t, bridgeEnv(t, env))
				code := proc.Wait(30 * time.Second)
				stderr := proc.Stderr()
				if code != 2 {
					t.Errorf("exit code %d, want 2", code)
				}
				if lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n"); len(lines) != 1 {
					t.Errorf("stderr has %d lines, want one:\n%s", len(lines), stderr)
				}
				named := false
				for _, n := range c.names {
					named = named || strings.Contains(stderr, n)
				}
				if !named {
					t.Errorf("stderr names none of %v:\n%s", c.names, stderr)
				}
				if strings.Contains(stderr, secret) {
					t.Errorf("stderr contains the AMQP password:\n%s", stderr)
				}
				for _, line := range strings.Split(string(keyPEM), "\n") {
					if len(line) >= 16 && !strings.HasPrefix(line, "-----") && strings.Contains(stderr, line[:16]) {
						t.Fatalf("stderr contains private key material:\n%s", stderr)
					}
				}
				t.Logf("stderr: %s", stderr)
			})
		}
	})
}

// scheduleAndExpect publishes one delayed message to the bridge's E.Timeouts
// over plain AMQP and waits for it on a destination queue.
func scheduleAndExpect(t *testing.T, b *bridgeProc) {
	t.Helper()
	conn := dial(t)
	dest := b.Endpoint + ".dst"
	c := declareAndConsume(t, conn, dest)
	before := time.Now()
	newPublisher(t, conn).Publish(b.TimeoutsQueue(), amqp.Publishing{
		MessageId: "tls-" + randomHex(4),
		Headers:   amqp.Table{"x-destination": dest, "x-delay": int32(300)},
		Body:      []byte("delivered by a bridge speaking amqps"),
	})
	got := c.WaitFor(1, livenessBound)
	if string(got[0].Body) != "delivered by a bridge speaking amqps" {
		t.Errorf("body = %q", got[0].Body)
	}
	if early := before.Add(300 * time.Millisecond).Sub(got[0].At); early > 0 {
		t.Errorf("delivered %s early", early)
	}
}

// amqpRoundTrip publishes to a server-named queue and gets the message back.
func amqpRoundTrip(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("declare: %v", err)
	}
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("ping")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, ok, err := ch.Get(q.Name, true)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if ok {
			if string(d.Body) != "ping" {
				t.Fatalf("body = %q", d.Body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the message did not come back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Test PKI

// tlsPKI is a test CA and a client certificate, as PEM files in a temporary
// directory; serverCert issues server certificates.
type tlsPKI struct {
	dir                   string
	ca                    *x509.Certificate
	caKey                 *ecdsa.PrivateKey
	caPool                *x509.CertPool
	caFile                string
	clientCert, clientKey string
	serial                int64
	mu                    sync.Mutex
}

func newTLSPKI(t *testing.T) *tlsPKI {
	t.Helper()
	p := &tlsPKI{dir: t.TempDir(), caKey: newECKey(t), serial: 1}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "delaybridge integration test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(p.ca)
	p.caFile = p.writePEM(t, "ca.pem", "CERTIFICATE", der)
	p.clientCert, p.clientKey, _ = p.issue(t, tlsClientCN, x509.ExtKeyUsageClientAuth, nil, nil)
	return p
}

// serverCert issues a server certificate for the names and IPs.
func (p *tlsPKI) serverCert(t *testing.T, cn string, dns []string, ips []net.IP) tls.Certificate {
	t.Helper()
	_, _, pair := p.issue(t, cn, x509.ExtKeyUsageServerAuth, dns, ips)
	return pair
}

func (p *tlsPKI) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	p.mu.Lock()
	p.serial++
	serial := p.serial
	p.mu.Unlock()
	key := newECKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("%s-%d", cn, serial)
	certFile = p.writePEM(t, base+".pem", "CERTIFICATE", der)
	keyFile = p.writePEM(t, base+"-key.pem", "PRIVATE KEY", keyDER)
	if pair, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

func (p *tlsPKI) writePEM(t *testing.T, name, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newECKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// ---------------------------------------------------------------------------
// TLS-terminating proxy

// tlsProxy accepts TLS on 127.0.0.1:0, requires a client certificate signed
// by the given CA, and pipes each verified connection to the test broker's
// plain AMQP port. It records every handshake.
type tlsProxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	st     tlsProxyStats
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type tlsProxyStats struct {
	verified []tlsPeer // handshakes that completed with a verified client certificate
	failed   []string  // handshake errors
}

type tlsPeer struct {
	cn  string // the client certificate's common name
	sni string // the server name the client sent
}

func (s tlsProxyStats) String() string {
	return fmt.Sprintf("verified=%+v failed=%q", s.verified, s.failed)
}

func startTLSProxy(t *testing.T, server tls.Certificate, clientCAs *x509.CertPool) *tlsProxy {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parse the broker URL: %v", err)
	}
	if u.Scheme != "amqp" {
		testenv.Unavailable(t, "the TLS proxy forwards to a plain amqp:// broker; the test broker is %s", broker.Redact(amqpURL))
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5672"
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{server},
		ClientCAs:    clientCAs,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatalf("TLS proxy: listen: %v", err)
	}
	p := &tlsProxy{ln: ln, upstream: net.JoinHostPort(host, port), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(func() {
		p.Close()
		if t.Failed() {
			t.Logf("TLS proxy %s: %s", ln.Addr(), p.stats())
		}
	})
	return p
}

// URL is the amqps:// URL of the proxy through host (which must resolve to
// 127.0.0.1), with the test broker's user, vhost and, unless password is
// empty, that password instead of the broker's.
func (p *tlsProxy) URL(t testing.TB, host, password string) string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parse the broker URL: %v", err)
	}
	_, port, _ := net.SplitHostPort(p.ln.Addr().String())
	u.Scheme = "amqps"
	u.Host = net.JoinHostPort(host, port)
	u.RawQuery = ""
	if password != "" {
		user := "guest"
		if u.User != nil {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

func (p *tlsProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c.(*tls.Conn))
	}
}

// track registers c for Close; false when the proxy is closed.
func (p *tlsProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tlsProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *tlsProxy) serve(c *tls.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		p.mu.Lock()
		p.st.failed = append(p.st.failed, err.Error())
		p.mu.Unlock()
		return
	}
	_ = c.SetDeadline(time.Time{})
	st := c.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		// Cannot happen with RequireAndVerifyClientCert; recorded if it does.
		p.mu.Lock()
		p.st.failed = append(p.st.failed, "handshake completed without a verified client certificate")
		p.mu.Unlock()
		return
	}
	p.mu.Lock()
	p.st.verified = append(p.st.verified, tlsPeer{cn: st.PeerCertificates[0].Subject.CommonName, sni: st.ServerName})
	p.mu.Unlock()

	up, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		p.mu.Lock()
		p.st.failed = append(p.st.failed, "dial upstream: "+err.Error())
		p.mu.Unlock()
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	// One side is gone: close both so the other copy ends too.
	_ = c.Close()
	_ = up.Close()
	<-done
}

// stats returns a copy of what the proxy saw so far.
func (p *tlsProxy) stats() tlsProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return tlsProxyStats{
		verified: append([]tlsPeer(nil), p.st.verified...),
		failed:   append([]string(nil), p.st.failed...),
	}
}

// waitStats waits up to 10 s for cond (handshakes finish on the proxy's side
// a little after the client gives up or succeeds).
func (p *tlsProxy) waitStats(t *testing.T, what string, cond func(tlsProxyStats) bool) tlsProxyStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.stats()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS proxy: no %s within 10s (%s)", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops accepting, closes every connection and waits for the
// goroutines.
func (p *tlsProxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}
