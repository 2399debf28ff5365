package httpapi

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/metrics"
)

// serve starts a server on a free port and returns its base URL.
func serve(t *testing.T, opts Options) string {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	if opts.Ready == nil {
		opts.Ready = func() error { return nil }
	}
	s := New(opts)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return "http://" + s.Addr()
}

func get(t *testing.T, url string) (int, string, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func TestMetrics(t *testing.T) {
	m := metrics.New()
	m.Ingested(2)
	base := serve(t, Options{Metrics: m.Handler()})
	code, ctype, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	if !strings.HasPrefix(ctype, "text/plain") {
		t.Errorf("Content-Type %q, want the Prometheus text format", ctype)
	}
	if !strings.Contains(body, "delaybridge_messages_ingested_total 2\n") {
		t.Errorf("/metrics lacks the ingested counter:\n%s", body)
	}
	if code, _, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz: %d", code)
	}
}

func TestNoMetrics(t *testing.T) {
	base := serve(t, Options{})
	if code, _, _ := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics without metrics: %d, want 404", code)
	}
}

func TestPprofOnlyWhenOn(t *testing.T) {
	off := serve(t, Options{})
	if code, _, _ := get(t, off+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ with pprof off: %d, want 404", code)
	}
	on := serve(t, Options{Pprof: true})
	code, _, body := get(t, on+"/debug/pprof/")
	if code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("GET /debug/pprof/ with pprof on: %d, %.200q", code, body)
	}
	if code, _, _ := get(t, on+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Errorf("GET /debug/pprof/goroutine: %d", code)
	}
}

// The status page gets GET / and the POSTs of its forms under /ui/, nothing
// else.
func TestStatusRoutes(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	status := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
	})
	base := serve(t, Options{Status: status})
	get(t, base+"/")
	resp, err := http.Post(base+"/ui/login", "application/x-www-form-urlencoded", strings.NewReader("token=x"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if code, _, _ := get(t, base+"/ui/login"); code == http.StatusOK {
		t.Errorf("GET /ui/login: %d", code)
	}
	if code, _, _ := get(t, base+"/other"); code != http.StatusNotFound {
		t.Errorf("GET /other: %d, want 404", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, ",") != "GET /,POST /ui/login" {
		t.Errorf("the status handler saw %v, want GET / and POST /ui/login", seen)
	}
}
