package broker

import (
	"net/url"
	"strings"
)

// redacted stands in for a password.
const redacted = "xxxxx"

// Redact returns the URL with the password of its userinfo replaced, for
// logs and errors. It works on the text, not on url.Parse's view: a password
// with an unescaped '@' or '/' can make url.Parse see no userinfo (or fail),
// so everything between "://" and the URL's last '@' counts as userinfo.
// That over-redacts a URL with an '@' in its path, never under-redacts.
func Redact(rawURL string) string {
	start := 0
	if i := strings.Index(rawURL, "://"); i >= 0 {
		start = i + 3
	}
	at := strings.LastIndexByte(rawURL[start:], '@')
	if at < 0 {
		return rawURL
	}
	return rawURL[:start] + redactUserinfo(rawURL[start:start+at]) + rawURL[start+at:]
}

// RedactText returns an error message with the userinfo of every URL in it
// redacted (docs/contract.md §5.1: the password never appears in errors).
// The password is never searched for as a substring: that would reveal a
// short one by garbling ordinary words, and miss escaped forms. rawURLs are
// the URLs the error is about; each is also replaced where it appears
// verbatim. If one of them cannot be parsed (a password with a space or a
// quote, which would end a URL found by scanning, is one), no connection
// was attempted and the message is a parse error whose detail may quote
// pieces of the password (an invalid escape, a "port"): it is replaced by
// an explanation that names only the redacted URL.
func RedactText(text string, rawURLs ...string) string {
	for _, raw := range rawURLs {
		if !hasUserinfo(raw) {
			continue
		}
		if _, err := url.Parse(raw); err != nil {
			return parseProblem(raw)
		}
		text = strings.ReplaceAll(text, raw, Redact(raw))
	}
	return redactURLs(text)
}

// parseProblem explains why raw cannot be parsed without quoting it.
func parseProblem(raw string) string {
	safe := Redact(raw)
	if _, err := url.Parse(safe); err != nil {
		// The problem is outside the userinfo, and err quotes only safe.
		return err.Error()
	}
	return "URL " + safe + " cannot be parsed: the user name or password contains a reserved character " +
		"(such as @ : / ? # %) that is not percent-encoded"
}

// hasUserinfo reports whether raw is a URL that may carry a password (a
// key=value connection string is not a URL).
func hasUserinfo(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	return ok && strings.Contains(rest, "@")
}

// redactURLs redacts the userinfo after every "://" in s. A URL runs to the
// next white space or quote-like character; its userinfo is everything up
// to its last '@'.
func redactURLs(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexFunc(s, endsURL)
		if end < 0 {
			end = len(s)
		}
		if at := strings.LastIndexByte(s[:end], '@'); at >= 0 {
			b.WriteString(redactUserinfo(s[:at]))
			b.WriteString(s[at:end])
		} else {
			b.WriteString(s[:end])
		}
		s = s[end:]
	}
}

// redactUserinfo keeps the user name (up to the first ':'; it is not a
// secret) and replaces the rest. A userinfo without ':' is a bare user name.
func redactUserinfo(ui string) string {
	user, _, ok := strings.Cut(ui, ":")
	if !ok {
		return ui
	}
	return user + ":" + redacted
}

func endsURL(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '"', '\'', '`', '<', '>':
		return true
	}
	return false
}
