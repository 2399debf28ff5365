package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/delaybridge/delaybridge/wire"
)

// bridgeProc is one bridge running as a child process, so its memory figures
// are its own and a restart is a real process start.
type bridgeProc struct {
	endpoint  string
	errorQ    string
	httpAddr  string
	storePath string
	logPath   string

	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	exitErr error
	logFile *os.File
	stopped bool // stop was called
}

func (p *bridgeProc) timeoutsQueue() string   { return wire.TimeoutsQueue(p.endpoint) }
func (p *bridgeProc) dispatcherQueue() string { return wire.DispatcherQueue(p.endpoint) }

// bridgeEnv is the child's environment: the bench's own without any
// DELAYBRIDGE_* setting (except TLS files, which the broker URL may need),
// then the bench's settings, then the --env overrides.
func bridgeEnv(base []string, set map[string]string, overrides []string) []string {
	var env []string
	for _, kv := range base {
		if strings.HasPrefix(kv, "DELAYBRIDGE_") && !strings.HasPrefix(kv, "DELAYBRIDGE_TLS_") {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return append(env, overrides...) // later entries win in os/exec
}

// startBridge starts a bridge for endpoint on storePath and waits until its
// /readyz answers 200. It returns the time from starting the process to ready.
func (b *bencher) startBridge(ctx context.Context, endpoint, storePath string) (*bridgeProc, time.Duration, error) {
	return b.startBridgeEnv(ctx, endpoint, storePath, nil)
}

// startBridgeEnv is startBridge with extra settings (e.g. a PostgreSQL
// store), applied after the bench's own and before the --env overrides.
func (b *bencher) startBridgeEnv(ctx context.Context, endpoint, storePath string, extra map[string]string) (*bridgeProc, time.Duration, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, 0, err
	}
	p := &bridgeProc{
		endpoint: endpoint, errorQ: endpoint + ".error", httpAddr: addr, storePath: storePath,
		logPath: storePath + "." + strconv.FormatInt(time.Now().UnixNano(), 36) + ".log",
		exited:  make(chan struct{}),
	}
	// The bench deletes these at the end, whatever happens to the bridge.
	b.reg.queue(p.timeoutsQueue())
	b.reg.queue(p.dispatcherQueue())
	b.reg.queue(p.errorQ)
	if err := os.MkdirAll(filepath.Dir(storePath), 0o755); err != nil {
		return nil, 0, err
	}
	p.logFile, err = os.Create(p.logPath)
	if err != nil {
		return nil, 0, err
	}
	p.cmd = exec.Command(b.opts.BridgeCmd[0], b.opts.BridgeCmd[1:]...)
	set := map[string]string{
		"DELAYBRIDGE_AMQP_URL":    b.opts.AMQPURL,
		"DELAYBRIDGE_ENDPOINT":    endpoint,
		"DELAYBRIDGE_ERROR_QUEUE": p.errorQ,
		"DELAYBRIDGE_STORE_PATH":  storePath,
		"DELAYBRIDGE_HTTP_ADDR":   addr,
		"DELAYBRIDGE_LOG_LEVEL":   "warn",
		"DELAYBRIDGE_LOG_FORMAT":  "json",
		// No token file in the bench's working directory; steps that use
		// the admin API set DELAYBRIDGE_ADMIN_TOKEN.
		"DELAYBRIDGE_ADMIN_TOKEN_FILE": "",
	}
	for k, v := range extra {
		set[k] = v
	}
	p.cmd.Env = bridgeEnv(os.Environ(), set, b.opts.BridgeEnv)
	p.cmd.Stdout, p.cmd.Stderr = p.logFile, p.logFile
	setPdeathsig(p.cmd)
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		p.logFile.Close()
		return nil, 0, fmt.Errorf("start bridge %s: %w", strings.Join(b.opts.BridgeCmd, " "), err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	ready, err := p.waitReady(ctx, 60*time.Second)
	if err != nil {
		_, _ = p.stop(5 * time.Second)
		return nil, 0, err
	}
	return p, ready, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// waitReady polls /readyz every 2 ms and returns the time since the process
// was started when it first answers 200.
func (p *bridgeProc) waitReady(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	deadline := p.started.Add(timeout)
	url := "http://" + p.httpAddr + "/readyz"
	for {
		resp, err := httpClient.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(p.started), nil
			}
		}
		select {
		case <-p.exited:
			return 0, fmt.Errorf("bridge exited before it was ready (%v); log: %s", p.exitErr, p.logTail(5))
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bridge not ready after %v; log: %s", timeout, p.logTail(5))
		}
	}
}

// stop sends SIGTERM and waits for the exit (SIGKILL after timeout). It
// returns how long the bridge took to exit.
func (p *bridgeProc) stop(timeout time.Duration) (time.Duration, error) {
	if p.stopped {
		return 0, nil
	}
	p.stopped = true
	defer p.logFile.Close()
	select {
	case <-p.exited:
		return 0, fmt.Errorf("bridge had already exited: %v; log: %s", p.exitErr, p.logTail(5))
	default:
	}
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return time.Since(start), fmt.Errorf("bridge did not stop within %v of SIGTERM; killed", timeout)
	}
	took := time.Since(start)
	if p.exitErr != nil {
		return took, fmt.Errorf("bridge exited with %v after SIGTERM; log: %s", p.exitErr, p.logTail(5))
	}
	return took, nil
}

// kill sends SIGKILL and waits for the exit; the process counts as stopped.
func (p *bridgeProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.stopped = true
	p.logFile.Close()
}

// alive reports whether the process still runs.
func (p *bridgeProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Memory of the bridge process from /proc/<pid>/status, in bytes.
type procMem struct {
	RSS, HWM int64
	// RSS split: anonymous memory (Go heap, stacks, runtime) and file-backed
	// pages (mostly the store's mmap, which the kernel can drop at will).
	Anon, File int64
}

func (p *bridgeProc) mem() (procMem, error) {
	return readProcMem(p.cmd.Process.Pid)
}

func readProcMem(pid int) (procMem, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procMem{}, err
	}
	defer f.Close()
	var m procMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		case "RssAnon":
			dst = &m.Anon
		case "RssFile":
			dst = &m.File
		default:
			continue
		}
		fields := strings.Fields(val) // "12345 kB"
		if len(fields) > 0 {
			kb, _ := strconv.ParseInt(fields[0], 10, 64)
			*dst = kb * 1024
		}
	}
	return m, sc.Err()
}

// debugVars is what the bench reads from the bridge's /debug/vars (expvar),
// when the bridge serves it.
type debugVars struct {
	HeapAlloc  uint64
	HeapInuse  uint64
	Sys        uint64
	NumGC      uint32
	Pending    int64
	HasPending bool
}

var errNoVars = errors.New("the bridge serves no /debug/vars")

func (p *bridgeProc) vars() (debugVars, error) {
	resp, err := httpClient.Get("http://" + p.httpAddr + "/debug/vars")
	if err != nil {
		return debugVars{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return debugVars{}, errNoVars
	}
	return parseVars(resp.Body)
}

func parseVars(r io.Reader) (debugVars, error) {
	var raw struct {
		Memstats *struct {
			HeapAlloc uint64
			HeapInuse uint64
			Sys       uint64
			NumGC     uint32
		} `json:"memstats"`
		Delaybridge map[string]json.RawMessage `json:"delaybridge"`
	}
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return debugVars{}, fmt.Errorf("decode /debug/vars: %w", err)
	}
	if raw.Memstats == nil {
		return debugVars{}, errNoVars
	}
	v := debugVars{HeapAlloc: raw.Memstats.HeapAlloc, HeapInuse: raw.Memstats.HeapInuse, Sys: raw.Memstats.Sys, NumGC: raw.Memstats.NumGC}
	if pr, ok := raw.Delaybridge["pending"]; ok {
		var n json.Number
		if json.Unmarshal(pr, &n) == nil {
			if i, err := n.Int64(); err == nil {
				v.Pending, v.HasPending = i, true
			} else if f, err := n.Float64(); err == nil {
				v.Pending, v.HasPending = int64(f), true
			}
		}
	}
	return v, nil
}

// logTail returns the last n lines of the bridge's log, joined with " | ".
func (p *bridgeProc) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil || len(data) == 0 {
		return "(empty)"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// BridgeLog counts what a bridge logged at warn level and above.
type BridgeLog struct {
	Step     string `json:"step"`
	Path     string `json:"path"`
	Warnings int    `json:"warnings"`
	Errors   int    `json:"errors"`
	Last     string `json:"last,omitempty"` // the last warning or error line
}

func (p *bridgeProc) logSummary(step string) BridgeLog {
	s := BridgeLog{Step: step, Path: p.logPath}
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return s
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(line, `"level":"warn"`):
			s.Warnings++
			s.Last = line
		case strings.Contains(line, `"level":"error"`), strings.Contains(line, `"level":"fatal"`), strings.Contains(line, "panic:"):
			s.Errors++
			s.Last = line
		}
	}
	return s
}

// storeSize is the bbolt file's size and the disk space it takes.
func storeSize(path string) (size, onDisk int64) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0
	}
	size = fi.Size()
	onDisk = size
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		onDisk = st.Blocks * 512
	}
	return size, onDisk
}

// bridgeExe is the file the bridge command runs: name itself when it is a
// path, else where $PATH finds it.
func bridgeExe(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}
