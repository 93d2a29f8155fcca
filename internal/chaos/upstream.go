package chaos

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// UpstreamProfile shapes the upstream's answers.
type UpstreamProfile struct {
	// Latency before the status line, uniform in [min, max].
	Latency [2]time.Duration
	// TwoPart is the share of answers whose status and headers are sent
	// (and flushed) at once, and the body BodyDelay later, as a streaming
	// API does.
	TwoPart   float64
	BodyDelay [2]time.Duration
	// Fail5xx is the share answered 503 (released by the proxy, retried by
	// clients); Status4xx the share answered 402 (recorded like a 2xx).
	Fail5xx   float64
	Status4xx float64
}

// Upstream is the protected API: an in-process HTTP server with one
// listener per proxy slot (so it knows which proxy each call came
// through) that keeps a ledger of every execution.
type Upstream struct {
	start   time.Time
	profile UpstreamProfile
	srv     *http.Server
	lns     []net.Listener
	slotOf  map[string]int // listener address -> slot

	mu    sync.Mutex
	rng   *rand.Rand
	execs []Execution
}

// StartUpstream listens on n loopback ports, one per proxy slot.
func StartUpstream(start time.Time, n int, profile UpstreamProfile, seed uint64) (*Upstream, error) {
	u := &Upstream{start: start, profile: profile, slotOf: map[string]int{}, rng: rand.New(rand.NewPCG(seed, 0x75707374))}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			u.Close()
			return nil, err
		}
		u.lns = append(u.lns, ln)
		u.slotOf[ln.Addr().String()] = i
	}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	for _, ln := range u.lns {
		go func() { _ = u.srv.Serve(ln) }()
	}
	return u, nil
}

// Addr is the address of slot's listener.
func (u *Upstream) Addr(slot int) string { return u.lns[slot].Addr().String() }

// Close stops the server and every connection.
func (u *Upstream) Close() {
	if u.srv != nil {
		_ = u.srv.Close()
	}
	for _, ln := range u.lns {
		_ = ln.Close()
	}
}

// Ledger returns a copy of the executions so far.
func (u *Upstream) Ledger() []Execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Execution(nil), u.execs...)
}

func (u *Upstream) uniform(r [2]time.Duration) time.Duration {
	if r[1] <= r[0] {
		return r[0]
	}
	return r[0] + time.Duration(u.rng.Int64N(int64(r[1]-r[0])))
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got, _ := io.ReadAll(r.Body) // the request, whole: it executes now
	slot := -1
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if s, ok := u.slotOf[a.String()]; ok {
			slot = s
		}
	}
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	idx := len(u.execs)
	id := "x" + itoa6(idx+1)
	status := 201
	switch p := u.rng.Float64(); {
	case p < u.profile.Fail5xx:
		status = 503
	case p < u.profile.Fail5xx+u.profile.Status4xx:
		status = 402
	}
	latency := u.uniform(u.profile.Latency)
	twoPart := u.rng.Float64() < u.profile.TwoPart
	bodyDelay := u.uniform(u.profile.BodyDelay)
	pad := strings.Repeat("z", u.rng.IntN(400))
	b, _ := json.Marshal(struct {
		Key    string `json:"key"`
		Exec   string `json:"exec"`
		Status int    `json:"status"`
		Pad    string `json:"pad"`
	}{key, id, status, pad})
	body := string(b) + "\n"
	headers := map[string]string{"Content-Type": "application/json", "X-Exec": id, "Set-Cookie": "exec=" + id}
	u.execs = append(u.execs, Execution{ID: id, Key: key, Auth: r.Header.Get("Authorization"), Request: string(got), Proxy: slot,
		Start: time.Since(u.start), Status: status, Body: body, Headers: headers})
	u.mu.Unlock()

	time.Sleep(latency)
	for k, v := range headers {
		w.Header().Set(k, v)
	}
	if status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	if twoPart {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		time.Sleep(bodyDelay)
	}
	_, _ = io.WriteString(w, body)
	u.mu.Lock()
	u.execs[idx].End = time.Since(u.start)
	u.mu.Unlock()
}

func itoa6(n int) string {
	s := []byte("000000")
	for i := len(s) - 1; i >= 0 && n > 0; i-- {
		s[i] = byte('0' + n%10)
		n /= 10
	}
	return string(s)
}
