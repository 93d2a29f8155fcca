package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"
)

// sample is one measured round of one target.
type sample struct {
	rps, p50ms, p99ms float64
	cpuUs             float64 // proxy process utime+stime per request
	rssMiB            float64 // VmHWM of the (fresh) proxy process
	upPerReq          float64 // upstream hits per request
	redisUs           float64 // redis-server utime+stime per request
	upstreamUs        float64 // upstream process utime+stime per request
	requests, errs    int64
	proxyCPUBusyPct   float64            // busy share of the proxy's cpu in the window, -1 if unknown
	wrkCPUBusyPct     float64            // same for wrk's cpu
	redisCmds         map[string]float64 // Redis commands per request (INFO commandstats), script-internal calls included
	redisKeyBytes     float64            // Redis memory per key the window added (used_memory over keys), 0 if none
	stealPct          float64
	wrkPct            float64 // wrk's own CPU time, % of one core over the window
	otherPct          float64 // CPU of every process but ours, % of one core (the noise)
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

// logSample prints one measured wrk round on stderr; -v adds the rest.
func (b *bench) logSample(delay time.Duration, wl string, r int, kind string, s sample) {
	logf("%s %s %d/%d %s: %.0f req/s, p99 %.2fms, cpu %.1fµs, redis %.1fµs, others %.0f%%",
		wl, delayString(delay), r+1, b.cfg.rounds, kind, s.rps, s.p99ms, s.cpuUs, s.redisUs, s.otherPct)
	if b.cfg.verbose {
		logf("  p50 %.2fms, rss %.1fMiB, upstream/req %.2f, upstream %.1fµs/req, errors %d, busy: proxy's cpu %s, wrk's cpu %s; wrk itself %.0f%%, steal %.1f%%",
			s.p50ms, s.rssMiB, s.upPerReq, s.upstreamUs, s.errs, pct(s.proxyCPUBusyPct), pct(s.wrkCPUBusyPct), s.wrkPct, s.stealPct)
	}
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
		if _, _, err := b.wrk.run(ctx, url, wl, tag+"-w", pprefix, cfg.primed, cfg.warmup); err != nil {
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
	if k := s1.red.keys - s0.red.keys; k > 0 {
		smp.redisKeyBytes = float64(s1.red.memory-s0.red.memory) / float64(k)
	}
	smp.stealPct, smp.wrkPct, smp.otherPct = b.noise(s0, s1, res.cpu)
	return smp, nil
}

// snap is what the driver reads before and after a measured window.
type snap struct {
	proxy, redis, upstream int64 // utime+stime ticks of each process
	self                   int64 // the driver's own
	hits                   int64 // upstream requests
	core, wrkCore, all     cpuTimes
	red                    redisCounters // Redis INFO counters
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
	s.hits = st.hits
	if c := cpuLine("proxy"); c != "" {
		s.core, _ = readCPUTimes(c)
	}
	if c := cpuLine("wrk"); c != "" {
		s.wrkCore, _ = readCPUTimes(c)
	}
	s.red, e[4] = readRedisCounters(b.redisAddr)
	s.all, _ = readCPUTimes("cpu")
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
