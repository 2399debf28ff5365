package cli

import (
	"bytes"
	"strings"
	"testing"
)

// migrate-bindings: help on stdout, exit 0; no exchange, an argument or a
// bad name are usage errors (exit 2, on stderr with the usage); a management
// URL with a password that is no http URL is refused without showing it.
func TestMigrateBindingsUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Run([]string{"migrate-bindings", "--help"}, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "--apply") {
		t.Fatalf("--help: exit %d, stdout %q", code, out.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate-bindings"}, "name a delayed exchange with --exchange"},
		{[]string{"migrate-bindings", "--exchange", "x", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate-bindings", "--exchange", "amq.default"}, "default exchange"},
		{[]string{"migrate-bindings", "--exchange", "x", "--management-url", "ftp://u:s3cret@h/"}, "not an http:// or https:// URL"},
	} {
		out.Reset()
		errOut.Reset()
		t.Setenv("DELAYBRIDGE_MANAGEMENT_URL", "")
		if code := Run(c.args, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), c.want) ||
			!strings.Contains(errOut.String(), "usage: delaybridge migrate-bindings") || strings.Contains(errOut.String(), "s3cret") {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q, with the usage, no password", c.args, code, errOut.String(), c.want)
		}
	}
}
