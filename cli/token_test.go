package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delaybridge/delaybridge/admin"
)

// The admin token must not show in usage text: it used to be the --token
// flag's default, which flag prints.
func TestCLIUsageNeverShowsTheToken(t *testing.T) {
	const secret = "s3cr3t-admin-token"
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN", secret)
	for cmd := range adminCommands {
		for _, args := range [][]string{
			{"--help"},
			{"--no-such-flag"},
			{"--limit", "not-a-number"},
			{"one", "two", "three", "four"},
		} {
			var out, errOut bytes.Buffer
			code := runAdmin(cmd, append(args, "--url", "http://127.0.0.1:1"), &out, &errOut)
			if code == 0 && args[0] != "--help" {
				t.Errorf("%s %v: exit 0, want a usage error", cmd, args)
			}
			if code != 0 && args[0] == "--help" {
				t.Errorf("%s --help: exit %d, want 0", cmd, code)
			}
			if all := out.String() + errOut.String(); strings.Contains(all, secret) {
				t.Errorf("%s %v printed the token:\n%s", cmd, args, all)
			}
			// Help asked for goes to stdout.
			if args[0] == "--help" && !strings.Contains(out.String(), "DELAYBRIDGE_ADMIN_TOKEN") {
				t.Errorf("%s --help does not say where the token comes from:\n%s", cmd, out.String())
			}
		}
	}
}

// The env var is read when --token is not given, and --token (even empty)
// wins over it.
func TestCLITokenFromFlagOrEnv(t *testing.T) {
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN", "from-env")
	got := authorizations(t, []string{}, []string{"--token", "from-flag"}, []string{"--token="})
	want := []string{"Bearer from-env", "Bearer from-flag", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Authorization headers %q, want %q", got, want)
	}
}

// authorizations runs `stats` with each of args against a server on this
// machine and returns the Authorization header of each request.
func authorizations(t *testing.T, args ...[]string) []string {
	t.Helper()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"pending":0,"leased":0}`))
	}))
	defer srv.Close()
	for _, a := range args {
		var out, errOut bytes.Buffer
		if code := runAdmin("stats", append([]string{"--url", srv.URL}, a...), &out, &errOut); code != 0 {
			t.Fatalf("stats %v: exit %d: %s", a, code, errOut.String())
		}
	}
	return got
}

// The CLI sends the token file's token to a bridge on this machine when no
// token is given, and never to another host.
func TestCLITokenFromTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin-token")
	tok, _, err := admin.TokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN", "")
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN_FILE", path)
	got := authorizations(t, []string{}, []string{"--token", "from-flag"})
	if want := []string{"Bearer " + tok, "Bearer from-flag"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Authorization headers %q, want %q", got, want)
	}

	for u, want := range map[string]bool{
		"http://127.0.0.1:8080": true, "http://localhost:8080/": true, "http://[::1]:8080": true,
		"http://127.9.9.9": true, "http://bridge.example:8080": false, "http://10.0.0.5:8080": false,
		"http://localhost.example.com": false, "::bad": false,
	} {
		if isLoopback(u) != want {
			t.Errorf("isLoopback(%q) = %v, want %v", u, !want, want)
		}
	}
}
