package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Workload is the clients' side of a run.
type Workload struct {
	Clients int           // concurrent clients, each one logical request after another
	Twins   float64       // share of logical requests sent by two senders at once (a double click)
	Timeout time.Duration // per attempt (the SDK's timeout)
	// Think is the pause between a client's logical requests, uniform in
	// [0, Think].
	Think time.Duration
	// MaxAttempts bounds each sender's retries.
	MaxAttempts int
}

// recorder collects what the clients did.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	keys  []KeyInfo
	snd   []Sender
	ops   []Op
}

func (r *recorder) since() time.Duration { return time.Since(r.start) }

func (r *recorder) begin(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
	return len(r.ops) - 1
}

func (r *recorder) end(i int, op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops[i] = op
}

func (r *recorder) newSender(key, auth string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snd = append(r.snd, Sender{ID: len(r.snd), Key: key, Auth: auth})
	return len(r.snd) - 1
}

func (r *recorder) resolve(id int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snd[id].Resolved = true
}

// runClients sends logical requests until stopNew, then lets every sender
// retry until it has a definitive answer or giveUp passes. targets returns
// the proxies' base URLs (slot order). It returns once every sender has
// ended, or at giveUp plus one attempt's timeout (a sender still running
// then is left: its op shows as unanswered).
func runClients(w Workload, seed uint64, rec *recorder, targets func() []string, stopNew, giveUp time.Time) {
	var wg sync.WaitGroup
	for c := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)+1))
			tr := &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true,
				DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: w.Timeout}
			auth := "Bearer client-" + strconv.Itoa(c%4) // four principals: four scopes
			for n := 0; time.Now().Before(stopNew); n++ {
				key := fmt.Sprintf("s%d-c%d-n%d", seed, c, n)
				if n%8 == 7 {
					// The same key string for the four clients of a group,
					// each with its own principal: four scopes, four keys.
					key = fmt.Sprintf("s%d-g%d-n%d", seed, c/4, n)
				}
				body := fmt.Sprintf(`{"amount":%d,"client":%d,"n":%d}`, rng.IntN(100000), c, n)
				rec.mu.Lock()
				rec.keys = append(rec.keys, KeyInfo{Key: key, Auth: auth, Body: body, Hash: claim.NewKey([]string{auth}, key).String()})
				rec.mu.Unlock()
				senders := 1
				if rng.Float64() < w.Twins {
					senders = 2
				}
				var sw sync.WaitGroup
				for s := range senders {
					id := rec.newSender(key, auth)
					srng := rand.New(rand.NewPCG(seed, uint64(c+1)<<32|uint64(n)<<1|uint64(s)))
					sw.Add(1)
					go func() {
						defer sw.Done()
						send(w, hc, srng, rec, targets, id, key, auth, body, giveUp)
					}()
				}
				sw.Wait()
				if w.Think > 0 {
					time.Sleep(time.Duration(rng.Int64N(int64(w.Think))))
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(giveUp) + w.Timeout + 5*time.Second):
	}
}

// send is one sender's retry loop, as an SDK's: the same key and body
// resent after a timeout, a reset, a 409 (after Retry-After), a 5xx, with
// jittered exponential backoff.
func send(w Workload, hc *http.Client, rng *rand.Rand, rec *recorder, targets func() []string, id int, key, auth, body string, giveUp time.Time) {
	backoff := 50 * time.Millisecond
	for attempt := 1; attempt <= w.MaxAttempts && time.Now().Before(giveUp); attempt++ {
		urls := targets()
		slot := rng.IntN(len(urls)) // a load balancer's choice, per attempt
		op := Op{Key: key, Auth: auth, Sender: id, Proxy: slot, Start: rec.since()}
		i := rec.begin(op)
		op = attempt1(hc, urls[slot], op, key, auth, body)
		op.End = rec.since()
		rec.end(i, op)
		if op.Definitive() {
			rec.resolve(id)
			return
		}
		wait := time.Duration(float64(backoff) * (0.5 + rng.Float64()))
		if ra, err := strconv.Atoi(op.retryAfter); err == nil && ra > 0 {
			wait = time.Duration(ra)*time.Second + time.Duration(rng.Int64N(int64(200*time.Millisecond)))
		}
		backoff = min(2*backoff, time.Second)
		if time.Until(giveUp) < wait {
			wait = max(0, time.Until(giveUp))
		}
		time.Sleep(wait)
	}
}

// attempt1 makes one HTTP attempt and fills op's outcome.
func attempt1(hc *http.Client, base string, op Op, key, auth, body string) Op {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		op.Result, op.Err = "transport", err.Error()
		return op
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		op.Result, op.Err = classifyErr(err), err.Error()
		return op
	}
	defer res.Body.Close()
	op.Status = res.StatusCode
	op.Replayed = res.Header.Get("Idempotent-Replayed") == "true"
	op.RequestID = res.Header.Get("X-Request-Id")
	op.retryAfter = res.Header.Get("Retry-After")
	b, err := io.ReadAll(res.Body)
	op.Body = string(b)
	if err != nil {
		op.Result, op.Err = classifyErr(err), err.Error()
		return op
	}
	op.Result = "answer"
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(b, &p)
		op.Problem = p.Type
		if op.Problem == "" {
			op.Problem = "problem"
		}
	}
	return op
}

func classifyErr(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport"
}
