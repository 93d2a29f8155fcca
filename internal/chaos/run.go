package chaos

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Options are the knobs of a run, the same for every row.
type Options struct {
	Seed            uint64
	Duration        time.Duration // the fault phase: new requests start only within it
	Proxies         int
	LockTTL         time.Duration
	UpstreamTimeout time.Duration
	Workload        Workload
	Bin             string // the idemproxy binary
	MutantBin       string // the broken build, for rows with Mutant
	Out             string // where to write each row's history (JSON); "" for nowhere
}

// DefaultOptions are what `make chaos` runs with, Seed and Duration aside.
func DefaultOptions() Options {
	return Options{
		Seed:            1,
		Duration:        15 * time.Second,
		Proxies:         3,
		LockTTL:         3 * time.Second,
		UpstreamTimeout: time.Second,
		Workload:        Workload{Clients: 12, Twins: 0.15, Timeout: 2 * time.Second, Think: 50 * time.Millisecond, MaxAttempts: 60},
	}
}

// DefaultUpstream answers after 5-150 ms; a third of the answers send the
// status and headers first and the body 50-400 ms later; 3% are 503
// (released, retried), 3% 402.
var DefaultUpstream = UpstreamProfile{
	Latency: [2]time.Duration{5 * time.Millisecond, 150 * time.Millisecond}, TwoPart: 0.33,
	BodyDelay: [2]time.Duration{50 * time.Millisecond, 400 * time.Millisecond}, Fail5xx: 0.03, Status4xx: 0.03,
}

// PauseUpstream is the upstream of the SIGSTOP rows: most answers send
// their status and headers at once and the body 200-700 ms later, so that
// a proxy paused mid-call has read the headers, and completes (or is
// fenced off) after it is continued, instead of only timing out.
var PauseUpstream = UpstreamProfile{
	Latency: [2]time.Duration{5 * time.Millisecond, 50 * time.Millisecond}, TwoPart: 0.8,
	BodyDelay: [2]time.Duration{200 * time.Millisecond, 700 * time.Millisecond}, Fail5xx: 0.03, Status4xx: 0.03,
}

// Row is one row of the matrix: a fault under a configuration.
type Row struct {
	Fault     string // see inject
	Topology  string // standalone, sentinel, cluster
	OnUnknown string // expire, hold
	Wait      int    // REDIS_WAIT_REPLICAS
	AOF       bool   // appendonly yes, appendfsync always (standalone)
	Mutant    bool   // run the broken build (completion fence removed)
	// Expect: "clean" (no silent duplicate, wrong answer or unanswered
	// request; under hold no second execution at all), "async" (silent
	// duplicates are the documented loss of asynchronous replication), or
	// "mutant" (the checker must find silent duplicates).
	Expect   string
	Upstream *UpstreamProfile // nil: DefaultUpstream
	// Stretch multiplies Options.Duration for this row (0 or 1: as is).
	Stretch int
}

// Name identifies the row (ROWS= takes these).
func (r Row) Name() string {
	n := r.Fault + "/" + r.OnUnknown
	if r.Wait > 0 {
		n += "/wait" + strconv.Itoa(r.Wait)
	}
	if r.Mutant {
		n = "MUTANT:" + n
	}
	return n
}

// Persistence says what Redis keeps across a restart in this row.
func (r Row) Persistence() string {
	switch {
	case r.AOF:
		return "AOF always"
	case r.Topology == "standalone":
		return "none (not restarted)"
	default:
		return "none (replicas)"
	}
}

// RowResult is a row's report and verdict.
type RowResult struct {
	Row     Row
	Seed    uint64
	Report  Report
	Verdict string // "ok", "documented", or "FAIL: …"
	Elapsed time.Duration
}

// rowSeed derives a row's seed from the run's, so that each row's schedule
// depends only on SEED and its name.
func rowSeed(seed uint64, name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return seed ^ h.Sum64()
}

// run is the state of one row while it runs.
type run struct {
	t      testing.TB
	row    Row
	opts   Options
	rng    *rand.Rand
	start  time.Time
	redis  *redistest.Server
	sent   *redistest.Sentinel
	clus   *redistest.Cluster
	nt     *Net
	fleet  *Fleet
	faults []Fault
}

// RunRow runs one row and checks it.
func RunRow(t testing.TB, row Row, opts Options) RowResult {
	t.Helper()
	began := time.Now()
	seed := rowSeed(opts.Seed, row.Name())
	if row.Stretch > 1 {
		opts.Duration *= time.Duration(row.Stretch)
	}
	x := &run{t: t, row: row, opts: opts, rng: rand.New(rand.NewPCG(seed, 0xfa17)), start: time.Now()}
	extra := []string{"maxmemory-policy noeviction"}
	if row.AOF {
		extra = append(extra, "appendonly yes", "appendfsync always")
	}
	redisAddr := ""
	switch row.Topology {
	case "standalone":
		x.redis = redistest.Start(t, extra...)
		redisAddr = x.redis.Addr()
	case "sentinel":
		x.sent = redistest.StartSentinel(t, extra...)
	case "cluster":
		x.clus = redistest.StartCluster(t, extra...)
	default:
		t.Fatalf("row %s: unknown topology %q", row.Name(), row.Topology)
	}
	profile := DefaultUpstream
	if row.Fault == "proxy-pause" {
		profile = PauseUpstream
	}
	if row.Upstream != nil {
		profile = *row.Upstream
	}
	up, err := StartUpstream(x.start, opts.Proxies, profile, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if x.nt, err = NewNet(opts.Proxies, redisAddr, up.Addr); err != nil {
		t.Fatal(err)
	}
	defer x.nt.Close()
	bin := opts.Bin
	if row.Mutant {
		bin = opts.MutantBin
	}
	x.fleet = NewFleet(x.start, bin, opts.Proxies, x.env)
	for slot := range opts.Proxies {
		if err := x.fleet.Start(slot); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { // stopped only by pid, whatever happens
		for slot := range opts.Proxies {
			x.fleet.Term(slot, 5*time.Second)
		}
	}()

	rec := &recorder{start: x.start}
	stopNew := time.Now().Add(opts.Duration)
	settle := 2*opts.LockTTL + 15*time.Second
	if row.Topology != "standalone" {
		settle += 15 * time.Second
	}
	giveUp := stopNew.Add(settle)
	clients := make(chan struct{})
	go func() {
		defer close(clients)
		runClients(opts.Workload, seed, rec, x.fleet.URLs, stopNew, giveUp)
	}()
	x.inject(stopNew)
	x.heal()
	<-clients
	for slot := range opts.Proxies {
		x.fleet.Term(slot, 15*time.Second)
	}

	h := &History{Row: row.Name(), Seed: seed, OnUnknown: row.OnUnknown, Execs: up.Ledger(), Faults: x.faults}
	rec.mu.Lock()
	h.Keys = append(h.Keys, rec.keys...)
	h.Senders = append(h.Senders, rec.snd...)
	h.Ops = append(h.Ops, rec.ops...)
	rec.mu.Unlock()
	h.Logs, h.Incs = x.fleet.Snapshot()
	x.checkKeyHashes(bin, h)
	if opts.Out != "" {
		if err := os.MkdirAll(opts.Out, 0o755); err == nil {
			b, _ := json.Marshal(h)
			name := strings.NewReplacer("/", "_", ":", "_").Replace(row.Name()) + ".json"
			_ = os.WriteFile(filepath.Join(opts.Out, name), b, 0o644)
		}
	}
	rep := Check(h)
	return RowResult{Row: row, Seed: seed, Report: rep, Verdict: Verdict(row, rep), Elapsed: time.Since(began)}
}

// Verdict judges a report against what the row expects.
func Verdict(row Row, r Report) string {
	var bad []string
	switch row.Expect {
	case "mutant":
		if r.TwiceRecorded == 0 {
			return "FAIL: the broken build's late completions were not reported as silent duplicates"
		}
		return fmt.Sprintf("ok (caught: %d silent, recorded twice)", r.TwiceRecorded)
	case "clean":
		if r.Silent > 0 {
			s := fmt.Sprintf("%d silent duplicates", r.Silent)
			if r.UnannouncedTakeover > 0 {
				s += fmt.Sprintf(" (%d of them a takeover whose forward failed)", r.UnannouncedTakeover)
			}
			bad = append(bad, s)
		}
		if row.OnUnknown == "hold" && r.HoldSecond > 0 {
			bad = append(bad, fmt.Sprintf("%d second executions under hold", r.HoldSecond))
		}
		if r.Changed > 0 {
			bad = append(bad, fmt.Sprintf("%d changed replays", r.Changed))
		}
	}
	if r.Wrong > 0 {
		bad = append(bad, fmt.Sprintf("%d wrong answers", r.Wrong))
	}
	if r.Unanswered > 0 {
		bad = append(bad, fmt.Sprintf("%d unanswered", r.Unanswered))
	}
	if len(bad) > 0 {
		return "FAIL: " + strings.Join(bad, ", ")
	}
	if row.Expect == "async" && (r.Silent > 0 || r.Changed > 0) {
		return "documented"
	}
	return "ok"
}

// env is slot's environment for the proxy.
func (x *run) env(slot int) []string {
	e := []string{
		"UPSTREAM_URL=http://" + x.nt.UpstreamAddr(slot),
		"UPSTREAM_ID=chaos-upstream", // one service behind every link
		"LOCK_TTL=" + x.opts.LockTTL.String(),
		"UPSTREAM_TIMEOUT=" + x.opts.UpstreamTimeout.String(),
		"TTL=10m",
		"ON_UNKNOWN=" + x.row.OnUnknown,
		"SCOPE_HEADERS=Authorization",
		"LOG_LEVEL=info",
		"LOG_FORMAT=json",
		"SHUTDOWN_TIMEOUT=30s",
	}
	switch x.row.Topology {
	case "standalone":
		e = append(e, "REDIS_URL=redis://"+x.nt.RedisAddr(slot)+"/0")
	case "sentinel":
		e = append(e, "REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(x.sent.Addrs(), ","), "REDIS_MASTER_NAME="+x.sent.MasterName())
	case "cluster":
		e = append(e, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(x.clus.Addrs(), ","))
	}
	if x.row.Wait > 0 {
		e = append(e, "REDIS_WAIT_REPLICAS="+strconv.Itoa(x.row.Wait), "REDIS_WAIT_TIMEOUT=500ms")
	}
	return e
}

func (x *run) since() time.Duration { return time.Since(x.start) }

func (x *run) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(x.rng.Int64N(int64(hi-lo)))
}

// sleepUntil sleeps d, or until deadline if that comes first; it reports
// whether the full d passed.
func sleepUntil(d time.Duration, deadline time.Time) bool {
	if left := time.Until(deadline); left < d {
		time.Sleep(max(0, left))
		return false
	}
	time.Sleep(d)
	return true
}

func (x *run) note(kind, target string, d time.Duration) {
	x.faults = append(x.faults, Fault{At: x.since(), Kind: kind, Target: target, For: d})
}

// inject runs the row's fault schedule on the test's goroutine until
// stopNew: every choice (when, which slot, how long, which direction) from
// the row's seeded generator.
func (x *run) inject(stopNew time.Time) {
	n := x.opts.Proxies
	lock := x.opts.LockTTL
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	window := func() time.Duration { return x.uniform(2*time.Second, 4*time.Second) }
	toxic := func(link string, kind string, toxics ...Toxic) {
		slot := x.rng.IntN(n)
		d := window()
		if err := x.nt.Add(link, slot, toxics...); err != nil {
			x.t.Fatal(err)
		}
		x.note(kind, fmt.Sprintf("%s link of proxy %d", link, slot), d)
		sleepUntil(d, stopNew)
		x.nt.Heal()
	}
	dir := func() string {
		if x.rng.IntN(2) == 0 {
			return "upstream"
		}
		return "downstream"
	}
	switch x.row.Fault {
	case "none":
		time.Sleep(time.Until(stopNew))
		return
	case "sentinel-failover":
		for _, frac := range []int{1, 2} {
			if !sleepUntil(time.Until(x.start.Add(x.opts.Duration*time.Duration(frac)/3)), stopNew) {
				break
			}
			x.note("sentinel failover", "master "+x.sent.Master().Addr(), 0)
			x.sent.Failover(30 * time.Second)
		}
		time.Sleep(time.Until(stopNew))
		return
	case "cluster-master-kill":
		sleepUntil(time.Until(x.start.Add(x.opts.Duration/3)), stopNew)
		masters := x.clus.Masters()
		m := masters[x.rng.IntN(len(masters))]
		x.note("cluster master SIGKILL", m.String(), 0)
		x.clus.KillMaster(m)
		time.Sleep(time.Until(stopNew))
		return
	}
	for {
		if !sleepUntil(x.uniform(500*time.Millisecond, 2*time.Second), stopNew) {
			return
		}
		switch x.row.Fault {
		case "proxy-kill":
			slot := x.rng.IntN(n)
			down := x.uniform(300*time.Millisecond, 1200*time.Millisecond)
			x.note("proxy SIGKILL", fmt.Sprintf("proxy %d pid %d", slot, x.fleet.Pid(slot)), down)
			x.fleet.Kill(slot)
			time.Sleep(down)
			if err := x.fleet.Start(slot); err != nil {
				x.t.Fatal(err)
			}
		case "proxy-pause":
			slot := x.rng.IntN(n)
			d := x.uniform(lock+2500*time.Millisecond, lock+4500*time.Millisecond)
			x.note("proxy SIGSTOP past LOCK_TTL", fmt.Sprintf("proxy %d pid %d", slot, x.fleet.Pid(slot)), d)
			x.fleet.Pause(slot)
			time.Sleep(d) // not cut short: the pause must outlast the lock
			x.fleet.Resume(slot)
		case "redis-restart":
			down := x.uniform(200*time.Millisecond, time.Second)
			x.note("redis SIGKILL+restart", x.redis.String(), down)
			x.redis.Kill()
			time.Sleep(down)
			x.redis.Restart()
		case "redis-latency":
			toxic("redis", "latency > LOCK_TTL", Toxic{Name: "lat", Type: "latency", Stream: dir(),
				Attributes: map[string]any{"latency": ms(lock + 500*time.Millisecond)}})
		case "redis-blackhole":
			toxic("redis", "blackhole (timeout toxic)",
				Toxic{Name: "bh-up", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}},
				Toxic{Name: "bh-down", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
		case "redis-reset":
			toxic("redis", "reset_peer", Toxic{Name: "rst", Type: "reset_peer", Stream: dir(), Attributes: map[string]any{"timeout": 0}})
		case "redis-trickle":
			toxic("redis", "slicer+bandwidth", trickle()...)
		case "upstream-latency":
			toxic("up", "latency > LOCK_TTL", Toxic{Name: "lat", Type: "latency", Stream: "downstream",
				Attributes: map[string]any{"latency": ms(lock + 500*time.Millisecond)}})
		case "upstream-blackhole":
			toxic("up", "blackhole (timeout toxic)", Toxic{Name: "bh", Type: "timeout", Stream: dir(), Attributes: map[string]any{"timeout": 0}})
		case "upstream-reset":
			toxic("up", "reset_peer", Toxic{Name: "rst", Type: "reset_peer", Stream: dir(), Attributes: map[string]any{"timeout": 0}})
		case "upstream-trickle":
			toxic("up", "slicer+bandwidth", trickle()...)
		default:
			x.t.Fatalf("unknown fault %q", x.row.Fault)
		}
	}
}

// trickle slices answers into 16-byte pieces 50 ms apart, at 1 KB/s.
func trickle() []Toxic {
	return []Toxic{
		{Name: "slice", Type: "slicer", Stream: "downstream", Attributes: map[string]any{"average_size": 16, "size_variation": 8, "delay": 50000}},
		{Name: "bw", Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 1}},
	}
}

// heal ends every fault: toxics removed, paused proxies continued, dead
// ones and Redis started again.
func (x *run) heal() {
	x.nt.Heal()
	for slot := range x.opts.Proxies {
		x.fleet.Resume(slot)
		if !x.fleet.Running(slot) {
			if err := x.fleet.Start(slot); err != nil {
				x.t.Fatal(err)
			}
		}
	}
	if x.redis != nil && !x.redis.Running() {
		x.redis.Restart()
	}
}

// checkKeyHashes compares the key_hash the checker computed (claim.NewKey)
// with what `idemproxy keys hash` prints for a few keys: the checker's
// attribution of log lines to keys rests on it.
func (x *run) checkKeyHashes(bin string, h *History) {
	for i, k := range h.Keys {
		if i > 1 && i != len(h.Keys)-1 {
			continue
		}
		out, err := exec.Command(bin, "keys", "hash", "--scope", "Authorization="+k.Auth, k.Key).Output()
		if err != nil {
			x.t.Fatalf("idemproxy keys hash: %v", err)
		}
		if got := strings.TrimSpace(string(out)); got != k.Hash {
			x.t.Fatalf("key_hash of %q: the checker computed %s, `idemproxy keys hash` prints %s", k.Key, k.Hash, got)
		}
	}
}

// FormatMatrix renders results as a Markdown table.
func FormatMatrix(results []RowResult) string {
	var b strings.Builder
	b.WriteString("| row | topology | persistence | ops | faults | keys | execs (non-5xx) | dup announced | dup silent | wrong | changed | unanswered | held | verdict |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range results {
		p := r.Report
		ann := strconv.Itoa(p.Announced)
		if p.ByMetrics > 0 {
			ann += fmt.Sprintf(" (%d by metrics)", p.ByMetrics)
		}
		sil := strconv.Itoa(p.Silent)
		if p.UnannouncedTakeover > 0 {
			sil += fmt.Sprintf(" (%d takeover whose forward failed)", p.UnannouncedTakeover)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d (%d) | %s | %s | %d | %d | %d | %d | %s |\n",
			r.Row.Name(), r.Row.Topology, r.Row.Persistence(), p.Ops, p.Faults, p.Keys, p.Execs, p.Effective,
			ann, sil, p.Wrong, p.Changed, p.Unanswered, p.Held, r.Verdict)
	}
	return b.String()
}
