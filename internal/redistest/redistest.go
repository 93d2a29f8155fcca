// Package redistest starts a real redis-server for tests, on a free loopback
// port, so a test can kill it and start it again on the same port.
//
// A missing redis-server fails the test with the command that installs it:
// tests that depend on Redis semantics are never skipped silently.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by one test.
type Server struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Binary returns the path of redis-server, or fails t with how to install it.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH: these tests need a real Redis. Install it with `make deps` (apt-get install -y redis-server) and run again")
	}
	return bin
}

// Start runs a redis-server with persistence off on a free port of
// 127.0.0.1, and stops it when the test ends. extra are more config lines
// ("maxmemory-policy noeviction").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), args: extra}
	t.Cleanup(s.Kill)
	// FreePort's port can be taken before redis-server binds it (by another
	// test's server, or as the local port of an outgoing connection): a
	// server that exits saying so is started again on another port.
	for attempt := 1; ; attempt++ {
		s.port = pickPort(t)
		out, err := s.launch()
		if err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(out, "Address already in use") {
			t.Fatalf("%v; its output:\n%s", err, out)
		}
		t.Logf("redis-server could not bind port %d (or its cluster bus port), trying others", s.port)
		for i, line := range s.args {
			if strings.HasPrefix(line, "cluster-port ") {
				s.args[i] = "cluster-port " + strconv.Itoa(FreePort(t))
			}
		}
	}
	s.waitPing()
	return s
}

// pickPort is the port Start tries; a test of the retry replaces it.
var pickPort = FreePort

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// Client returns a go-redis client for the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Config returns the redis.conf lines the server runs with.
func (s *Server) Config() string {
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(s.port),
		"dir " + s.dir,
		`save ""`,
		"appendonly no",
		"protected-mode no",
		"repl-diskless-sync-delay 0", // replicas sync at once, not after 5s
	}
	return strings.Join(append(lines, s.args...), "\n") + "\n"
}

func (s *Server) start() {
	s.t.Helper()
	if out, err := s.launch(); err != nil {
		s.t.Fatalf("%v; its output:\n%s", err, out)
	}
	s.waitPing()
}

// launch starts redis-server with s's config and waits until it says it is
// ready. On failure (it exited, or was not ready after 10s; it is stopped
// then) it returns what the server wrote.
func (s *Server) launch() (string, error) {
	// Config on stdin ("-"), as miniredis's integration tests do.
	cmd := exec.Command(s.bin, "-")
	cmd.Stdin = strings.NewReader(s.Config())
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("redis-server stdout: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start redis-server: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	// Keep draining its output so it never blocks on a full pipe; keep the
	// first lines for a failure's message.
	ready, exited := make(chan struct{}), make(chan struct{})
	var (
		once   sync.Once
		logMu  sync.Mutex
		logged []string
	)
	output := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Join(logged, "\n")
	}
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			logMu.Lock()
			if len(logged) < 50 {
				logged = append(logged, sc.Text())
			}
			logMu.Unlock()
			if strings.Contains(sc.Text(), "Ready to accept connections") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
		return "", nil
	case <-exited:
		s.Kill()
		return output(), fmt.Errorf("redis-server on port %d exited before it was ready", s.port)
	case <-time.After(10 * time.Second):
		s.Kill()
		return output(), fmt.Errorf("redis-server on port %d not ready after 10s", s.port)
	}
}

func (s *Server) waitPing() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on port %d does not answer PING: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL (no chance to save anything) and
// waits for it. It only ever signals the process it started.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart starts the server again on the same port (empty: persistence is
// off). Fails the test if the port was taken meanwhile.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// Pause stops the server with SIGSTOP: connections stay open and the
// kernel still accepts new ones, but nothing is answered, as when the
// network to Redis drops packets. Resume undoes it (Kill, and so the
// test's cleanup, ends a paused server too).
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// String describes the server for test logs.
func (s *Server) String() string { return fmt.Sprintf("redis-server pid %d on %s", s.pid(), s.Addr()) }

func (s *Server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// OutputBytes is Redis's total_net_output_bytes (INFO stats): what it has
// sent its clients so far, to tell how much replies carried.
func OutputBytes(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO stats: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_net_output_bytes:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("INFO stats has no total_net_output_bytes")
}
