package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process started by the driver. Its pid is the pid of the
// program itself: taskset execs it in place.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once the process has been waited for
	err  error         // exit error, valid after done
}

// procs owns every process the driver starts, so that all of them are stopped
// by pid at the end, on error and on a signal.
type procs struct {
	nice int // niceness of every process started (0: inherit)
	mu   sync.Mutex
	list []*proc
}

// pinned returns the argv that runs bin with args on cpu (taskset -c) and,
// when nice is not 0, at that niceness. nice and taskset exec in place, so
// the child's pid is bin's pid.
func pinned(nice int, cpu, bin string, args ...string) []string {
	argv := []string{"taskset", "-c", cpu, bin}
	if nice != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(nice)}, argv...)
	}
	return append(argv, args...)
}

// start runs bin pinned to cpu (taskset -c cpu), with exactly env as its
// environment, stdout and stderr going to logPath.
func (ps *procs) start(name, cpu string, env []string, logPath, bin string, args ...string) (*proc, error) {
	return ps.startOwning("", name, cpu, env, logPath, bin, args...)
}

// startOwning is start, and removes dir ("" for none) once the process has
// exited.
func (ps *procs) startOwning(dir, name, cpu string, env []string, logPath, bin string, args ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	argv := pinned(ps.nice, cpu, bin, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	// If the driver itself is killed, the kernel kills the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
		close(p.done)
	}()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to 5s, then SIGKILL and waits up to 5s more.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		fmt.Fprintf(os.Stderr, "bench: %s (pid %d) did not exit after SIGKILL\n", p.name, p.pid())
	}
}

// stopAll stops every process still running, newest first.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	list := append([]*proc(nil), ps.list...)
	ps.list = nil
	ps.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		list[i].stop()
	}
}

// logTail returns the last lines of a process's log, for error messages.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls check every 50ms until it succeeds, the process exits,
// timeout passes, or ctx ends.
func waitReady(ctx context.Context, p *proc, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		if p.exited() {
			return fmt.Errorf("%s exited before it was ready (%v); log:\n%s", p.name, p.err, p.logTail(20))
		}
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %v: %v; log:\n%s", p.name, timeout, last, p.logTail(20))
}

// cpuTicks returns utime+stime of pid from /proc/<pid>/stat, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatTicks(b)
}

// parseStatTicks extracts utime (field 14) + stime (field 15). The command
// name (field 2) may hold spaces and parentheses, so fields are counted after
// the last ')'.
func parseStatTicks(b []byte) (int64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after comm", len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return ut + st, nil
}

// memKB returns the named fields (e.g. VmRSS, VmHWM) of /proc/<pid>/status in KiB.
func memKB(pid int, names ...string) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseStatus(bufio.NewScanner(f), names...)
}

func parseStatus(sc *bufio.Scanner, names ...string) (map[string]int64, error) {
	out := make(map[string]int64, len(names))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, n := range names {
			if k == n {
				fs := strings.Fields(v)
				if len(fs) == 0 {
					return nil, fmt.Errorf("status: empty %s", n)
				}
				x, err := strconv.ParseInt(fs[0], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("status %s: %w", n, err)
				}
				out[n] = x
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("status: no %s", n)
		}
	}
	return out, nil
}

// cpuTimes is one line of /proc/stat: busy and steal ticks, and the total.
type cpuTimes struct{ busy, idle, steal, total int64 }

// readCPUTimes returns the /proc/stat line named cpu ("cpu" for all, "cpu1").
func readCPUTimes(cpu string) (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != cpu {
			continue
		}
		var v [8]int64 // user nice system idle iowait irq softirq steal
		for i := range v {
			v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
		}
		t := cpuTimes{idle: v[3] + v[4], steal: v[7]}
		for _, x := range v {
			t.total += x
		}
		t.busy = t.total - t.idle
		return t, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat: no %s line", cpu)
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{busy: a.busy - b.busy, idle: a.idle - b.idle, steal: a.steal - b.steal, total: a.total - b.total}
}

// runHelper runs one of the bench's own measuring programs (argv, from
// pinned: openloop) to its end, in the bench's environment, and
// calls onLine with each line of its standard output as it comes (the
// window of a measurement opens and closes on such lines) and the
// program's pid. It returns what the program printed on each stream; the
// error is the program's exit, whatever it printed.
func runHelper(ctx context.Context, argv []string, onLine func(line string, pid int)) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = baseEnv()
	// If the driver itself is killed, the kernel kills the helper (as procs.start's children).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", err
	}
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	var out strings.Builder
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		onLine(line, cmd.Process.Pid)
	}
	_, _ = io.Copy(io.Discard, pipe) // a line too long for the scanner: let the helper end
	err = cmd.Wait()
	return out.String(), errBuf.String(), err
}
