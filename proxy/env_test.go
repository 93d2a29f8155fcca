package proxy_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/proxy"
)

// env is one proxy under test: an httptest upstream that counts its calls,
// a Redis (miniredis or a real redis-server), and the Handler served over
// real HTTP by an httptest.Server.
type env struct {
	t        *testing.T
	backend  string
	upstream *testutil.Upstream
	calls    *atomic.Int64 // &upstream.Calls
	rdb      *redis.Client
	mr       *miniredis.Miniredis // miniredis backend
	mrNow    time.Time            // miniredis's clock (TIME), moved by advance
	redis    *redistest.Server    // redis-server backend
	opts     proxy.Options
	h        *proxy.Handler
	srv      *httptest.Server
	reg      *prometheus.Registry
	logs     *testutil.SyncBuffer
}

const (
	miniBackend = "miniredis"
	realBackend = "redis-server"
)

var bothBackends = []string{miniBackend, realBackend}

// TestMain runs the tests that call t.Parallel up to 8 at a time, not
// GOMAXPROCS (2 on the project's machines): they spend their time waiting
// on lock TTLs, upstream and read deadlines and probe periods, not on the
// CPU. The tests that measure the heap, count allocations or goroutines, or
// set GOMAXPROCS do not call t.Parallel, so they run before them, alone.
// An explicit -parallel wins.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}

// defaultOptions mirror the contract's defaults, with short lock and
// upstream timeouts so that expiry tests run in well under a second.
func defaultOptions() proxy.Options {
	return proxy.Options{
		KeyHeader: "Idempotency-Key",
		Methods:   []string{"POST"},
		Default: proxy.Policy{
			TTL:     time.Hour,
			LockTTL: 2 * time.Second,
		},
		MaxKeyLength:       255,
		MaxBodyBytes:       1 << 20,
		MaxStoredBytes:     1 << 20,
		ScopeHeaders:       []string{"Authorization"},
		UpstreamTimeout:    time.Second,
		RequestReadTimeout: 5 * time.Second,
	}
}

func newEnv(t *testing.T, backend string, mutate func(*proxy.Options)) *env {
	t.Helper()
	e := &env{t: t, backend: backend, logs: &testutil.SyncBuffer{}}
	e.upstream = testutil.NewUpstream(t, e.created)
	e.calls = &e.upstream.Calls

	switch backend {
	case miniBackend:
		e.mr = miniredis.RunT(t)
		e.mrNow = time.Now()
		e.mr.SetTime(e.mrNow) // locks are judged on TIME: it moves with advance only
		e.rdb = redis.NewClient(&redis.Options{Addr: e.mr.Addr()})
	case realBackend:
		e.redis = redistest.Start(t)
		e.rdb = redis.NewClient(&redis.Options{Addr: e.redis.Addr(), MaxRetries: 1, DialerRetries: 1})
	default:
		t.Fatalf("unknown backend %q", backend)
	}
	t.Cleanup(func() { _ = e.rdb.Close() })

	e.opts = defaultOptions()
	e.opts.Upstream, _ = url.Parse(e.upstream.URL)
	if mutate != nil {
		mutate(&e.opts)
	}
	e.h, e.srv, e.reg = e.newProxy(e.opts)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", e.logs)
		}
	})
	return e
}

// newProxy starts another Handler on the same Redis (a second replica).
func (e *env) newProxy(opts proxy.Options) (*proxy.Handler, *httptest.Server, *prometheus.Registry) {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	metrics := proxy.NewMetrics(reg)
	logger := zerolog.New(e.logs).With().Timestamp().Logger()
	opts.Logger = logger
	opts.Metrics = metrics
	h, err := proxy.New(claim.NewStore(e.rdb, "idem:", metrics.ObserveScript), opts)
	if err != nil {
		e.t.Fatalf("proxy.New: %v", err)
	}
	srv := httptest.NewServer(h)
	e.t.Cleanup(srv.Close)
	return h, srv, reg
}

func (e *env) setUpstream(f http.HandlerFunc) { e.upstream.SetHandler(f) }

// created is the default upstream: 201 with a body naming the call, an
// end-to-end header, a cookie, and a hop-by-hop header named in Connection.
func (e *env) created(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Custom", "kept")
	h.Add("Set-Cookie", "session=abc; Path=/")
	h.Set("Connection", "X-Hop")
	h.Set("X-Hop", "dropped")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"call":%d,"path":%q,"body_len":%d}`, e.calls.Load(), r.URL.Path, len(body))
}

// response is a fully read answer.
type response struct {
	*http.Response
	body []byte
}

func (r response) problem(t *testing.T) map[string]any {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json (status %d, body %s)", ct, r.StatusCode, r.body)
	}
	var p map[string]any
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	for _, k := range []string{"type", "title", "status", "detail"} {
		if _, ok := p[k]; !ok {
			t.Errorf("problem %s lacks %q", r.body, k)
		}
	}
	if int(p["status"].(float64)) != r.StatusCode {
		t.Errorf("problem status %v, HTTP status %d", p["status"], r.StatusCode)
	}
	return p
}

// req describes one request to the proxy.
type req struct {
	method, path, key, body string
	header                  http.Header
}

func (e *env) do(r req) response {
	e.t.Helper()
	return e.doTo(e.srv, r)
}

func (e *env) doTo(srv *httptest.Server, r req) response {
	e.t.Helper()
	resp, err := e.send(context.Background(), srv, r)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	return resp
}

func (e *env) send(ctx context.Context, srv *httptest.Server, r req) (response, error) {
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/orders"
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, srv.URL+r.path, strings.NewReader(r.body))
	if err != nil {
		return response{}, err
	}
	for k, vv := range r.header {
		hr.Header[k] = vv
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	resp, err := srv.Client().Do(hr)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp, b}, err
}

// advance lets d pass for Redis: its clock and FastForward on miniredis, a
// real wait on redis-server (whose expiry and TIME are the thing under test).
func (e *env) advance(d time.Duration) {
	if e.mr != nil {
		e.mrNow = e.mrNow.Add(d)
		e.mr.SetTime(e.mrNow)
		e.mr.FastForward(d)
		return
	}
	time.Sleep(d)
}

// eventually is testutil.Eventually under the name this package's tests call.
var eventually = testutil.Eventually

// counter returns the value of a counter series, 0 if absent.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// labelValues lists the values one label takes in a metric family.
func labelValues(t *testing.T, reg *prometheus.Registry, name, label string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out = append(out, lp.GetValue())
				}
			}
		}
	}
	return out
}

// redisKeys lists the keys the proxy wrote (tests may use KEYS; the proxy never does).
func (e *env) redisKeys() []string {
	e.t.Helper()
	keys, err := e.rdb.Keys(context.Background(), "idem:*").Result()
	if err != nil {
		e.t.Fatalf("KEYS: %v", err)
	}
	return keys
}

// gate is an upstream that holds each request until released, and tells
// the test when a request has arrived.
type gate struct {
	arrived chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{arrived: make(chan struct{}, 100), release: make(chan struct{})}
}

func (g *gate) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("request did not reach the upstream within 5s")
	}
}

func (g *gate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// handler answers after release (or after 10s, so that nothing hangs).
// first holds the first request at the gate (answered by held once it
// opens) and answers every later one with rest at once.
func (g *gate) first(held, rest http.HandlerFunc) http.HandlerFunc {
	var n atomic.Int64
	gated := g.handler(held)
	return func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			gated(w, r)
			return
		}
		rest(w, r)
	}
}

func (g *gate) handler(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.arrived <- struct{}{}
		select {
		case <-g.release:
		case <-time.After(10 * time.Second):
		}
		next(w, r)
	}
}

// dialProxy opens a raw connection to e's proxy, for requests written by
// hand.
func dialProxy(t *testing.T, e *env) net.Conn {
	t.Helper()
	return dialServer(t, e.srv)
}

// dialServer opens a raw connection to srv.
func dialServer(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoCreated answers 201 with the request's body, with its length.
func echoCreated(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(b)
}

// mustRoutes parses a ROUTES spec, failing t on an error.
func mustRoutes(t *testing.T, spec string) []proxy.Route {
	t.Helper()
	rs, err := proxy.ParseRoutes(spec)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
