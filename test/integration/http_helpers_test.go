package integration

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// request sends method to path on bridge b's HTTP address, with the admin
// token when admin is set, and returns the response and its body, read and
// closed. A request that gets no whole response fails the test.
func request(t testing.TB, b *bridgeProc, method, path string, admin bool) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+b.HTTPAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if admin {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp, string(body)
}

// adminDo calls bridge b's admin API with the token and returns the status
// and body.
func adminDo(t *testing.T, b *bridgeProc, method, path string) (int, string) {
	t.Helper()
	resp, body := request(t, b, method, path, true)
	return resp.StatusCode, body
}

// httpGet is the body of bridge b's answer to GET path, whatever its status.
func httpGet(t *testing.T, b *bridgeProc, path string) string {
	t.Helper()
	_, body := request(t, b, http.MethodGet, path, false)
	return body
}
