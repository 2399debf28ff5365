package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/admin"
)

// The CLI's translation to the API: the requests the handler received.
func TestCLIErrorQueue(t *testing.T) {
	var mu sync.Mutex
	var got []admin.ErrorsRequest
	failed := time.Date(2026, 11, 23, 20, 0, 0, 0, time.UTC)
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", admin.New(admin.Options{Token: "tok",
		Errors: func(_ context.Context, req admin.ErrorsRequest) (admin.ErrorsResult, error) {
			mu.Lock()
			got = append(got, req)
			mu.Unlock()
			res := admin.ErrorsResult{Scanned: 3, Foreign: 1, Deleted: 1}
			res.Replayed = 1
			if req.Op == admin.ErrorsList {
				res.Errors = []admin.ErrorCopyJSON{{ID: "a/1", Position: 1, Stage: "dispatch", Reason: "nack", FailedAt: &failed,
					DestJSON: admin.DestJSON{Destination: "orders"}, ExceptionType: "DelayBridge.DispatchFailedException", MessageJSON: admin.MessageJSON{Headers: map[string]any{"k": "v"}}}}
			}
			return res, nil
		}}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv("DELAYBRIDGE_ADMIN_TOKEN", "tok")
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := runAdmin("errors", append(append([]string{args[0]}, "--url", srv.URL), args[1:]...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	last := func() admin.ErrorsRequest { mu.Lock(); defer mu.Unlock(); return got[len(got)-1] }

	code, out, errOut := run("ls", "--stage", "dispatch", "--exchange", "x", "--routing-key", "k", "--scan", "50", "--limit", "5")
	if r := last(); code != 0 || !strings.Contains(out, "a/1") || !strings.Contains(out, "DelayBridge.DispatchFailedException") ||
		r.Filter.Stage != "dispatch" || r.Filter.Exchange != "x" || r.Filter.Destination != "k" || r.Scan != 50 || r.Limit != 5 {
		t.Fatalf("ls: %d %q %q %+v", code, out, errOut, r)
	}
	code, out, _ = run("show", "a/1")
	if r := last(); code != 0 || r.Filter.ID != "a/1" || !r.Detail || !strings.Contains(out, "header k") {
		t.Fatalf("show: %d %q %+v", code, out, r)
	}
	code, out, _ = run("rm", "a/1")
	if r := last(); code != 0 || r.Op != admin.ErrorsDelete || r.Filter.ID != "a/1" || !strings.Contains(out, "deleted 1") {
		t.Fatalf("rm ID: %d %q %+v", code, out, r)
	}
	code, _, _ = run("rm", "--from", "2026-11-23T19:00:00Z", "--destination", "q")
	if r := last(); code != 0 || r.Op != admin.ErrorsDelete || r.Filter.Destination != "q" || !r.Filter.FailedFrom.Equal(failed.Add(-time.Hour)) {
		t.Fatalf("rm filtered: %d %+v", code, r)
	}
	n := len(got)
	if code, _, errOut = run("rm"); code != exitConfig || len(got) != n || !strings.Contains(errOut, "--all") {
		t.Fatalf("rm without a filter: %d %q", code, errOut)
	}
	if code, _, _ = run("rm", "--all"); code != 0 || !last().Filter.IsEmpty() {
		t.Fatalf("rm --all: %d %+v", code, last())
	}
	code, out, _ = run("replay", "--exception-type", "T")
	if r := last(); code != 0 || r.Op != admin.ErrorsReplay || r.Filter.ExceptionType != "T" || !strings.Contains(out, "replayed 1") {
		t.Fatalf("replay filtered: %d %q %+v", code, out, r)
	}
	if code, _, _ = run("replay", "a", "--stage", "ingest"); code != exitConfig {
		t.Fatalf("replay ID and filter: %d", code)
	}
	if code, _, errOut = run("frob"); code != exitConfig || !strings.Contains(errOut, "unknown command") {
		t.Fatalf("unknown: %d %q", code, errOut)
	}
	var out2 bytes.Buffer
	if code := runAdmin("errors", []string{"--help"}, &out2, &out2); code != exitOK || !strings.Contains(out2.String(), "replay (ID | filters)") {
		t.Fatalf("help: %d %q", code, out2.String())
	}
}
