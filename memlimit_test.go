package main

// Tests of memlimit.go: Go's memory limit set from the container's at
// GOMEMLIMIT_RATIO, followed while the proxy runs, and the warning when the
// buffers need more than the container has. The container's limit is stood
// in for (containerMemoryLimit); the binary in a real memory cgroup:
// internal/e2e. These tests change process-wide state (Go's memory limit,
// containerMemoryLimit, memoryLimitEvery): none may run in parallel.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

func TestGoMemLimitRatioConfig(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	cfg, err := loadConfig([]string{up})
	if err != nil || cfg.GoMemLimitRatio != 0.9 || cfg.goMemLimit != "" {
		t.Fatalf("default: %v, GOMEMLIMIT_RATIO %v, GOMEMLIMIT %q; want 0.9 and none", err, cfg.GoMemLimitRatio, cfg.goMemLimit)
	}
	for _, v := range []string{"0", "0.5", "0.75", "1"} {
		if cfg, err := loadConfig([]string{up, "GOMEMLIMIT_RATIO=" + v}); err != nil || fmt.Sprint(cfg.GoMemLimitRatio) != v {
			t.Errorf("GOMEMLIMIT_RATIO=%s: %v, want it accepted", v, err)
		}
	}
	for _, v := range []string{"0.09", "0.49", "1.01", "90", "-0.9", "NaN", "Inf", "90%", "off"} {
		_, err := loadConfig([]string{up, "GOMEMLIMIT_RATIO=" + v})
		if err == nil || !strings.Contains(err.Error(), `GOMEMLIMIT_RATIO="`+v+`"`) || strings.Count(err.Error(), "GOMEMLIMIT_RATIO") != 1 ||
			!strings.Contains(err.Error(), "0 (off)") || !strings.Contains(err.Error(), "0.5 to 1") {
			t.Errorf("GOMEMLIMIT_RATIO=%s: %v; want one error naming the variable, the value and what is accepted", v, err)
		}
	}
	if cfg, err := loadConfig([]string{up, "GOMEMLIMIT=200MiB"}); err != nil || cfg.goMemLimit != "200MiB" {
		t.Errorf("GOMEMLIMIT=200MiB: %v, kept %q", err, cfg.goMemLimit)
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	const big = 64 << 30 // large enough that the test process is not squeezed
	bigF := float64(big)
	ninety := int64(bigF * 0.9)
	for _, tt := range []struct {
		name    string
		env     []string
		runtime int64 // Go's limit as the runtime set it from GOMEMLIMIT; 0: as it is
		limit   uint64
		err     error
		want    int64  // Go's memory limit after; -1: unchanged
		warn    string // in cfg.warnings; "" none
		log     []string
	}{
		{name: "ratio of the container's", limit: big, want: ninety, log: []string{`"container_memory_limit":68719476736,"gomemlimit":` + fmt.Sprint(ninety) + `,"ratio":0.9`}},
		{name: "ratio 1", env: []string{"GOMEMLIMIT_RATIO=1"}, limit: big, want: big},
		{name: "off", env: []string{"GOMEMLIMIT_RATIO=0"}, limit: big, want: -1, log: []string{"GOMEMLIMIT_RATIO=0"}},
		{name: "GOMEMLIMIT set", env: []string{"GOMEMLIMIT=100GiB"}, runtime: 100 << 30, limit: big, want: -1,
			log: []string{`"gomemlimit":107374182400,"gomemlimit_env":"100GiB"`, "set by GOMEMLIMIT"}},
		{name: "GOMEMLIMIT=off", env: []string{"GOMEMLIMIT=off"}, runtime: math.MaxInt64, limit: big, want: -1,
			log: []string{`"gomemlimit_env":"off"`, "GOMEMLIMIT sets none"}},
		{name: "no container limit", err: memlimit.ErrNoLimit, want: -1},
		{name: "cgroup unreadable", err: fmt.Errorf("open /proc/self/mountinfo: permission denied"), want: -1, log: []string{"container memory limit unknown"}},
		{name: "limit beyond int64", limit: math.MaxUint64, want: -1},
		// 2 × 32 MiB + 16 MiB + 30 MiB = 110 MiB
		{name: "defaults in 109 MiB", env: []string{"GOMEMLIMIT_RATIO=0"}, limit: 109 << 20, want: -1,
			warn: "MAX_BUFFERED_BYTES=33554432 and REPLAY_CACHE_BYTES=16777216 need about 110 MiB (twice the first, the second and 30 MiB), more than the container's memory limit of 109 MiB"},
		{name: "defaults in 110 MiB", env: []string{"GOMEMLIMIT_RATIO=0"}, limit: 110 << 20, want: -1},
		{name: "raised buffers in 256 MiB", env: []string{"GOMEMLIMIT_RATIO=0", "MAX_BUFFERED_BYTES=134217728", "REPLAY_CACHE_BYTES=0"}, limit: 256 << 20, want: -1,
			warn: "MAX_BUFFERED_BYTES=134217728 and REPLAY_CACHE_BYTES=0 need about 286 MiB"},
		// Twice these used to wrap in int64 (no warning, or a negative size).
		{name: "buffers out of the way", env: []string{"GOMEMLIMIT_RATIO=0", "MAX_BUFFERED_BYTES=9223372036854775807"}, limit: 256 << 20, want: -1,
			warn: "MAX_BUFFERED_BYTES=9223372036854775807 and REPLAY_CACHE_BYTES=16777216 need about 17592186044462 MiB"},
		{name: "buffers 2^62", env: []string{"GOMEMLIMIT_RATIO=0", "MAX_BUFFERED_BYTES=4611686018427387904"}, limit: 256 << 20, want: -1,
			warn: "need about 8796093022254 MiB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inContainer(t, tt.limit, tt.err)
			if tt.runtime != 0 {
				debug.SetMemoryLimit(tt.runtime)
			}
			before := debug.SetMemoryLimit(-1)
			cfg, err := loadConfig(append([]string{up}, tt.env...))
			if err != nil {
				t.Fatal(err)
			}
			var logs testutil.SyncBuffer
			follow := applyMemoryLimit(cfg, zerolog.New(&logs).Level(zerolog.InfoLevel))
			want := tt.want
			wantFollow := tt.limit // followed when set from the container's
			if want == -1 {
				want, wantFollow = before, 0
			}
			if follow != wantFollow {
				t.Errorf("applyMemoryLimit returned %d, want %d (the container's limit when Go's was set from it, else 0)", follow, wantFollow)
			}
			if got := debug.SetMemoryLimit(-1); got != want {
				t.Errorf("Go's memory limit %d, want %d", got, want)
			}
			switch w := strings.Join(cfg.warnings, "\n"); {
			case tt.warn == "" && w != "":
				t.Errorf("warnings %q, want none", w)
			case !strings.Contains(w, tt.warn):
				t.Errorf("warnings %q, want %q", w, tt.warn)
			}
			out := logs.String()
			for _, l := range tt.log {
				if !strings.Contains(out, l) {
					t.Errorf("log %q, want %q", out, l)
				}
			}
			// gomemlimit is the limit in force, always a number of bytes,
			// and only where there is one.
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var m map[string]any
				if line == "" {
					continue
				}
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				v, ok := m["gomemlimit"]
				if _, num := v.(float64); ok && (!num || int64(v.(float64)) != debug.SetMemoryLimit(-1)) {
					t.Errorf("gomemlimit %v (%T), want the limit in force, %d, as a number", v, v, debug.SetMemoryLimit(-1))
				}
				if ok && debug.SetMemoryLimit(-1) == math.MaxInt64 {
					t.Errorf("gomemlimit %v logged with no limit in force", v)
				}
			}
		})
	}
}

// TestRunAppliesMemoryLimit: run applies it before it starts serving, and
// the warning reaches the start log and /readyz.
func TestRunAppliesMemoryLimit(t *testing.T) {
	inContainer(t, 100<<20, nil)
	var stdout testutil.SyncBuffer
	p := startRun(t, &stdout)
	_, body, err := get(newClient(t), "http://"+p.admin+"/readyz")
	if err != nil || !strings.Contains(body, "more than the container's memory limit of 100 MiB") {
		t.Errorf("/readyz: %v %q; want the memory warning", err, body)
	}
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := debug.SetMemoryLimit(-1), int64(float64(uint64(100<<20))*0.9); got != want {
		t.Errorf("Go's memory limit %d, want %d", got, want)
	}
	if log := stdout.String(); !strings.Contains(log, `"container_memory_limit":104857600`) || !strings.Contains(log, "more than the container's memory limit") {
		t.Errorf("start log lacks the memory limit or its warning:\n%s", log)
	}
}

// TestFollowMemoryLimit: a container whose memory limit changes while the
// proxy runs (Kubernetes resizes pods in place) has Go's memory limit moved
// with it, at GOMEMLIMIT_RATIO, logged with the old and new limits; a
// shortfall for the buffers is warned of then as at start; a read that
// fails changes nothing; and the follower stops with its context.
func TestFollowMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	inContainer(t, 64*gib, nil) // puts Go's memory limit back after the test
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "MAX_BUFFERED_BYTES=" + fmt.Sprint(20*gib)})
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	logger := zerolog.New(&logs).Level(zerolog.InfoLevel)
	c := &resizable{}
	c.limit.Store(64 * gib)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		followMemoryLimit(ctx, cfg, logger, c.read, 64*gib, time.Millisecond)
	}()

	c.limit.Store(48 * gib)
	want := atDefaultRatio(48 * gib)
	waitFor(t, "Go's memory limit at 0.9 of the lowered container limit", func() bool { return debug.SetMemoryLimit(-1) == want })
	waitFor(t, "the change logged", func() bool { return strings.Contains(logs.String(), "Go's memory limit follows it") })
	if out := logs.String(); !strings.Contains(out, `"container_memory_limit":51539607552,"previous_container_memory_limit":68719476736,"gomemlimit":`+fmt.Sprint(want)) ||
		strings.Contains(out, "MAX_BUFFERED_BYTES=") {
		t.Errorf("log %q: want the change with both limits and Go's, and no shortfall (40 GiB needed, 48 GiB there)", out)
	}

	c.fail(errors.New("open /sys/fs/cgroup/memory.max: no such file or directory"))
	n := c.reads.Load()
	waitFor(t, "three failed reads", func() bool { return c.reads.Load() >= n+3 })
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Errorf("Go's memory limit %d after failed reads, want it left at %d", got, want)
	}
	c.fail(nil)
	n = c.reads.Load()
	waitFor(t, "three good reads", func() bool { return c.reads.Load() >= n+3 })
	// No container (not Linux, no cgroup) or no limit is no failure.
	for _, err := range []error{memlimit.ErrNoLimit, memlimit.ErrNoCgroup, memlimit.ErrCgroupsNotSupported} {
		c.fail(err)
		n = c.reads.Load()
		waitFor(t, "three reads finding no limit", func() bool { return c.reads.Load() >= n+3 })
	}
	c.fail(nil)
	n = c.reads.Load()
	waitFor(t, "three good reads", func() bool { return c.reads.Load() >= n+3 })
	if out := logs.String(); strings.Count(out, "container memory limit unreadable") != 1 || !strings.Contains(out, "memory.max: no such file") ||
		strings.Count(out, "container memory limit readable again") != 1 {
		t.Errorf("log %q: want the first failed read logged once, with its error, and the recovery once; no container or no limit, nothing", out)
	}
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Errorf("Go's memory limit %d after reads that found no limit, want it left at %d", got, want)
	}

	c.limit.Store(32 * gib)
	waitFor(t, "the lowered limit followed", func() bool { return debug.SetMemoryLimit(-1) == atDefaultRatio(32*gib) })
	waitFor(t, "the shortfall warned of", func() bool {
		return strings.Contains(logs.String(), `"level":"warn","message":"MAX_BUFFERED_BYTES=21474836480 and REPLAY_CACHE_BYTES=16777216 need about`)
	})

	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("followMemoryLimit did not return within 2s of its context's end")
	}
}

// TestFollowMemoryLimitOnceAtRatio: the ratio configured, not 0.9; one log
// line per change, none while the limit stays; previous is the limit last
// followed, not the one at start. (A check against mutants:
// TestFollowMemoryLimit lets through a follower that hard-codes 0.9, drops
// `limit == last` (a log line and a SetMemoryLimit every 30 s for ever) or
// drops `last = limit`.)
func TestFollowMemoryLimitOnceAtRatio(t *testing.T) {
	const gib = 1 << 30
	inContainer(t, 64*gib, nil) // puts Go's memory limit back
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9000", "GOMEMLIMIT_RATIO=0.5"})
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	c := &resizable{}
	c.limit.Store(64 * gib)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		followMemoryLimit(ctx, cfg, zerolog.New(&logs).Level(zerolog.InfoLevel), c.read, 64*gib, time.Millisecond)
	}()
	defer func() { cancel(); <-done }()
	const msg = "Go's memory limit follows it"
	for i, step := range []struct{ limit, prev uint64 }{{48 * gib, 64 * gib}, {40 * gib, 48 * gib}} {
		c.limit.Store(step.limit)
		if !until(2*time.Second, func() bool { return strings.Count(logs.String(), msg) == i+1 }) {
			t.Fatalf("change %d not logged within 2s:\n%s", i+1, logs.String())
		}
		n := c.reads.Load()
		until(2*time.Second, func() bool { return c.reads.Load() >= n+5 })
		if got, want := debug.SetMemoryLimit(-1), int64(step.limit/2); got != want {
			t.Errorf("container %d GiB at GOMEMLIMIT_RATIO=0.5: Go's limit %d, want %d", step.limit>>30, got, want)
		}
		if got := strings.Count(logs.String(), msg); got != i+1 {
			t.Errorf("%d change lines after %d changes and 5 more reads of the same limit, want %d", got, i+1, i+1)
		}
		if want := fmt.Sprintf(`"container_memory_limit":%d,"previous_container_memory_limit":%d`, step.limit, step.prev); !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}
}

// TestFollowMemoryLimitNotThereAtStart: a limit that was not there at start
// is followed when it appears (the follower used to start only for a limit
// found at start):
//   - added in place: a Burstable container without a memory limit may be
//     given one (Kubernetes forbids removing a limit, not adding one), and
//     with cgroup v2 it sees "max" at start;
//   - a first read that failed for a passing reason (EMFILE, a /proc read
//     cut short), which left Go's limit unset for the life of the process.
func TestFollowMemoryLimitNotThereAtStart(t *testing.T) {
	const gib = 1 << 30
	for _, tt := range []struct {
		name    string
		atStart error
	}{
		{"added after start", memlimit.ErrNoLimit},
		{"first read failed", errors.New("failed to open /proc/self/mountinfo: too many open files")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &resizable{}
			c.fail(tt.atStart)
			fastFollow(t, c)
			before := debug.SetMemoryLimit(-1)
			var stdout testutil.SyncBuffer
			p := startRun(t, &stdout)
			if got := debug.SetMemoryLimit(-1); got != before {
				t.Errorf("Go's memory limit %d with no container limit read, want it left at %d", got, before)
			}
			c.limit.Store(64 * gib)
			c.fail(nil)
			want := atDefaultRatio(64 * gib)
			ok := until(2*time.Second, func() bool { return debug.SetMemoryLimit(-1) == want })
			if err := p.stop(); err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Errorf("a container limit of 64 GiB read after start: Go's memory limit is %d after 2s of 1ms reads, want %d (0.9 of it)", debug.SetMemoryLimit(-1), want)
			}
		})
	}
}

// TestRunFollowsMemoryLimit: run starts the follower when it set Go's memory
// limit from the container's, and stops it when it returns.
func TestRunFollowsMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	c := &resizable{}
	c.limit.Store(64 * gib)
	fastFollow(t, c)

	var stdout testutil.SyncBuffer
	p := startRun(t, &stdout)
	if got, want := debug.SetMemoryLimit(-1), atDefaultRatio(64*gib); got != want {
		t.Fatalf("Go's memory limit %d at start, want %d", got, want)
	}
	c.limit.Store(80 * gib)
	waitFor(t, "Go's memory limit at 0.9 of the raised container limit", func() bool { return debug.SetMemoryLimit(-1) == atDefaultRatio(80*gib) })
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	n := c.reads.Load()
	c.limit.Store(72 * gib)
	for i := 0; i < 20 && c.reads.Load() == n; i++ {
		time.Sleep(time.Millisecond) // reads after run returned would count here
	}
	if got := c.reads.Load(); got != n {
		t.Errorf("%d reads of the container's limit after run returned: the follower outlived it", got-n)
	}
}

// TestRunWaitsForMemoryLimitFollower: run returns only after the follower
// has. TestRunFollowsMemoryLimit catches a run that cancels the follower
// without waiting for it (`defer stop()`) 2 times in 10: here a read in
// progress holds the follower, and run must wait for it, so that nothing
// logs after the log buffer closes.
func TestRunWaitsForMemoryLimitFollower(t *testing.T) {
	const gib = 1 << 30
	c := &resizable{}
	c.limit.Store(64 * gib)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fastFollow(t, c)
	containerMemoryLimit = func() (uint64, error) {
		if c.reads.Add(1) > 1 { // the first read is applyMemoryLimit's
			once.Do(func() { close(entered) })
			<-release
		}
		return c.limit.Load(), nil
	}
	var stdout testutil.SyncBuffer
	p := startRun(t, &stdout)
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the follower did not read within 5s")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop() }()
	var err error
	select {
	case err = <-stopped:
		t.Error("run returned while its follower was still reading the container's limit")
		close(release)
	case <-time.After(200 * time.Millisecond):
		close(release)
		select {
		case err = <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("run did not return within 10s of the follower's read ending")
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// TestRunStopsMemoryLimitFollowerOnServeFailure: on the a.failed path (a
// listener that fails) run returns, and its follower stops with it. No other
// test takes that path: a follower given run's ctx instead of its own
// (`followMemoryLimit(ctx, ...)`) passes them all, and there run never
// returns, since nothing cancels ctx.
func TestRunStopsMemoryLimitFollowerOnServeFailure(t *testing.T) {
	const gib = 1 << 30
	c := &resizable{}
	c.limit.Store(64 * gib)
	fastFollow(t, c)
	up := newUpstream(t)
	adminPort := redistest.FreePort(t)
	env := []string{"UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
		"ADMIN_ADDR=127.0.0.1:" + strconv.Itoa(adminPort), "UPSTREAM_TIMEOUT=5s", "REQUEST_READ_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=22s"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"idemproxy"}, env, &stdout, &stderr) }()
	admin := "http://127.0.0.1:" + strconv.Itoa(adminPort) + "/readyz"
	if st, b, err := get(newClient(t), admin); st != 200 && !until(10*time.Second, func() bool { st, b, err = get(newClient(t), admin); return st == 200 }) {
		select {
		case err := <-done:
			t.Fatalf("run: %v", err)
		default:
		}
		t.Fatalf("readyz %d %q %v\nstdout %s\nstderr %s", st, b, err, stdout.String(), stderr.String())
	}
	if !until(2*time.Second, func() bool { return c.reads.Load() > 3 }) {
		t.Fatal("the follower is not reading")
	}
	shutdownListener(t, adminPort)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "serve ") {
			t.Errorf("run: %v, want the listener's failure", err)
		}
	case <-time.After(10 * time.Second):
		cancel() // frees a run whose follower holds it
		<-done
		t.Fatal("run did not return within 10s of its admin listener failing")
	}
	n := c.reads.Load()
	time.Sleep(50 * time.Millisecond)
	if got := c.reads.Load(); got != n {
		t.Errorf("%d reads of the container's limit after run returned", got-n)
	}
}

// shutdownListener shuts down (shutdown(2), not close) the
// listening socket of this process bound to port, so that its Accept
// fails for good and http.Server.Serve returns an error: run's a.failed
// path.
func shutdownListener(t *testing.T, port int) {
	t.Helper()
	for fd := 0; fd < 4096; fd++ {
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		in4, ok := sa.(*syscall.SockaddrInet4)
		if !ok || in4.Port != port {
			continue
		}
		if v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || v != 1 {
			continue
		}
		if err := syscall.Shutdown(fd, syscall.SHUT_RDWR); err != nil {
			t.Skipf("shutdown(2) of the admin listener: %v", err)
		}
		return
	}
	t.Skip("the admin listener's descriptor was not found")
}

// inContainer stands in for a container whose memory limit is limit (err:
// what reading the cgroup returns instead), and puts Go's memory limit
// back after the test: it is the whole test process's.
func inContainer(t *testing.T, limit uint64, err error) {
	t.Helper()
	prev := containerMemoryLimit
	before := debug.SetMemoryLimit(-1)
	containerMemoryLimit = func() (uint64, error) { return limit, err }
	t.Cleanup(func() {
		containerMemoryLimit = prev
		debug.SetMemoryLimit(before)
	})
}

// resizable stands in for a container whose memory limit changes (a pod
// resized in place): a read finds limit, or returns the error set by
// fail; reads counts them.
type resizable struct {
	limit atomic.Uint64
	err   atomic.Pointer[error]
	reads atomic.Int64
}

func (c *resizable) read() (uint64, error) {
	c.reads.Add(1)
	if e := c.err.Load(); e != nil {
		return 0, *e
	}
	return c.limit.Load(), nil
}

// fail makes the reads return err (nil: the limit again).
func (c *resizable) fail(err error) {
	if err == nil {
		c.err.Store(nil)
		return
	}
	c.err.Store(&err)
}

// fastFollow makes run's follower read c every millisecond, and puts
// containerMemoryLimit, memoryLimitEvery and Go's memory limit back after
// the test.
func fastFollow(t *testing.T, c *resizable) {
	t.Helper()
	inContainer(t, 0, nil)
	containerMemoryLimit = c.read
	prev := memoryLimitEvery
	memoryLimitEvery = time.Millisecond
	t.Cleanup(func() { memoryLimitEvery = prev })
}

// atDefaultRatio is Go's memory limit for a container limit at
// GOMEMLIMIT_RATIO's default, as applyMemoryLimit computes it.
func atDefaultRatio(limit uint64) int64 { return int64(float64(limit) * 0.9) }

// until polls cond every millisecond for up to d, and reports whether it
// came true.
func until(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// waitFor fails t unless cond comes true within 2s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 2*time.Second, what, cond)
}
