package main

// review69: GOMEMLIMIT_RATIO following the container's memory limit
// (bb9617f). TestReview69FollowsLimitNotThereAtStart fails on bb9617f; the
// others pass there and fail on mutants the commit's own tests let through.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

// A limit that was not there at start is followed when it appears (found
// by review69: bb9617f started the follower only for a limit found at
// start):
//   - added in place: a Burstable container without a memory limit may be
//     given one (Kubernetes forbids removing a limit, not adding one), and
//     with cgroup v2 it sees "max" at start;
//   - a first read that failed for a passing reason (EMFILE, a /proc read
//     cut short), which left Go's limit unset for the life of the process.
func TestReview69FollowsLimitNotThereAtStart(t *testing.T) {
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

// Mutation check (passes on bb9617f): the ratio configured, not 0.9; one
// log line per change, none while the limit stays; previous is the limit
// last followed, not the one at start. TestFollowMemoryLimit lets through
// a follower that hard-codes 0.9, drops `limit == last` (a log line and a
// SetMemoryLimit every 30 s for ever) or drops `last = limit`.
func TestReview69FollowOnceAtRatio(t *testing.T) {
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

// Mutation check (passes on bb9617f): run returns only after the follower
// has. TestRunFollowsMemoryLimit catches a run that cancels the follower
// without waiting for it (`defer stop()`) 2 times in 10: here a read in
// progress holds the follower, and run must wait for it, so that nothing
// logs after the log buffer closes.
func TestReview69RunWaitsForFollower(t *testing.T) {
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

// review69ShutdownListener shuts down (shutdown(2), not close) the
// listening socket of this process bound to port, so that its Accept
// fails for good and http.Server.Serve returns an error: run's a.failed
// path.
func review69ShutdownListener(t *testing.T, port int) {
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

// Mutation check (passes on bb9617f): on the a.failed path (a listener
// that fails) run returns, and its follower stops with it. No test of
// bb9617f takes that path: a follower given run's ctx instead of its own
// (`followMemoryLimit(ctx, ...)`) passes them all, and there run never
// returns, since nothing cancels ctx.
func TestReview69RunStopsFollowerOnServeFailure(t *testing.T) {
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
	review69ShutdownListener(t, adminPort)
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
