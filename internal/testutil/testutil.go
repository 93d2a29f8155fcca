// Package testutil holds the small helpers that tests of several packages
// share: a buffer several goroutines may write to, a bounded poll, an
// upstream that counts what it receives, and a function as a RoundTripper.
//
// Helpers that only one test file needs stay in that file.
package testutil

import (
	"bytes"
	"flag"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that the writers of several goroutines (a
// logger, a child process's stdout) may share with a test that reads it.
// The zero value is ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pollEvery is how often Eventually asks its condition again.
const pollEvery = 10 * time.Millisecond

// Eventually polls cond until it holds, and fails t (t.Fatalf, naming what)
// if it still does not hold after within. cond runs at least once, on the
// calling goroutine.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(pollEvery)
	}
}

// DefaultParallel lets up to n tests (at least GOMAXPROCS) of the package
// run in parallel, unless -parallel was given. It is for a TestMain, after
// flag.Parse, of a package whose parallel tests mostly wait (on a lock TTL,
// a failover, a child process) rather than use the CPU.
func DefaultParallel(n int) {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}

// Upstream stands in for the protected API: an httptest.Server that counts
// every request it receives, in all and per Idempotency-Key, before its
// handler answers. It is closed when the test ends.
type Upstream struct {
	*httptest.Server
	// Calls counts the requests received so far.
	Calls   atomic.Int64
	perKey  sync.Map // Idempotency-Key -> *atomic.Int64
	handler atomic.Pointer[http.HandlerFunc]
}

// NewUpstream starts an Upstream whose requests h answers, after they are
// counted (so h may read Calls and KeyCalls to number its answer).
func NewUpstream(t testing.TB, h http.HandlerFunc) *Upstream {
	t.Helper()
	u := &Upstream{}
	u.SetHandler(h)
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.Calls.Add(1)
		n, _ := u.perKey.LoadOrStore(r.Header.Get("Idempotency-Key"), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		(*u.handler.Load())(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// SetHandler makes h answer the requests that arrive from now on.
func (u *Upstream) SetHandler(h http.HandlerFunc) { u.handler.Store(&h) }

// KeyCalls returns how many requests carrying Idempotency-Key key the
// upstream has received.
func (u *Upstream) KeyCalls(key string) int64 {
	if n, ok := u.perKey.Load(key); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// RoundTripFunc is a function used as an http.RoundTripper, to stand in for
// a Transport (a dial that hangs, an error) without a server.
type RoundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f(r).
func (f RoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
