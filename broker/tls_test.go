package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPKI is a CA with a server and a client certificate, written as PEM
// files into a temporary directory.
type testPKI struct {
	dir                    string
	caFile                 string
	serverCert, serverKey  string
	clientCert, clientKey  string
	otherKey               string // a valid key that matches no certificate
	caPool                 *x509.CertPool
	serverPair, clientPair tls.Certificate
	keyPEMs                [][]byte // every private key written, to check errors never echo them
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	now := time.Now()

	caKey := p.newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "delaybridge test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", caDER)

	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (string, string, tls.Certificate) {
		key := p.newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		certFile := p.write(t, name+".pem", "CERTIFICATE", der)
		keyFile := p.writeKey(t, name+"-key.pem", key)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return certFile, keyFile, pair
	}
	p.serverCert, p.serverKey, p.serverPair = leaf("localhost", 2, x509.ExtKeyUsageServerAuth,
		[]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey, p.clientPair = leaf("delaybridge-client", 3, x509.ExtKeyUsageClientAuth, nil, nil)
	p.otherKey = p.writeKey(t, "other-key.pem", p.newKey(t))
	return p
}

func (p *testPKI) newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func (p *testPKI) writeKey(t *testing.T, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	path := p.write(t, name, "PRIVATE KEY", der)
	p.keyPEMs = append(p.keyPEMs, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	return path
}

func (p *testPKI) write(t *testing.T, name, blockType string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *testPKI) file(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// assertNoKeyMaterial fails if msg contains any line of any private key PEM.
func (p *testPKI) assertNoKeyMaterial(t *testing.T, msg string) {
	t.Helper()
	for _, k := range p.keyPEMs {
		for _, line := range strings.Split(string(k), "\n") {
			if strings.HasPrefix(line, "-----") || len(line) < 16 {
				continue
			}
			if strings.Contains(msg, line) || strings.Contains(msg, line[:16]) {
				t.Errorf("error contains private key material: %s", msg)
				return
			}
		}
	}
	if strings.Contains(msg, "PRIVATE KEY-----") {
		t.Errorf("error contains a PEM private key header: %s", msg)
	}
}

func TestTLSFilesZeroIsLibraryDefault(t *testing.T) {
	var f TLSFiles
	if !f.IsZero() {
		t.Fatal("zero TLSFiles: IsZero = false")
	}
	cfg, err := f.Config()
	if cfg != nil || err != nil {
		t.Fatalf("Config() = %v, %v; want nil, nil", cfg, err)
	}
	if err := f.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
}

func TestTLSFilesConfig(t *testing.T) {
	p := newTestPKI(t)
	serverLeaf := p.serverPair.Leaf

	t.Run("ca-only", func(t *testing.T) {
		cfg, err := TLSFiles{CAFile: p.caFile}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MinVersion != tls.VersionTLS12 {
			t.Errorf("MinVersion = %#x, want TLS 1.2", cfg.MinVersion)
		}
		if cfg.RootCAs == nil {
			t.Fatal("RootCAs is nil")
		}
		if _, err := serverLeaf.Verify(x509.VerifyOptions{Roots: cfg.RootCAs, DNSName: "localhost"}); err != nil {
			t.Errorf("the server certificate does not verify against RootCAs: %v", err)
		}
		if len(cfg.Certificates) != 0 {
			t.Errorf("Certificates = %d, want none", len(cfg.Certificates))
		}
		if cfg.ServerName != "" {
			t.Errorf("ServerName = %q, want empty (amqp091-go fills in the URL host)", cfg.ServerName)
		}
		if cfg.InsecureSkipVerify {
			t.Error("InsecureSkipVerify is set")
		}
	})

	t.Run("ca-bundle-with-extra-blocks", func(t *testing.T) {
		ca, err := os.ReadFile(p.caFile)
		if err != nil {
			t.Fatal(err)
		}
		bundle := p.file(t, "bundle.pem", "# comment\n"+string(ca)+"-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n")
		cfg, err := TLSFiles{CAFile: bundle}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := serverLeaf.Verify(x509.VerifyOptions{Roots: cfg.RootCAs}); err != nil {
			t.Errorf("verify: %v", err)
		}
	})

	t.Run("mutual", func(t *testing.T) {
		f := TLSFiles{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey, ServerName: "rabbit.internal"}
		cfg, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Certificates) != 1 {
			t.Fatalf("Certificates = %d, want 1", len(cfg.Certificates))
		}
		if got := cfg.Certificates[0].Leaf.Subject.CommonName; got != "delaybridge-client" {
			t.Errorf("client certificate CN = %q", got)
		}
		if cfg.ServerName != "rabbit.internal" {
			t.Errorf("ServerName = %q", cfg.ServerName)
		}
		if err := f.Validate(); err != nil {
			t.Errorf("Validate() = %v", err)
		}
	})

	t.Run("server-name-only-keeps-system-roots", func(t *testing.T) {
		cfg, err := TLSFiles{ServerName: "rabbit.internal"}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RootCAs != nil {
			t.Error("RootCAs set without CAFile; want nil (system roots)")
		}
		if cfg.ServerName != "rabbit.internal" || cfg.MinVersion != tls.VersionTLS12 {
			t.Errorf("ServerName %q MinVersion %#x", cfg.ServerName, cfg.MinVersion)
		}
	})

	t.Run("client-cert-without-ca", func(t *testing.T) {
		cfg, err := TLSFiles{CertFile: p.clientCert, KeyFile: p.clientKey}.Config()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RootCAs != nil || len(cfg.Certificates) != 1 {
			t.Errorf("RootCAs %v, %d certificates", cfg.RootCAs, len(cfg.Certificates))
		}
	})

	t.Run("fresh-config-per-call", func(t *testing.T) {
		f := TLSFiles{CAFile: p.caFile}
		a, _ := f.Config()
		b, _ := f.Config()
		if a == b {
			t.Fatal("Config returned the same *tls.Config twice")
		}
		a.ServerName = "set-by-amqp091"
		if b.ServerName != "" {
			t.Error("configs share state")
		}
	})
}

func TestTLSFilesErrors(t *testing.T) {
	p := newTestPKI(t)
	missing := filepath.Join(p.dir, "does-not-exist.pem")
	garbage := p.file(t, "garbage.pem", "not a pem file at all\n")
	cases := []struct {
		name      string
		f         TLSFiles
		field     string
		mentions  []string
		notExists bool
	}{
		{"ca-missing", TLSFiles{CAFile: missing}, "CAFile", []string{missing, "TLS CA file", "no such file"}, true},
		{"ca-directory", TLSFiles{CAFile: p.dir}, "CAFile", []string{p.dir}, false},
		{"ca-garbage", TLSFiles{CAFile: garbage}, "CAFile", []string{garbage, "no PEM certificate"}, false},
		{"ca-is-a-key", TLSFiles{CAFile: p.clientKey}, "CAFile", []string{p.clientKey, "no PEM certificate"}, false},
		{"cert-without-key", TLSFiles{CertFile: p.clientCert}, "KeyFile", []string{p.clientCert, "both or neither"}, false},
		{"key-without-cert", TLSFiles{KeyFile: p.clientKey}, "CertFile", []string{p.clientKey, "both or neither"}, false},
		{"cert-without-key-with-ca", TLSFiles{CAFile: p.caFile, CertFile: p.clientCert}, "KeyFile", []string{"both or neither"}, false},
		{"cert-missing", TLSFiles{CertFile: missing, KeyFile: p.clientKey}, "CertFile", []string{missing, "client certificate"}, true},
		{"key-missing", TLSFiles{CertFile: p.clientCert, KeyFile: missing}, "KeyFile", []string{missing, "client key"}, true},
		{"key-mismatch", TLSFiles{CertFile: p.clientCert, KeyFile: p.otherKey}, "CertFile", []string{p.clientCert, p.otherKey, "does not match"}, false},
		{"cert-and-key-swapped", TLSFiles{CertFile: p.clientKey, KeyFile: p.clientCert}, "CertFile", []string{p.clientKey, p.clientCert}, false},
		{"key-garbage", TLSFiles{CertFile: p.clientCert, KeyFile: garbage}, "CertFile", []string{garbage}, false},
		{"cert-is-the-ca-key-mismatch", TLSFiles{CertFile: p.caFile, KeyFile: p.clientKey}, "CertFile", []string{p.caFile}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := c.f.Config()
			if err == nil {
				t.Fatalf("Config() = %v, nil; want an error", cfg)
			}
			if cfg != nil {
				t.Errorf("Config() returned a config with the error")
			}
			verr := c.f.Validate()
			if verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate() = %v; want the same error as Config(): %v", verr, err)
			}
			var fe *TLSFileError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not a *TLSFileError: %v", err, err)
			}
			if fe.Field != c.field {
				t.Errorf("Field = %q, want %q (%v)", fe.Field, c.field, err)
			}
			for _, m := range c.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error does not mention %q: %v", m, err)
				}
			}
			if got := errors.Is(err, fs.ErrNotExist); got != c.notExists {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, c.notExists)
			}
			if fe.Path != "" && strings.Count(err.Error(), fe.Path) != 1 && !strings.Contains(c.name, "swapped") {
				t.Errorf("error repeats the path: %v", err)
			}
			p.assertNoKeyMaterial(t, err.Error())
			t.Log(err)
		})
	}
}

// TestTLSFilesHandshake: the configs work for a real mutual-TLS handshake,
// and fail for a wrong name, an untrusted server or a missing client
// certificate.
func TestTLSFilesHandshake(t *testing.T) {
	p := newTestPKI(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.serverPair},
		ClientCAs:    p.caPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		cn  string
		err error
	}
	results := make(chan result, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					results <- result{err: err}
					return
				}
				// TLS 1.3 reports a missing client certificate only on the
				// first read, so make the client read: echo one byte.
				var b [1]byte
				if _, err := io.ReadFull(tc, b[:]); err != nil {
					results <- result{err: err}
					return
				}
				_, _ = tc.Write(b[:])
				cn := ""
				if st := tc.ConnectionState(); len(st.VerifiedChains) > 0 {
					cn = st.VerifiedChains[0][0].Subject.CommonName
				}
				results <- result{cn: cn}
			}()
		}
	}()
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)

	roundTrip := func(host string, f TLSFiles) error {
		cfg, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ServerName == "" {
			cfg.ServerName = host // what amqp091-go does
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(host, port), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte{'x'}); err != nil {
			return err
		}
		var b [1]byte
		_, err = io.ReadFull(c, b[:])
		return err
	}
	mutual := TLSFiles{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}

	t.Run("ok-localhost", func(t *testing.T) {
		if err := roundTrip("localhost", mutual); err != nil {
			t.Fatal(err)
		}
		if r := <-results; r.err != nil || r.cn != "delaybridge-client" {
			t.Fatalf("server saw %+v", r)
		}
	})
	t.Run("ok-ip", func(t *testing.T) {
		if err := roundTrip("127.0.0.1", mutual); err != nil {
			t.Fatal(err)
		}
		<-results
	})
	t.Run("server-name-override", func(t *testing.T) {
		f := mutual
		f.ServerName = "not-in-the-certificate.example"
		err := roundTrip("127.0.0.1", f)
		if err == nil || !strings.Contains(err.Error(), "not-in-the-certificate.example") {
			t.Fatalf("err = %v; want a name mismatch for the overridden name", err)
		}
		<-results
	})
	t.Run("untrusted-without-ca", func(t *testing.T) {
		f := mutual
		f.CAFile = ""
		var uae x509.UnknownAuthorityError
		if err := roundTrip("localhost", f); !errors.As(err, &uae) {
			t.Fatalf("err = %v; want x509.UnknownAuthorityError", err)
		}
		<-results
	})
	t.Run("no-client-certificate", func(t *testing.T) {
		if err := roundTrip("localhost", TLSFiles{CAFile: p.caFile}); err == nil {
			t.Fatal("handshake without a client certificate succeeded")
		}
		if r := <-results; r.err == nil {
			t.Fatalf("server accepted a client without a certificate: %+v", r)
		}
	})
}
