package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// sample is one measured round of one target.
type sample struct {
	rps, p50ms, p99ms float64
	cpuUs             float64 // proxy process utime+stime per request
	rssMiB            float64 // VmHWM of the (fresh) proxy process
	upPerReq          float64 // upstream hits per request
	upConns           int64   // connections the upstream accepted in the window
	redisUs           float64 // redis-server utime+stime per request
	upstreamUs        float64 // upstream process utime+stime per request
	requests, errs    int64
	proxyCPUBusyPct   float64            // busy share of the proxy's cpu in the window, -1 if unknown
	wrkCPUBusyPct     float64            // same for wrk's cpu
	redisCmds         map[string]float64 // Redis commands per request (INFO commandstats), script-internal calls included
	redisReads        float64            // Redis socket reads per request (INFO stats total_reads_processed)
	redisKeyBytes     float64            // Redis memory per key the window added (used_memory over keys), 0 if none
	stealPct          float64
	wrkPct            float64 // wrk's own CPU time, % of one core over the window
	otherPct          float64 // CPU of every process but ours, % of one core (the noise)
	logBytes          float64 // bytes the proxy wrote to its stdout/stderr log per request
}

// result holds every round of one (workload, delay).
type result struct {
	workload   string
	delay      time.Duration
	bare, idem []sample
	b          []sample // build B's rounds (-ab-bin, -ab-env), else none
}

// delayGroup runs every workload against an upstream with this delay.
func (b *bench) delayGroup(ctx context.Context, delay time.Duration) ([]result, error) {
	up, err := b.startUpstream(ctx, delay)
	if err != nil {
		return nil, err
	}
	defer up.p.stop()
	var out []result
	for _, wl := range b.cfg.workloads {
		if wl == "open" || wl == "info" {
			continue // after the closed-loop workloads, below
		}
		res := result{workload: wl, delay: delay}
		for r := 0; r < b.cfg.rounds; r++ {
			for _, kind := range roundOrder(r, b.cfg.ab) {
				s, err := b.round(ctx, up, wl, kind, r, delay)
				if err != nil {
					if len(res.bare) > 0 && len(res.idem) > 0 {
						out = append(out, res)
					}
					return out, fmt.Errorf("%s delay=%v round %d %s: %w", wl, delay, r+1, kind, err)
				}
				b.logSample(delay, wl, r, kind, s)
				switch kind {
				case "bare":
					res.bare = append(res.bare, s)
				case "b":
					res.b = append(res.b, s)
				default:
					res.idem = append(res.idem, s)
				}
			}
		}
		out = append(out, res)
	}
	if slices.Contains(b.cfg.workloads, "info") {
		if err := b.infoPhase(ctx, up, delay); err != nil {
			return out, err
		}
	}
	if slices.Contains(b.cfg.workloads, "open") {
		if err := b.openPhase(ctx, up, delay, out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// roundOrder is the order of the targets in round r: bare and idemproxy
// alternate. With the third target the six orders of the three take turns,
// so that over six rounds each goes first, second and third twice and each
// of any two goes before the other three times: a rotation alone (the first
// three) puts idemproxy before the third target in two rounds of three, and
// a drift of the machine's speed during a run would favour one of them.
func roundOrder(r int, third bool) []string {
	if !third {
		if r%2 == 1 {
			return []string{"idem", "bare"}
		}
		return []string{"bare", "idem"}
	}
	return slices.Clone(thirdTargetOrders[r%len(thirdTargetOrders)])
}

var thirdTargetOrders = [...][]string{
	{"bare", "idem", "b"},
	{"idem", "b", "bare"},
	{"b", "bare", "idem"},
	{"bare", "b", "idem"},
	{"b", "idem", "bare"},
	{"idem", "bare", "b"},
}

// logSample prints one measured wrk round on stderr.
func (b *bench) logSample(delay time.Duration, wl string, r int, kind string, s sample) {
	logf("delay=%-4v %-6s round %d/%d %-4s %8.0f req/s  p50 %6.2fms  p99 %6.2fms  cpu %6.1fµs/req  rss %5.1fMiB  upstream/req %.2f  redis %5.1fµs/req  upstream %5.1fµs/req  new upstream conns %d  errors %d | busy: proxy's cpu %s, wrk's cpu %s; wrk itself %.0f%%, other processes %.0f%% of a core, steal %.1f%%",
		delay, wl, r+1, b.cfg.rounds, kind, s.rps, s.p50ms, s.p99ms, s.cpuUs, s.rssMiB, s.upPerReq, s.redisUs, s.upstreamUs, s.upConns, s.errs, pct(s.proxyCPUBusyPct), pct(s.wrkCPUBusyPct), s.wrkPct, s.otherPct, s.stealPct)
}

func pct(v float64) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", v)
}

// round measures one target on one workload with a fresh proxy process.
func (b *bench) round(ctx context.Context, up *upstream, wl, kind string, r int, delay time.Duration) (sample, error) {
	cfg := b.cfg
	if kind != "bare" {
		if _, err := redisDo(b.redisAddr, "FLUSHALL"); err != nil {
			return sample{}, err
		}
	}
	t, err := b.startTarget(ctx, kind, up, wl)
	if err != nil {
		return sample{}, err
	}
	defer t.p.stop()
	url := t.url + workloadPath(wl)
	tag := roundTag(b.runID, delay, wl, r, kind)
	pprefix := tag + "-p"

	if err := b.prime(ctx, url, wl, pprefix); err != nil {
		return sample{}, err
	}
	if kind == "idem" && !cfg.idemBare && r == 0 {
		b.probe(ctx, url, pprefix, tag, wl)
	}
	if cfg.warmup > 0 {
		var perf *proc
		perfData := filepath.Join(cfg.workdir, fmt.Sprintf("perf-%s-%dus.data", wl, delay.Microseconds()))
		if cfg.perf && kind == "idem" && r == 0 {
			if perf, err = b.startPerf(ctx, perfData); err != nil {
				return sample{}, err
			}
		}
		_, _, err := b.wrk.run(ctx, url, wl, tag+"-w", pprefix, cfg.primed, cfg.warmup)
		if perf != nil {
			perf.stop() // SIGTERM: perf writes its data and exits
			b.profiles = append(b.profiles, b.perfReport(ctx, perfData, fmt.Sprintf("%s delay %v", wl, delay)))
		}
		if err != nil {
			return sample{}, fmt.Errorf("warm-up: %w", err)
		}
	}

	s0, err := b.snapshot(t, up)
	if err != nil {
		return sample{}, err
	}
	res, out, err := b.wrk.run(ctx, url, wl, tag+"-m", pprefix, cfg.primed, cfg.duration)
	if err != nil {
		return sample{}, err
	}
	s1, err := b.snapshot(t, up)
	if err != nil {
		return sample{}, err
	}
	mem, err := memKB(t.p.pid(), "VmHWM")
	if err != nil {
		return sample{}, err
	}
	if cfg.verbose {
		fmt.Fprint(os.Stderr, out)
	}
	if res.requests == 0 {
		return sample{}, fmt.Errorf("wrk completed no request:\n%s", out)
	}
	perReqUs := func(ticks int64) float64 {
		return float64(ticks) * 1e6 / float64(b.clkTck) / float64(res.requests)
	}
	smp := sample{
		rps:             res.rps(),
		p50ms:           float64(res.p50Us) / 1000,
		p99ms:           float64(res.p99Us) / 1000,
		cpuUs:           perReqUs(s1.proxy - s0.proxy),
		rssMiB:          float64(mem["VmHWM"]) / 1024,
		upPerReq:        float64(s1.hits-s0.hits) / float64(res.requests),
		upConns:         s1.conns - s0.conns,
		redisUs:         perReqUs(s1.redis - s0.redis),
		upstreamUs:      perReqUs(s1.upstream - s0.upstream),
		requests:        res.requests,
		errs:            res.errStatus + res.errSocket,
		proxyCPUBusyPct: -1,
		wrkCPUBusyPct:   -1,
		redisCmds:       map[string]float64{},
	}
	smp.proxyCPUBusyPct, smp.wrkCPUBusyPct = s1.coreBusy(s0)
	s1.red.calls["info"]-- // the driver's own INFO before the window
	for c, n := range s1.red.calls {
		if d := n - s0.red.calls[c]; d > 0 {
			smp.redisCmds[c] = float64(d) / float64(res.requests)
		}
	}
	smp.redisReads = float64(s1.red.reads-s0.red.reads) / float64(res.requests)
	if k := s1.red.keys - s0.red.keys; k > 0 {
		smp.redisKeyBytes = float64(s1.red.memory-s0.red.memory) / float64(k)
	}
	smp.stealPct, smp.wrkPct, smp.otherPct = b.noise(s0, s1, res.cpu)
	smp.logBytes = float64(s1.logBytes-s0.logBytes) / float64(res.requests)
	return smp, nil
}

// snap is what the driver reads before and after a measured window.
type snap struct {
	proxy, redis, upstream int64 // utime+stime ticks of each process
	self                   int64 // the driver's own
	hits, conns            int64 // upstream counters
	core, wrkCore, all     cpuTimes
	red                    redisCounters // Redis INFO counters
	logBytes               int64         // size of the proxy's stdout+stderr log
}

// snapshot reads the counters of target t, Redis, the upstream and the cpus.
func (b *bench) snapshot(t *target, up *upstream) (snap, error) {
	cpuLine := func(role string) string {
		if _, err := strconv.Atoi(b.cfg.cpus[role]); err != nil {
			return "" // a list of cpus: no single /proc/stat line
		}
		return "cpu" + b.cfg.cpus[role]
	}
	var s snap
	var e [5]error
	s.proxy, e[0] = cpuTicks(t.p.pid())
	s.redis, e[1] = cpuTicks(b.redis.pid())
	s.upstream, e[2] = cpuTicks(up.p.pid())
	s.self, _ = cpuTicks(os.Getpid())
	var st upstreamStats
	st, e[3] = b.upstreamStats(up, false)
	s.hits, s.conns = st.hits, st.conns
	if c := cpuLine("proxy"); c != "" {
		s.core, _ = readCPUTimes(c)
	}
	if c := cpuLine("wrk"); c != "" {
		s.wrkCore, _ = readCPUTimes(c)
	}
	s.red, e[4] = readRedisCounters(b.redisAddr)
	s.all, _ = readCPUTimes("cpu")
	if fi, err := os.Stat(t.p.log); err == nil {
		s.logBytes = fi.Size()
	}
	return s, errors.Join(e[:]...)
}

// coreBusy returns the busy share of the proxy's and the load generator's
// cpus between s0 and s1, in %, -1 where unknown.
func (s1 snap) coreBusy(s0 snap) (proxyPct, genPct float64) {
	proxyPct, genPct = -1, -1
	if d := s1.core.sub(s0.core); d.total > 0 {
		proxyPct = 100 * float64(d.busy) / float64(d.total)
	}
	if d := s1.wrkCore.sub(s0.wrkCore); d.total > 0 {
		genPct = 100 * float64(d.busy) / float64(d.total)
	}
	return proxyPct, genPct
}

// noise returns the machine's steal, the load generator's own CPU (gen, as
// rusage) and the CPU of every process but the benchmark's, the last two in %
// of one core, between s0 and s1.
func (b *bench) noise(s0, s1 snap, gen time.Duration) (stealPct, genPct, otherPct float64) {
	d := s1.all.sub(s0.all)
	if d.total <= 0 {
		return 0, 0, 0
	}
	stealPct = 100 * float64(d.steal) / float64(d.total)
	perCPU := float64(d.total) / float64(b.ncpu) // ticks one cpu lived through
	genTicks := gen.Seconds() * float64(b.clkTck)
	ours := float64((s1.proxy-s0.proxy)+(s1.redis-s0.redis)+(s1.upstream-s0.upstream)+(s1.self-s0.self)) + genTicks
	genPct = 100 * genTicks / perCPU
	otherPct = max(0, 100*(float64(d.busy)-ours)/perCPU)
	return stealPct, genPct, otherPct
}

// prime sends one request of workload wl per primed key, 8 at a time; each
// must succeed.
func (b *bench) prime(ctx context.Context, url, wl, pprefix string) error {
	keys := make(chan int)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keys {
				pr, err := b.postAs(ctx, url, wl, pprefix+"-"+strconv.Itoa(i))
				if err == nil && pr.status/100 != 2 {
					err = fmt.Errorf("priming key %d: status %d", i, pr.status)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var err error
loop:
	for i := 0; i < b.cfg.primed; i++ {
		select {
		case keys <- i:
		case err = <-errc:
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		}
	}
	close(keys)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// probe checks, once per workload, that idemproxy replays a primed key and
// forwards a fresh one; a failure is noted under the table, not fatal.
func (b *bench) probe(ctx context.Context, url, pprefix, tag, wl string) {
	dup, err1 := b.postAs(ctx, url, wl, pprefix+"-0")
	fresh, err2 := b.postAs(ctx, url, wl, tag+"-probe")
	switch {
	case err1 != nil || err2 != nil:
		b.notes = append(b.notes, fmt.Sprintf("%s: probe failed: %v", wl, errors.Join(err1, err2)))
	case !dup.replayed || dup.status/100 != 2:
		b.notes = append(b.notes, fmt.Sprintf("%s: a primed key was NOT replayed (status %d, Idempotent-Replayed absent): replay figures measure something else", wl, dup.status))
	case fresh.replayed || fresh.status/100 != 2:
		b.notes = append(b.notes, fmt.Sprintf("%s: a fresh key answered status %d, replayed=%v", wl, fresh.status, fresh.replayed))
	}
}

// median of one field over rounds.
func median[T any](ss []T, f func(T) float64) float64 {
	if len(ss) == 0 {
		return 0
	}
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// startPerf starts perf record on the proxy's cpu and returns once perf has
// acknowledged that its events are enabled (perf takes a while to start on a
// loaded machine; the warm-up must not begin before it samples).
func (b *bench) startPerf(ctx context.Context, data string) (*proc, error) {
	ctl, ack := data+".ctl", data+".ack"
	for _, f := range []string{ctl, ack} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", f, err)
		}
	}
	// O_RDWR: opening a fifo this way never blocks waiting for the other end.
	fc, err := os.OpenFile(ctl, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer fc.Close()
	fa, err := os.OpenFile(ack, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer fa.Close()
	p, err := b.procs.start("perf", b.cfg.cpus["wrk"], baseEnv(), data+".log", "perf", "record",
		"-F", "999", "-g", "-D", "-1", "--control", "fifo:"+ctl+","+ack, "-o", data, "-C", b.cfg.cpus["proxy"])
	if err != nil {
		return nil, err
	}
	if _, err := fc.WriteString("enable\n"); err != nil {
		p.stop()
		return nil, err
	}
	_ = fa.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(fa, buf); err != nil || string(buf) != "ack\n" {
		p.stop()
		return nil, fmt.Errorf("perf record did not acknowledge enable (%q, %v); log:\n%s", buf, err, p.logTail(10))
	}
	return p, nil
}

// perfReport summarises a perf recording of the proxy's cpu: the share of
// each process; the proxy's functions from github.com packages (its own and
// its dependencies), net/http/httputil, encoding and crypto with the share of
// the proxy's samples spent in them and their callees; the top self-time
// symbols.
func (b *bench) perfReport(ctx context.Context, data, title string) string {
	comm := filepath.Base(b.idemBin)
	if len(comm) > 15 {
		comm = comm[:15] // the kernel's comm is 15 bytes
	}
	report := func(max int, keep func(string) bool, args ...string) string {
		args = append([]string{"report", "-i", data, "--stdio", "-g", "none", "--percent-limit", "1"}, args...)
		out, err := exec.CommandContext(ctx, "perf", args...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("    perf %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") || !keep(t) {
				continue
			}
			lines = append(lines, "    "+strings.Join(strings.Fields(l), " "))
			if len(lines) == max {
				break
			}
		}
		return strings.Join(lines, "\n")
	}
	all := func(string) bool { return true }
	interesting := func(l string) bool {
		for _, p := range []string{"github.com/", "net/http/httputil", "encoding/", "crypto/", "runtime.gcBgMarkWorker "} {
			if strings.Contains(l, p) {
				return true
			}
		}
		return strings.HasSuffix(l, "runtime.gcBgMarkWorker")
	}
	return fmt.Sprintf("  %s (%s)\n  cpu %s by process:\n%s\n  %s, inclusive (%% of %s's samples in the function and its callees, self %%):\n%s\n  %s, self time:\n%s",
		title, data, b.cfg.cpus["proxy"], report(8, all, "--no-children", "--sort", "comm"),
		comm, comm, report(30, interesting, "--children", "--comms", comm, "--percentage", "relative", "--sort", "sym"),
		comm, report(12, all, "--no-children", "--comms", comm, "--percentage", "relative", "--sort", "dso,sym"))
}
