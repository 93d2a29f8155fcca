//go:build linux

package e2e

// Tests of `make run` as a newcomer uses it: the Makefile, the demo
// upstream's supervisor and idemproxy together, as real processes. Linux
// only: the process tree is read from /proc.

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// makeRun is a `make run` started by a test, in its own process group so a
// test can send it what a terminal's Ctrl-C sends.
type makeRun struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	err  error // of cmd.Wait, once done is closed
}

func startMakeRun(t *testing.T, demoAddr string) *makeRun {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("these tests drive `make run`: install make (apt-get install make)")
	}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "UPSTREAM_URL", "LISTEN_ADDR", "ADMIN_ADDR", "REDIS_URL", "REDIS_MODE", "LOG_FORMAT", "LOG_LEVEL",
			"DEMO_UPSTREAM_ADDR", "DEMO_DELAY", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS":
			continue // the test's settings, not the caller's; no jobserver of an outer make
		}
		env = append(env, kv)
	}
	env = append(env, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0")
	m := &makeRun{out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	m.cmd = exec.Command("make", "--no-print-directory", "run", "DEMO_UPSTREAM_ADDR="+demoAddr)
	m.cmd.Dir = moduleRoot
	m.cmd.Env = env
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A child left running would hold the output pipe open and Wait with it.
	m.cmd.WaitDelay = 10 * time.Second
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("start make run: %v", err)
	}
	go func() { m.err = m.cmd.Wait(); close(m.done) }()
	t.Cleanup(func() {
		select {
		case <-m.done:
			return
		default:
		}
		// The test failed before stopping it: take the whole tree down.
		for _, p := range descendants(m.cmd.Process.Pid) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		_ = m.cmd.Process.Kill()
		<-m.done
	})
	return m
}

// wait waits up to d for make to exit, and fails the test if it did not.
func (m *makeRun) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-m.done:
		return m.err
	case <-time.After(d):
		t.Fatalf("make run still running after %s; output:\n%s", d, m.out)
		return nil
	}
}

var (
	startedRe = regexp.MustCompile(`"listen":"([0-9.:]+)"[^\n]*"message":"idemproxy started"`)
	demoRe    = regexp.MustCompile(`demo upstream on (http://[0-9.:]+)`)
)

// started waits until idemproxy has logged its start, and returns the
// proxy's address and the demo's URL.
func (m *makeRun) started(t *testing.T) (proxyAddr, demoURL string) {
	t.Helper()
	// It builds two binaries first: generous, for a cold build cache.
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		out := m.out.String()
		if p, d := startedRe.FindStringSubmatch(out), demoRe.FindStringSubmatch(out); p != nil && d != nil {
			return p[1], d[1]
		}
		select {
		case <-m.done:
			t.Fatalf("make run exited (%v) before idemproxy started; output:\n%s", m.err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("idemproxy did not start within 3 minutes; output:\n%s", m.out)
	return "", ""
}

// osProc names a process by pid and start time, so a reused pid is not
// mistaken for it.
type osProc struct {
	pid   int
	start string
	cmd   string
}

// procStat returns a process's parent, state and start time, from /proc.
func procStat(pid int) (ppid int, state, start string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", "", false
	}
	// The command name is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, "", "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, "", "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0], f[19], true
}

// descendants lists every process below pid.
func descendants(pid int) []osProc {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, _, ok := procStat(p); ok {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []osProc
	queue := []int{pid}
	for len(queue) > 0 && len(out) < 100 {
		for _, c := range children[queue[0]] {
			_, _, start, _ := procStat(c)
			cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline")
			out = append(out, osProc{pid: c, start: start, cmd: strings.ReplaceAll(string(cmd), "\x00", " ")})
			queue = append(queue, c)
		}
		queue = queue[1:]
	}
	return out
}

// alive reports whether p still runs: not gone, not a zombie waiting to be
// reaped, and not a new process with its pid.
func (p osProc) alive() bool {
	_, state, start, ok := procStat(p.pid)
	return ok && state != "Z" && start == p.start
}

func assertAllGone(t *testing.T, procs []osProc) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range procs {
		for p.alive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if p.alive() {
			t.Errorf("pid %d (%s) still running after make exited", p.pid, p.cmd)
		}
	}
}

// TestMakeRunStopsTogether starts `make run` with its demo upstream, checks
// that the proxy answers through the demo, stops it as a user would, and
// checks that make, idemproxy and the demo are all gone and that idemproxy
// shut down gracefully (one signal, not two).
func TestMakeRunStopsTogether(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stop func(m *makeRun) error
	}{
		// kill <pid of make>: make passes SIGTERM on to its recipe.
		{"SIGTERM to make", func(m *makeRun) error { return m.cmd.Process.Signal(syscall.SIGTERM) }},
		// What a terminal sends on Ctrl-C: SIGINT to its foreground group.
		{"Ctrl-C", func(m *makeRun) error { return syscall.Kill(-m.cmd.Process.Pid, syscall.SIGINT) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := startMakeRun(t, "127.0.0.1:0")
			proxyAddr, demoURL := m.started(t)

			client := &http.Client{Timeout: 10 * time.Second}
			for i := range 2 { // executed, then replayed
				req, _ := http.NewRequest(http.MethodPost, "http://"+proxyAddr+"/v1/orders", strings.NewReader(`{"amount":100}`))
				req.Header.Set("Idempotency-Key", "order-42")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("POST %d through the proxy: %v", i, err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("POST %d through the proxy: %d %q, want 201 application/json", i, resp.StatusCode, resp.Header.Get("Content-Type"))
				}
			}
			resp, err := client.Get(demoURL + "/")
			if err != nil {
				t.Fatalf("GET the demo: %v", err)
			}
			var counts struct{ Orders int }
			err = json.NewDecoder(resp.Body).Decode(&counts)
			resp.Body.Close()
			if err != nil || counts.Orders != 1 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET the demo: orders %d (%v), %q; want 1 order in application/json", counts.Orders, err, resp.Header.Get("Content-Type"))
			}

			tree := descendants(m.cmd.Process.Pid)
			var names []string
			for _, p := range tree {
				names = append(names, p.cmd)
			}
			joined := strings.Join(names, "\n")
			if !strings.Contains(joined, "bin/demoupstream") || !strings.Contains(joined, "bin/idemproxy") {
				t.Fatalf("processes under make: %q, want bin/demoupstream and bin/idemproxy", names)
			}

			if err := tc.stop(m); err != nil {
				t.Fatalf("signal: %v", err)
			}
			m.wait(t, 30*time.Second)
			assertAllGone(t, tree)
			if out := m.out.String(); strings.Count(out, "shut down cleanly") != 1 {
				t.Errorf("want idemproxy to shut down cleanly once; output:\n%s", out)
			}
		})
	}
}

// TestMakeRunDemoPortTaken: when the demo upstream cannot bind, `make run`
// fails with a message naming the address and DEMO_UPSTREAM_ADDR, and
// idemproxy never starts (it would forward to whatever holds the port).
//
// Not parallel: its make rebuilds bin/idemproxy, which TestMakeRunStopsTogether
// runs. Serial tests all end before the parallel ones start.
func TestMakeRunDemoPortTaken(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	m := startMakeRun(t, held.Addr().String())
	err = m.wait(t, 3*time.Minute)
	out := m.out.String()
	if err == nil {
		t.Fatalf("make run succeeded with the demo's port taken; output:\n%s", out)
	}
	for _, want := range []string{"cannot listen on " + held.Addr().String(), "address already in use", "DEMO_UPSTREAM_ADDR="} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "idemproxy started") {
		t.Errorf("idemproxy started although its demo upstream could not:\n%s", out)
	}
}

// TestMakeHelpNoColourInPipes: `make help` colours only a terminal.
func TestMakeHelpNoColourInPipes(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("make", "--no-print-directory", "help")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("\x1b")) {
		t.Errorf("make help wrote escape codes into a pipe:\n%q", out)
	}
	if !bytes.Contains(out, []byte("  run ")) {
		t.Errorf("make help does not list run:\n%s", out)
	}
}
