package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnknownVariables(t *testing.T) {
	got := Unknown([]string{
		"PATH=/usr/bin",
		"DELAYBRIDGE_STORE=bbolt",                  // known
		"DELAYBRIDGE_STOR=postgres",                // a letter short
		"DELAYBRIDGE_POSTGRESS_URL=postgres://x:y", // a letter too many
		"DELAYBRIDGE_HTTPADDR=:9090",               // no underscore
		"DELAYBRIDGE_FROBNICATE=1",                 // like nothing
		"DELAYBRIDGE_ADMIN_URL=http://x",           // the CLI's
		"DELAYBRIDGE_VERSION=v1",                   // docker-compose.yml's build argument
		"DELAYBRIDGE_TEST_AMQP_URL=amqp://x",       // the test suite's
		"XDELAYBRIDGE_STORE=x",
	})
	want := []UnknownVariable{
		{Name: "DELAYBRIDGE_FROBNICATE"},
		{Name: "DELAYBRIDGE_HTTPADDR", Like: "DELAYBRIDGE_HTTP_ADDR"},
		{Name: "DELAYBRIDGE_POSTGRESS_URL", Like: "DELAYBRIDGE_POSTGRES_URL"},
		{Name: "DELAYBRIDGE_STOR", Like: "DELAYBRIDGE_STORE"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Unknown (-want +got):\n%s", diff)
	}
}

func TestVariablesAreTheContracts(t *testing.T) {
	for _, v := range Variables() {
		if !strings.HasPrefix(v, Prefix+"_") {
			t.Errorf("%s lacks the %s_ prefix", v, Prefix)
		}
	}
	if len(Variables()) < 30 {
		t.Fatalf("Variables() = %d names; the tags were not read", len(Variables()))
	}
}

func TestHTTPAddr(t *testing.T) {
	for _, ok := range []string{"", ":8080", "127.0.0.1:8080", "[::1]:0", "localhost:9090"} {
		if _, err := loadClean(t, map[string]string{"DELAYBRIDGE_HTTP_ADDR": ok}); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for addr, want := range map[string]string{
		"8080":           `for port 8080 on every interface write ":8080"`,
		"localhost":      "not host:port",
		":99999":         "not a number from 0 to 65535",
		"localhost:http": "not a number from 0 to 65535",
	} {
		_, err := loadClean(t, map[string]string{"DELAYBRIDGE_HTTP_ADDR": addr})
		if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_HTTP_ADDR") || !strings.Contains(err.Error(), want) {
			t.Errorf("DELAYBRIDGE_HTTP_ADDR=%q: error %v, want one naming the variable and saying %q", addr, err, want)
		}
	}
}

func TestDefaultAdminTokenFileIsTheTags(t *testing.T) {
	c, err := loadClean(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminTokenFile != DefaultAdminTokenFile {
		t.Fatalf("DELAYBRIDGE_ADMIN_TOKEN_FILE defaults to %q, DefaultAdminTokenFile is %q", c.AdminTokenFile, DefaultAdminTokenFile)
	}
}
