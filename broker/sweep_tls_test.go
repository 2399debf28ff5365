package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// tlsToBroker listens with TLS (the test PKI's server certificate, client
// certificates required) and forwards to the plain test broker; it returns
// its port and the common names of the clients it saw.
func tlsToBroker(t *testing.T, p *testPKI, brokerAddr string) (port string, clients func() []string) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{p.serverPair},
		ClientCAs: p.caPool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var names []string
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				if chains := tc.ConnectionState().VerifiedChains; len(chains) > 0 {
					mu.Lock()
					names = append(names, chains[0][0].Subject.CommonName)
					mu.Unlock()
				}
				b, err := net.Dial("tcp", brokerAddr)
				if err != nil {
					return
				}
				defer b.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(b, tc); done <- struct{}{} }()
				go func() { _, _ = io.Copy(tc, b); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), names...)
	}
}

// TestSweepOverTLS: the sweep's own client speaks amqps:// with the bridge's
// TLS config (a private CA and a client certificate) and, without one, with
// the URL's TLS parameters as amqp091-go reads them; it verifies the server.
func TestSweepOverTLS(t *testing.T) {
	plain, q, errQ, ch, ctx := sweepSetup(t, "classic")
	u, err := url.Parse(plain)
	if err != nil {
		t.Fatal(err)
	}
	p := newTestPKI(t)
	port, clients := tlsToBroker(t, p, u.Host)
	amqps := "amqps://" + u.User.String() + "@localhost:" + port + u.Path
	publish := moveTo(ch, errQ, nil)

	t.Run("bridge config", func(t *testing.T) {
		publishAll(ctx, t, ch, q, amqp.Publishing{MessageId: "many", Headers: unreadableHeaders(true)})
		cfg, err := TLSFiles{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}.Config()
		if err != nil {
			t.Fatal(err)
		}
		s := NewSweeper(SweepOptions{ErrorQueue: errQ, TLS: cfg, Move: publish})
		if moved, err := s.Sweep(ctx, []string{amqps}, q); err != nil || moved != 1 {
			t.Fatalf("Sweep over TLS = %d, %v; want 1, nil", moved, err)
		}
		if cfg.ServerName != "" {
			t.Errorf("the sweep wrote ServerName %q into the caller's config: it must clone it", cfg.ServerName)
		}
	})
	t.Run("URL parameters", func(t *testing.T) {
		publishAll(ctx, t, ch, q, amqp.Publishing{MessageId: "many", Headers: unreadableHeaders(true)})
		withFiles := amqps + "?cacertfile=" + url.QueryEscape(p.caFile) + "&certfile=" + url.QueryEscape(p.clientCert) +
			"&keyfile=" + url.QueryEscape(p.clientKey)
		s := NewSweeper(SweepOptions{ErrorQueue: errQ, Move: publish})
		if moved, err := s.Sweep(ctx, []string{withFiles}, q); err != nil || moved != 1 {
			t.Fatalf("Sweep over TLS = %d, %v; want 1, nil", moved, err)
		}
	})
	t.Run("untrusted server", func(t *testing.T) {
		cfg, err := TLSFiles{CertFile: p.clientCert, KeyFile: p.clientKey}.Config() // system roots only
		if err != nil {
			t.Fatal(err)
		}
		s := NewSweeper(SweepOptions{ErrorQueue: errQ, TLS: cfg, Move: publish})
		_, err = s.Sweep(ctx, []string{amqps}, q)
		var uae x509.UnknownAuthorityError
		if !errors.As(err, &uae) {
			t.Fatalf("err = %v; want x509.UnknownAuthorityError", err)
		}
		if strings.Contains(err.Error(), u.User.String()) {
			t.Errorf("the error shows the credentials: %v", err)
		}
	})
	if got := clients(); len(got) != 2 || got[0] != "delaybridge-client" || got[1] != "delaybridge-client" {
		t.Errorf("the TLS server saw clients %v, want the client certificate twice", got)
	}
	if n := len(drain(t, ch, errQ)); n != 2 {
		t.Errorf("%d copies on the error queue, want 2", n)
	}
}
