package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Fleet runs the proxies: the real binary, one child process per slot,
// each on its own loopback ports, stopped only by its pid.
type Fleet struct {
	start time.Time
	bin   string

	mu    sync.Mutex
	logs  []LogLine
	incs  []Incarnation
	procs []*proxyProc
}

type proxyProc struct {
	slot        int
	port, admin int
	env         []string // per slot, without the ports

	cmd    *exec.Cmd
	inc    int
	read   chan struct{} // closed once its stdout is read to the end
	stderr *tailBuffer
	paused bool
}

// NewFleet prepares n slots; env(slot) gives each slot's environment
// (UPSTREAM_URL, REDIS_*, and the rest), to which the ports are added.
func NewFleet(start time.Time, bin string, n int, env func(slot int) []string) *Fleet {
	f := &Fleet{start: start, bin: bin}
	for i := range n {
		f.procs = append(f.procs, &proxyProc{slot: i, env: env(i)})
	}
	return f
}

// URLs returns each slot's base URL.
func (f *Fleet) URLs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.procs))
	for i, p := range f.procs {
		out[i] = "http://127.0.0.1:" + strconv.Itoa(p.port)
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts slot's proxy and waits until /healthz answers. A slot keeps
// its ports across restarts unless they cannot be bound any more.
func (f *Fleet) Start(slot int) error {
	p := f.procs[slot]
	var last error
	for attempt := range 3 {
		if p.port == 0 || attempt > 0 {
			var err error
			if p.port, err = freePort(); err != nil {
				return err
			}
			if p.admin, err = freePort(); err != nil {
				return err
			}
		}
		if last = f.launch(p); last == nil {
			return nil
		}
	}
	return last
}

func (f *Fleet) launch(p *proxyProc) error {
	cmd := exec.Command(f.bin)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"LISTEN_ADDR=127.0.0.1:" + strconv.Itoa(p.port),
		"ADMIN_ADDR=127.0.0.1:" + strconv.Itoa(p.admin),
	}, p.env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	p.stderr = &tailBuffer{}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start proxy %d: %w", p.slot, err)
	}
	f.mu.Lock()
	p.cmd, p.paused = cmd, false
	p.inc = len(f.incs)
	f.incs = append(f.incs, Incarnation{Proxy: p.slot, Pid: cmd.Process.Pid, Start: time.Since(f.start)})
	inc := p.inc
	f.mu.Unlock()
	read, exited := make(chan struct{}), make(chan struct{})
	f.mu.Lock()
	p.read = read
	f.mu.Unlock()
	go func() {
		defer close(read)
		f.readLogs(out, p.slot, inc)
	}()
	go func() {
		<-read
		_ = cmd.Wait()
		close(exited)
	}()
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			f.ended(p, "exit")
			return fmt.Errorf("proxy %d exited at start: %s", p.slot, p.stderr.String())
		default:
		}
		if res, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(p.admin) + "/healthz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	f.ended(p, "kill")
	return fmt.Errorf("proxy %d not healthy after 15s: %s", p.slot, p.stderr.String())
}

// readLogs parses the proxy's JSON log lines until its stdout closes.
func (f *Fleet) readLogs(r io.Reader, slot, inc int) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Level     string `json:"level"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
			KeyHash   string `json:"key_hash"`
			Outcome   string `json:"outcome"`
			Status    int    `json:"status"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		f.mu.Lock()
		f.logs = append(f.logs, LogLine{Proxy: slot, Incarnation: inc, At: time.Since(f.start), Level: l.Level, Message: l.Message,
			RequestID: l.RequestID, KeyHash: l.KeyHash, Outcome: l.Outcome, Status: l.Status})
		f.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r)
}

func (f *Fleet) ended(p *proxyProc, how string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.incs[p.inc].End = time.Since(f.start)
	f.incs[p.inc].Ended = how
	p.cmd = nil
}

// Running reports whether slot has a process.
func (f *Fleet) Running(slot int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[slot].cmd != nil
}

// Pid returns slot's process id, or 0.
func (f *Fleet) Pid(slot int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.procs[slot].cmd; c != nil {
		return c.Process.Pid
	}
	return 0
}

// Kill scrapes slot's /metrics, then SIGKILLs it (by pid) and waits until
// everything it wrote has been read.
func (f *Fleet) Kill(slot int) {
	f.stop(slot, syscall.SIGKILL, "kill", 0)
}

// Term stops slot with SIGTERM (after SIGCONT, if paused), waits up to
// grace for a clean exit, then SIGKILLs it.
func (f *Fleet) Term(slot int, grace time.Duration) {
	f.stop(slot, syscall.SIGTERM, "term", grace)
}

func (f *Fleet) stop(slot int, sig syscall.Signal, how string, grace time.Duration) {
	p := f.procs[slot]
	f.mu.Lock()
	cmd, paused, read := p.cmd, p.paused, p.read
	f.mu.Unlock()
	if cmd == nil {
		return
	}
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	m := scrape(p.admin)
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-read:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-read
	f.mu.Lock()
	f.incs[p.inc].Metrics = m
	f.mu.Unlock()
	f.ended(p, how)
}

// Pause sends SIGSTOP to slot; Resume SIGCONT.
func (f *Fleet) Pause(slot int) { f.signal(slot, syscall.SIGSTOP, true) }

// Resume continues a paused slot.
func (f *Fleet) Resume(slot int) { f.signal(slot, syscall.SIGCONT, false) }

func (f *Fleet) signal(slot int, sig syscall.Signal, paused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.procs[slot]
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
		p.paused = paused
	}
}

// Snapshot returns the logs and incarnations so far.
func (f *Fleet) Snapshot() ([]LogLine, []Incarnation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]LogLine(nil), f.logs...), append([]Incarnation(nil), f.incs...)
}

var sample = regexp.MustCompile(`^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+|NaN|\+Inf)$`)
var outcomeLabel = regexp.MustCompile(`outcome="([a-z_]+)"`)

// scrape reads the counters the checker needs from a proxy's /metrics;
// nil when it does not answer within a second.
func scrape(admin int) map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(admin)+"/metrics", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	return parseMetrics(res.Body)
}

func parseMetrics(r io.Reader) map[string]float64 {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		s := sample.FindStringSubmatch(sc.Text())
		if s == nil {
			continue
		}
		v, err := strconv.ParseFloat(s[3], 64)
		if err != nil {
			continue
		}
		switch s[1] {
		case "idemproxy_requests_total":
			if o := outcomeLabel.FindStringSubmatch(s[2]); o != nil {
				m["requests/"+o[1]] += v
			}
		case "idemproxy_double_executions_total":
			m["double_executions"] = v
		case "idemproxy_record_failures_total":
			m["record_failures"] = v
		case "idemproxy_takeover_claim_age_seconds_count":
			m["takeovers"] = v
		case "idemproxy_unknown_outcomes_total":
			m["unknown_outcomes"] += v
		}
	}
	return m
}

// tailBuffer keeps the last 4 KiB written to it (a child's stderr).
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
