package broker

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRedactReplacesTheUserinfoStructurally(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"amqp://guest:x@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"amqp://guest:a@b@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"amqp://guest:p:w/d@localhost:5672/vh", "amqp://guest:xxxxx@localhost:5672/vh"},
		{"amqp://guest:p%40ss%2Fw@localhost/", "amqp://guest:xxxxx@localhost/"},
		// url.Parse takes "12" for a port and the rest for the path.
		{"amqp://guest:12/w@localhost/", "amqp://guest:xxxxx@localhost/"},
		// url.Parse rejects these.
		{"amqp://guest:ab%zzcd@localhost/", "amqp://guest:xxxxx@localhost/"},
		{"amqp://guest:a b@localhost/", "amqp://guest:xxxxx@localhost/"},
		{"amqp://guest:@localhost/", "amqp://guest:xxxxx@localhost/"},
		{"amqp://guest@localhost/", "amqp://guest@localhost/"},
		{"amqps://localhost:5671/vh", "amqps://localhost:5671/vh"},
		{"postgres://app:s3cr%3At@db:5432/x?sslmode=disable", "postgres://app:xxxxx@db:5432/x?sslmode=disable"},
	} {
		if got := Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestRedactTextLeavesOrdinaryWordsAlone(t *testing.T) {
	// A one-letter password that occurs in the broker's answer: substring
	// replacement turned "Exception" into "Exxxxxception", revealing it.
	msg := `Exception (403) Reason: "username or password not allowed"`
	if got := RedactText(msg, "amqp://guest:x@localhost/"); got != msg {
		t.Fatalf("RedactText changed a message without a URL: %q", got)
	}
}

func TestRedactTextRedactsEveryURLInTheMessage(t *testing.T) {
	for _, c := range []struct{ raw, pw string }{
		{"amqp://guest:x@h1:5672/", ":x@"},
		{"amqp://guest:a@b@h1:5672/", "a@b"},
		{"amqp://guest:p:w/d@h1:5672/", "p:w/d"},
		{"amqp://guest:p%40w@h1:5672/", "p%40w"},
		{`amqp://guest:q"uo te@h1:5672/`, "uo te"},
	} {
		for _, msg := range []string{
			"dial " + c.raw + ": refused",
			`parse "` + c.raw + `": oops`,
		} {
			got := RedactText(msg, c.raw)
			if strings.Contains(got, c.pw) || !strings.Contains(got, "guest:xxxxx@h1") {
				t.Errorf("RedactText(%q, %q) = %q: password %q still there or URL not redacted", msg, c.raw, got, c.pw)
			}
		}
	}
	// URLs the caller did not name are redacted too, each one.
	got := RedactText("tried amqp://a:one@h1/ and 'amqp://b:two@h2/' then postgres://c:three@db/x", "amqp://a:one@h1/")
	if want := "tried amqp://a:xxxxx@h1/ and 'amqp://b:xxxxx@h2/' then postgres://c:xxxxx@db/x"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestRedactTextDropsParseErrorDetails(t *testing.T) {
	// url.Parse's error quotes a bad escape or "port" taken from the password.
	for _, raw := range []string{"amqp://guest:ab%zzcd@localhost/", "amqp://guest:p:wz/d@localhost:5672/"} {
		_, err := amqp.ParseURI(raw)
		if err == nil {
			t.Fatalf("ParseURI(%q) succeeded", raw)
		}
		got := RedactText(err.Error(), raw)
		for _, leak := range []string{"zz", "wz", "cd"} {
			if strings.Contains(got, leak) {
				t.Errorf("RedactText(%q) = %q: contains %q from the password", err, got, leak)
			}
		}
		if !strings.Contains(got, "amqp://guest:xxxxx@localhost") || !strings.Contains(got, "percent-encoded") {
			t.Errorf("RedactText(%q) = %q: want the redacted URL and the reason", err, got)
		}
	}
}

func TestDialErrorsKeepTheCauseAndHideThePassword(t *testing.T) {
	addr := strings.TrimSuffix(strings.TrimPrefix(closedPortURL(t), "amqp://guest:secret@"), "/")
	for _, c := range []struct{ pw, cause string }{
		// "o" occurs in "connection refused": substring replacement garbled it.
		{"o", "connection refused"},
		{"a@b", "connection refused"},
		{"p%3Aw%2Fd", "connection refused"},
		{"p:w/d", "percent-encoded"},
		{"ab%zzcd", "percent-encoded"},
	} {
		_, err := dial("amqp://guest:"+c.pw+"@"+addr+"/", "redact test", amqp.Config{})
		if err == nil {
			t.Fatalf("dial with password %q succeeded", c.pw)
		}
		msg := err.Error()
		if !strings.Contains(msg, c.cause) || !strings.Contains(msg, "guest:xxxxx@") {
			t.Errorf("password %q: error %q lacks %q or the redacted URL", c.pw, msg, c.cause)
		}
		if len(c.pw) > 1 && strings.Contains(msg, c.pw) {
			t.Errorf("password %q appears in %q", c.pw, msg)
		}
		for _, part := range []string{"zz", "w/d", "@b@"} {
			if strings.Contains(c.pw, part) && strings.Contains(msg, part) {
				t.Errorf("password %q: %q appears in %q", c.pw, part, msg)
			}
		}
	}
}
