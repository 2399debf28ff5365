// Package httpapi serves the bridge's HTTP surface (docs/contract.md §6).
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Options configure the server.
type Options struct {
	Addr string
	// Ready returns nil while the bridge is connected to broker and store, or
	// why it is not.
	Ready func() error
	// Vars, when set, adds a "delaybridge" object to /debug/vars.
	Vars func(context.Context) map[string]any
	// Metrics, when set, serves GET /metrics (metrics.Metrics.Handler:
	// promhttp over the bridge's own registry).
	Metrics http.Handler
	// Admin, when set, serves everything under /api/v1/ (it does its own
	// authentication).
	Admin http.Handler
	// Status, when set, serves the status page at GET / and its forms'
	// POSTs under /ui/ (it authenticates those itself).
	Status http.Handler
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default: a
	// profile costs the bridge CPU and shows its internals).
	Pprof  bool
	Logger zerolog.Logger
}

// Server serves /healthz, /readyz, /debug/vars and /metrics.
type Server struct {
	opts Options
	srv  *http.Server
	ln   net.Listener
	mux  atomic.Pointer[http.ServeMux]
}

// New builds the server; it listens only in Listen.
func New(opts Options) *Server {
	s := &Server{opts: opts}
	s.mux.Store(newMux(opts))
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mux.Load().ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	return s
}

// Swap serves opts's routes from now on, on the address already bound
// (opts.Addr is not used). The bridge starts serving its probes before it
// opens its store, which can take minutes (a file conversion), then swaps
// in everything else once it is built.
func (s *Server) Swap(opts Options) {
	s.mux.Store(newMux(opts))
}

func newMux(opts Options) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := opts.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	// expvar's shape (memstats included) without its global registry, which
	// several bridges in one test process would fight over.
	mux.HandleFunc("GET /debug/vars", func(w http.ResponseWriter, r *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		vars := map[string]any{"memstats": ms}
		if opts.Vars != nil {
			vars["delaybridge"] = opts.Vars(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(vars)
	})
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", opts.Metrics)
	}
	if opts.Admin != nil {
		mux.Handle("/api/v1/", opts.Admin)
	}
	if opts.Status != nil {
		mux.Handle("GET /{$}", opts.Status)
		mux.Handle("POST /ui/", opts.Status)
	}
	if opts.Pprof {
		// Registered on this mux, not http.DefaultServeMux.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Listen binds the address, so a port in use fails start-up, not later.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("http: listen on %s: %w", s.opts.Addr, err)
	}
	s.ln = ln
	return nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// ShutdownTimeout bounds the graceful shutdown of Run; the bridge stops its
// HTTP server after its drain, so a supervisor's grace period covers both.
const ShutdownTimeout = 5 * time.Second

// Run serves until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("http: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", err)
	}
	return nil
}
