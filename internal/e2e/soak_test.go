package e2e

// Chaos soak: three idemproxy processes (the real binary) on one real Redis,
// a storm of keyed requests, while the test SIGKILLs and restarts proxies and
// restarts Redis. Bounded: 30 s of storm by default, 10 s with -short,
// IDEMPROXY_SOAK=60s (any Go duration) to change it.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
)

const (
	soakLockTTL         = 2 * time.Second
	soakUpstreamTimeout = time.Second
	soakSendsPerKey     = 4  // each key is sent this many times during the storm
	soakActiveKeys      = 48 // keys in play at once: duplicates overlap in time
	soakWorkers         = 24 // client goroutines, each with its own connections
)

// soakExec is one execution of a key by the upstream.
type soakExec struct {
	inc        int // proxy incarnation that forwarded it (from the path)
	start, end time.Time
	body       string
}

// soakUpstream records every execution per key, and answers 201 with a body
// unique to the execution (random length, so byte-for-byte means something).
type soakUpstream struct {
	*testutil.Upstream
	mu    sync.Mutex
	execs map[string][]soakExec
}

func newSoakUpstream(t *testing.T) *soakUpstream {
	u := &soakUpstream{execs: map[string][]soakExec{}}
	u.Upstream = testutil.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		key := r.Header.Get("Idempotency-Key")
		_, _ = io.Copy(io.Discard, r.Body)
		// UPSTREAM_URL of incarnation n is <upstream>/p<n>.
		first, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		inc, _ := strconv.Atoi(strings.TrimPrefix(first, "p"))
		time.Sleep(time.Duration(5+mrand.IntN(26)) * time.Millisecond)
		pad := make([]byte, mrand.IntN(2048))
		_, _ = rand.Read(pad)
		u.mu.Lock()
		n := len(u.execs[key]) + 1
		body := fmt.Sprintf("key=%s exec=%d proxy=%d pad=%s\n", key, n, inc, hex.EncodeToString(pad))
		u.execs[key] = append(u.execs[key], soakExec{inc: inc, start: start, end: time.Now(), body: body})
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body)
	})
	return u
}

// soakProc is one of the three proxy slots; each start is a new incarnation
// on the same ports, logging to its own file.
type soakProc struct {
	slot     int
	listen   string
	admin    string
	inc      int
	cmd      *exec.Cmd
	done     chan struct{}
	logPath  string
	killedAt map[int]time.Time // incarnation -> SIGKILL time
}

type soakFleet struct {
	t        *testing.T
	bin      string
	dir      string
	upstream string
	redis    string
	procs    []*soakProc
	next     atomic.Int64
	mu       sync.Mutex
	logs     []string
}

func (f *soakFleet) start(p *soakProc) {
	f.t.Helper()
	p.inc = int(f.next.Add(1))
	p.logPath = filepath.Join(f.dir, fmt.Sprintf("proxy-%d.log", p.inc))
	out, err := os.Create(p.logPath)
	if err != nil {
		f.t.Fatalf("create log: %v", err)
	}
	cmd := exec.Command(f.bin)
	cmd.Env = []string{
		"UPSTREAM_URL=" + f.upstream + "/p" + strconv.Itoa(p.inc),
		// One service behind every incarnation: the path only tells them apart.
		"UPSTREAM_ID=soak",
		"REDIS_URL=" + f.redis,
		"LISTEN_ADDR=" + p.listen,
		"ADMIN_ADDR=" + p.admin,
		"LOCK_TTL=" + soakLockTTL.String(),
		"UPSTREAM_TIMEOUT=" + soakUpstreamTimeout.String(),
		"REQUEST_READ_TIMEOUT=1s",
		"SHUTDOWN_TIMEOUT=18s", // at least REQUEST_READ_TIMEOUT + UPSTREAM_TIMEOUT + 16s, or the proxy refuses to start
		"LOG_LEVEL=warn",
		// Incarnations alternate between the record formats, so every
		// restart is a step of a rolling switch: each key meets both.
		"RECORD_FORMAT=" + [2]string{"hash", "string"}[p.inc%2],
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		f.t.Fatalf("start %s: %v", f.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	f.mu.Lock()
	f.logs = append(f.logs, p.logPath)
	f.mu.Unlock()
	// Ready when /readyz answers 200 (Redis reachable), at most 15 s.
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get("http://" + p.admin + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			b, _ := os.ReadFile(p.logPath)
			f.t.Fatalf("proxy %d exited at start:\n%s", p.inc, b)
		default:
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("proxy %d not ready after 15s: %v", p.inc, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the slot's current process, by its pid, and waits for it.
func (f *soakFleet) kill(p *soakProc) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.killedAt[p.inc] = time.Now()
	p.cmd = nil
}

// soakClient is the view of one storm of requests from the clients' side.
type soakClient struct {
	mu       sync.Mutex
	first    map[string]string          // first 2xx body each key got
	bodies   map[string]map[string]bool // every distinct 2xx body of each key
	status   map[string]int
	requests int
}

func (c *soakClient) note(key string, a fleetAnswer) {
	label := "transport error"
	switch {
	case a.err != nil:
	case a.replayed:
		label = strconv.Itoa(a.status) + " replayed"
	default:
		label = strconv.Itoa(a.status)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	c.status[label]++
	if a.err == nil && a.status >= 200 && a.status < 300 {
		if _, ok := c.first[key]; !ok {
			c.first[key] = a.body
		}
		if c.bodies[key] == nil {
			c.bodies[key] = map[string]bool{}
		}
		c.bodies[key][a.body] = true
	}
}

func soakSend(hc *http.Client, proxy, key string) fleetAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy+"/v1/charges", strings.NewReader(`{"charge":"`+key+`"}`))
	if err != nil {
		return fleetAnswer{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fleetAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fleetAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(b), err: err}
}

func soakDuration(t *testing.T) time.Duration {
	d := 30 * time.Second
	if testing.Short() {
		d = 10 * time.Second
	}
	if v := os.Getenv("IDEMPROXY_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("IDEMPROXY_SOAK=%q: want a positive Go duration such as 60s", v)
		}
	}
	return d
}

// soakLogHashes returns the key_hash of every log line (all incarnations)
// whose message says the answer was not recorded: the recording failed, or
// the claim expired and was taken over first. A data race reported in a
// log (the binary is built with -race when the tests are) fails t.
func soakLogHashes(t *testing.T, paths []string) map[string]string {
	out := map[string]string{}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("open log: %v", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e struct {
				Message string `json:"message"`
				Error   string `json:"error"`
				KeyHash string `json:"key_hash"`
				Time    string `json:"time"`
			}
			if strings.Contains(sc.Text(), "WARNING: DATA RACE") {
				t.Errorf("the race detector found a data race in a proxy (its log %s)", path)
			}
			if json.Unmarshal(sc.Bytes(), &e) != nil || e.KeyHash == "" {
				continue
			}
			if strings.Contains(e.Message, "not recorded") {
				out[e.KeyHash] = e.Time + " " + e.Message + ": " + e.Error
			}
		}
		f.Close()
	}
	return out
}

// TestSoak is the chaos soak. Proxy incarnations alternate between
// RECORD_FORMAT=hash and string. Redis runs with appendonly yes and appendfsync
// always: Redis answers a write only after it is fsynced, so a record
// survives a SIGKILL of Redis and the invariant needs no "epochs": every key
// executes at most once per recorded outcome across the whole run.
//
// The only executions allowed beyond the first are those the contract
// allows, after a claim whose execution was never recorded:
//   - its proxy was SIGKILLed mid-flight (the claim holds until LOCK_TTL,
//     then a retry takes it over and executes);
//   - its recording failed, or its lock expired first, which the proxy logs
//     ("not recorded").
//
// Every re-execution is checked against these two causes, and a takeover
// must not come before the lock TTL. At the end every key is retried after
// recovery and must replay, byte for byte, the first 2xx body its clients
// got.
func TestSoak(t *testing.T) {
	t.Parallel()
	storm := soakDuration(t)
	dir := t.TempDir()

	srv := redistest.Start(t, "appendonly yes", "appendfsync always", "maxmemory-policy noeviction")
	up := newSoakUpstream(t)
	f := &soakFleet{t: t, bin: binary, dir: dir, upstream: up.URL, redis: srv.URL()}
	for i := range 3 {
		p := &soakProc{
			slot:     i,
			listen:   "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
			admin:    "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
			killedAt: map[int]time.Time{},
		}
		f.procs = append(f.procs, p)
		f.start(p)
	}
	t.Cleanup(func() {
		for _, p := range f.procs {
			f.kill(p) // only our own children, by pid
		}
	})

	// The storm: soakWorkers goroutines draw keys from a pool of active keys,
	// each key sent soakSendsPerKey times, to a random proxy.
	cl := &soakClient{first: map[string]string{}, bodies: map[string]map[string]bool{}, status: map[string]int{}}
	run := fleetNonce()[:6]
	var poolMu sync.Mutex
	var keys []string
	type active struct {
		key  string
		left int
	}
	pool := make([]active, soakActiveKeys)
	newKey := func() string {
		k := fmt.Sprintf("soak-%s-%d", run, len(keys))
		keys = append(keys, k)
		return k
	}
	for i := range pool {
		pool[i] = active{newKey(), soakSendsPerKey}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range soakWorkers {
		wg.Go(func() {
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer hc.CloseIdleConnections()
			for range 200000 {
				select {
				case <-stop:
					return
				default:
				}
				poolMu.Lock()
				i := mrand.IntN(len(pool))
				k := pool[i].key
				if pool[i].left--; pool[i].left == 0 {
					pool[i] = active{newKey(), soakSendsPerKey}
				}
				poolMu.Unlock()
				a := soakSend(hc, f.procs[mrand.IntN(len(f.procs))].listen, k)
				cl.note(k, a)
				if a.err != nil || a.status == http.StatusServiceUnavailable {
					time.Sleep(10 * time.Millisecond) // that proxy or Redis is down
				}
			}
		})
	}

	// Chaos, on the test goroutine: at regular intervals SIGKILL one proxy
	// and start it again, and every third time restart Redis instead
	// (SIGKILL, then the same port and data directory).
	stormEnd := time.Now().Add(storm)
	every := max(storm/10, 1500*time.Millisecond)
	var kills, redisRestarts int
	var proxyDown, redisDown time.Duration
	for event := 0; ; event++ {
		next := time.Now().Add(every)
		if next.After(stormEnd) {
			time.Sleep(time.Until(stormEnd))
			break
		}
		time.Sleep(time.Until(next))
		if event%3 == 2 {
			t1 := time.Now()
			srv.Restart()
			redisDown += time.Since(t1)
			redisRestarts++
			continue
		}
		p := f.procs[mrand.IntN(len(f.procs))]
		t1 := time.Now()
		f.kill(p)
		f.start(p)
		proxyDown += time.Since(t1)
		kills++
	}
	close(stop)
	wg.Wait()
	stormRequests := cl.requests

	// Recovery: every key that never got a 2xx is retried until it does
	// (a claim left by a killed proxy holds until LOCK_TTL, then is taken
	// over); then every key is sent once more and must replay.
	retry := func(k string, ok func(fleetAnswer) bool) fleetAnswer {
		hc := &http.Client{}
		defer hc.CloseIdleConnections()
		var a fleetAnswer
		for try := 0; try < 100; try++ {
			a = soakSend(hc, f.procs[try%len(f.procs)].listen, k)
			cl.note(k, a)
			if ok(a) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return a
	}
	is2xx := func(a fleetAnswer) bool { return a.err == nil && a.status >= 200 && a.status < 300 }
	parallel := func(keys []string, fn func(string)) {
		ch := make(chan string)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for k := range ch {
					fn(k)
				}
			})
		}
		for _, k := range keys {
			ch <- k
		}
		close(ch)
		wg.Wait()
	}
	var settled atomic.Int64
	reexecuted := map[string]fleetAnswer{}
	parallel(keys, func(k string) {
		cl.mu.Lock()
		_, ok := cl.first[k]
		cl.mu.Unlock()
		if !ok {
			settled.Add(1)
			if a := retry(k, is2xx); !is2xx(a) {
				t.Errorf("%s: no 2xx after recovery: status %d err %v", k, a.status, a.err)
			}
		}
	})
	finals := map[string]fleetAnswer{}
	var finalMu sync.Mutex
	notConflict := func(a fleetAnswer) bool { return a.err == nil && a.status != http.StatusConflict }
	parallel(keys, func(k string) {
		a := retry(k, notConflict)
		if a.err == nil && !a.replayed {
			// Executed again: allowed only after a logged recording failure
			// (checked below); then this execution is the record, and the
			// next retry must replay it.
			finalMu.Lock()
			reexecuted[k] = a
			finalMu.Unlock()
			a = retry(k, notConflict)
		}
		finalMu.Lock()
		finals[k] = a
		finalMu.Unlock()
	})

	// Check every key.
	notRecorded := soakLogHashes(t, f.logs)
	killedAt := map[int]time.Time{}
	for _, p := range f.procs {
		for inc, at := range p.killedAt {
			killedAt[inc] = at
		}
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	var executions, afterKill, afterRecordFailure, unexplained, mismatched, replayedOK int
	killedKeys, logged := 0, 0
	for _, k := range keys {
		ex := up.execs[k]
		executions += len(ex)
		slices.SortFunc(ex, func(a, b soakExec) int { return a.start.Compare(b.start) })
		hash := claim.NewKey([]string{""}, k).String()
		counted := false
		for i := 1; i < len(ex); i++ {
			prev, cur := ex[i-1], ex[i]
			kt, killed := killedAt[prev.inc]
			// Killed mid-flight: the process that forwarded prev died while
			// it could still have been handling it (it was alive when it sent
			// it, so only the end of the window matters; the start is a
			// sanity bound).
			midFlight := killed && !kt.Before(prev.start.Add(-time.Second)) && !kt.After(prev.end.Add(soakLockTTL))
			switch {
			case midFlight:
				afterKill++
				if !counted {
					killedKeys++
					counted = true
				}
			case notRecorded[hash] != "":
				afterRecordFailure++
			default:
				unexplained++
				t.Errorf("DUPLICATE %s: execution %d (proxy %d, %s) after execution %d (proxy %d, started %s, ended %s) "+
					"that was neither killed mid-flight (killed: %v at %s) nor logged as not recorded",
					k, i+1, cur.inc, cur.start.Format("15:04:05.000"), i, prev.inc, prev.start.Format("15:04:05.000"),
					prev.end.Format("15:04:05.000"), killed, kt.Format("15:04:05.000"))
			}
			// A takeover needs the earlier claim's lock to have expired. The
			// claim was taken a little before prev reached the upstream, so
			// allow half the TTL for scheduling delays.
			if gap := cur.start.Sub(prev.start); gap < soakLockTTL/2 {
				t.Errorf("%s: execution %d started %s after execution %d, before LOCK_TTL=%s ran out", k, i+1, gap, i, soakLockTTL)
			}
		}
		a := finals[k]
		want := cl.first[k]
		if notRecorded[hash] != "" {
			// The first answer was given but never recorded (logged): a
			// later execution is the record, and it is what replays.
			want = ex[len(ex)-1].body
			if logged++; logged <= 5 {
				t.Logf("%s: %s; executions %d, final retry executed it again: %v", k, notRecorded[hash], len(ex), reexecuted[k].status != 0)
			}
		} else if r, ok := reexecuted[k]; ok {
			t.Errorf("final retry of %s executed it again (status %d) though nothing was logged as not recorded", k, r.status)
		}
		if a.err == nil && a.status == http.StatusCreated && a.replayed && a.body == want {
			replayedOK++
		} else {
			mismatched++
			t.Errorf("final retry of %s: status %d replayed=%v err=%v, body %.60q..., want a replay of %.60q...",
				k, a.status, a.replayed, a.err, a.body, want)
		}
		if n := len(cl.bodies[k]); n > 1 && notRecorded[hash] == "" && len(ex) <= 1 {
			t.Errorf("%s: clients got %d different 2xx bodies for one execution", k, n)
		}
	}
	t.Logf("soak %s (storm) + %s recovery: %d keys, %d requests (%d in the storm), %d proxy SIGKILLs (down %s in all), %d Redis restarts (down %s in all)",
		storm, time.Since(stormEnd).Round(time.Millisecond), len(keys), cl.requests, stormRequests, kills,
		proxyDown.Round(time.Millisecond), redisRestarts, redisDown.Round(time.Millisecond))
	t.Logf("answers: %v", cl.status)
	t.Logf("executions %d for %d keys; re-executions after a proxy killed mid-flight %d (%d keys), after a logged recording failure %d "+
		"(answers logged as not recorded: %d); keys settled after the storm %d; final replays matching byte for byte %d/%d; "+
		"duplicates found %d, mismatched replays %d",
		executions, len(keys), afterKill, killedKeys, afterRecordFailure, len(notRecorded), settled.Load(), replayedOK, len(keys),
		unexplained, mismatched)
	if kills == 0 || redisRestarts == 0 {
		t.Errorf("the soak ran %d proxy kills and %d Redis restarts; it needs at least one of each (storm %s)", kills, redisRestarts, storm)
	}
}
