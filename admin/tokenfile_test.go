package admin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestTokenFileMadeOnceAndKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new", "admin-token")
	tok, created, err := TokenFile(path)
	if err != nil || !created || len(tok) < 40 {
		t.Fatalf("TokenFile = %q, %v, %v; want a new token of 32 random bytes", tok, created, err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v; want %04o", p, err, fi.Mode().Perm(), want)
		}
	}
	again, created, err := TokenFile(path)
	if err != nil || created || again != tok {
		t.Fatalf("second TokenFile = %q, %v, %v; want the first token, not created", again, created, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".admin-token-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestTokenFileRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin-token")
	var wg sync.WaitGroup
	toks := make([]string, 8)
	made := make([]bool, 8)
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			toks[i], made[i], err = TokenFile(path)
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n := 0
	for i := range toks {
		if toks[i] != toks[0] {
			t.Fatalf("racing TokenFile calls got different tokens: %q", toks)
		}
		if made[i] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d calls say they made the file, want 1", n)
	}
}

func TestTokenFileRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // not narrowed by the umask
			t.Fatal(err)
		}
		return p
	}
	if tok, err := ReadTokenFile(write("ok", "  mine\n", 0o400)); err != nil || tok != "mine" {
		t.Errorf("an owner-only file with a token: %q, %v", tok, err)
	}
	for _, tc := range []struct {
		path, want string
		exposed    bool
	}{
		{write("shared", "tok\n", 0o644), "mode 0644; chmod 600", true},
		{write("group", "tok\n", 0o620), "mode 0620", true},
		{write("empty", " \n", 0o600), "is empty", false},
		{dir, "not a regular file", false},
	} {
		tok, err := ReadTokenFile(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrTokenFileExposed) != tc.exposed {
			t.Errorf("ReadTokenFile(%s) = %q, %v; want an error saying %q (exposed %v)", filepath.Base(tc.path), tok, err, tc.want, tc.exposed)
		}
		if _, _, err := TokenFile(tc.path); err == nil {
			t.Errorf("TokenFile(%s) accepted it", filepath.Base(tc.path))
		}
		if strings.Contains(err.Error(), "tok\n") {
			t.Errorf("the error quotes the token: %v", err)
		}
	}
	if _, err := ReadTokenFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want os.ErrNotExist", err)
	}
}
