package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// TLSFiles are the TLS settings for amqps:// URLs: PEM files on disk and an
// optional verification name. The zero value means "the library's default":
// the system roots, no client certificate, and the URL's host as the name.
type TLSFiles struct {
	// CAFile is a PEM bundle of CA certificates to trust instead of the
	// system roots.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate (optionally
	// followed by intermediates) and its private key, for mutual TLS and the
	// EXTERNAL mechanism. Both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name sent as SNI and checked against the
	// server's certificate. Empty: amqp091-go uses the URL's host.
	ServerName string
}

// IsZero reports whether no setting is given.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// TLSFileError reports a TLS setting that cannot be used. It names the file
// but never includes the file's contents, so key material cannot leak into
// logs.
type TLSFileError struct {
	// Field is the setting to fix: "CAFile", "CertFile" or "KeyFile".
	Field string
	// Path is the file named by Field ("" when the setting is missing).
	Path string
	// Err is the cause (wraps fs errors, so errors.Is(err, fs.ErrNotExist)
	// works).
	Err error
}

func (e *TLSFileError) Error() string {
	what := map[string]string{
		"CAFile":   "TLS CA file",
		"CertFile": "TLS client certificate file",
		"KeyFile":  "TLS client key file",
	}[e.Field]
	if what == "" {
		what = "TLS " + e.Field
	}
	cause := e.Err.Error()
	var pe *fs.PathError
	if errors.As(e.Err, &pe) && pe.Path == e.Path {
		// "open /x: no such file or directory" would repeat the path.
		cause = "cannot " + pe.Op + ": " + pe.Err.Error()
	}
	if e.Path == "" {
		return what + ": " + cause
	}
	return fmt.Sprintf("%s %q: %s", what, e.Path, cause)
}

func (e *TLSFileError) Unwrap() error { return e.Err }

// Config loads the files and returns the client TLS configuration for
// amqp.Config.TLSClientConfig. It returns (nil, nil) for the zero TLSFiles,
// which tells amqp091-go to use its defaults. Errors are *TLSFileError.
//
// Each call returns a new *tls.Config. amqp091-go writes the URL's host into
// an empty ServerName of the config it is given, so a config must not be
// shared by concurrent dials: call Config (or Clone) per dial.
func (f TLSFiles) Config() (*tls.Config, error) {
	if f.IsZero() {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: f.ServerName,
	}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, &TLSFileError{Field: "CAFile", Path: f.CAFile, Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &TLSFileError{Field: "CAFile", Path: f.CAFile,
				Err: errors.New("contains no PEM certificate (want a bundle of \"-----BEGIN CERTIFICATE-----\" blocks)")}
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		return nil, &TLSFileError{Field: "KeyFile",
			Err: fmt.Errorf("not set, but the client certificate %q needs it (set both or neither)", f.CertFile)}
	case f.CertFile == "" && f.KeyFile != "":
		return nil, &TLSFileError{Field: "CertFile",
			Err: fmt.Errorf("not set, but the client key %q needs it (set both or neither)", f.KeyFile)}
	case f.CertFile != "":
		certPEM, err := os.ReadFile(f.CertFile)
		if err != nil {
			return nil, &TLSFileError{Field: "CertFile", Path: f.CertFile, Err: err}
		}
		keyPEM, err := os.ReadFile(f.KeyFile)
		if err != nil {
			return nil, &TLSFileError{Field: "KeyFile", Path: f.KeyFile, Err: err}
		}
		// crypto/tls's errors describe PEM block types and mismatches,
		// never the bytes.
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		clear(keyPEM)
		if err != nil {
			return nil, &TLSFileError{Field: "CertFile", Path: f.CertFile,
				Err: fmt.Errorf("with key file %q: %w", f.KeyFile, err)}
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Validate performs every check Config does (the files exist, parse and
// match), for start-up configuration validation.
func (f TLSFiles) Validate() error {
	_, err := f.Config()
	return err
}
