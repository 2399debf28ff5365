package admin

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrTokenFileExposed is returned for a token file other users can read or
// write: its token cannot be trusted to be secret (docs/contract.md §6.3).
var ErrTokenFileExposed = errors.New("the token file is open to other users")

// tokenBytes is the entropy of a generated token.
const tokenBytes = 32

// ReadTokenFile returns the token in path. A missing file is reported as
// fs.ErrNotExist (wrapped); an empty file, or one other users can read or
// write, as an error.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if m := fi.Mode(); !m.IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	} else if m.Perm()&0o077 != 0 {
		return "", fmt.Errorf("%w: %s has mode %04o; chmod 600 it, or remove it so that the bridge makes a new one", ErrTokenFileExposed, path, m.Perm())
	}
	b := make([]byte, 4096)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b[:n]))
	if tok == "" {
		return "", fmt.Errorf("%s is empty; remove it so that the bridge makes a new token", path)
	}
	return tok, nil
}

// TokenFile returns the token in path, making a random one there first (the
// directory too, for the owner only) when there is no file. created says
// whether it made one. Two bridges racing on one path end with one token.
func TokenFile(path string) (token string, created bool, err error) {
	tok, err := ReadTokenFile(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return tok, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, err
	}
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", false, err
	}
	tok = base64.RawURLEncoding.EncodeToString(b)
	// A temporary file renamed into place without replacing (link): a
	// reader never sees a half-written token, and a racing bridge's token
	// wins or loses whole.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".admin-token-*")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(tok + "\n"); err != nil {
		tmp.Close()
		return "", false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", false, err
	}
	if err := tmp.Close(); err != nil {
		return "", false, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			tok, err := ReadTokenFile(path)
			return tok, false, err
		}
		return "", false, err
	}
	return tok, true, nil
}
