package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// The open-loop phase (issue 14): the unique workload sent at a fixed rate,
// whatever the answers, so that the latency a proxy adds shows at a load it
// can carry, not only at saturation as in the closed-loop (wrk) rounds. The
// rate is -open-rate of the bare proxy's median req/s in its unique wrk rounds
// at the same delay, measured first in this run.
//
// The generator is a separate binary (internal/bench/openloop, the vegeta
// library) that the driver runs like wrk: under taskset on the load
// generator's cpu, a fresh process per round, its own CPU time reported, its
// GOMAXPROCS sized by its affinity. The driver only waits on that cpu. Inside
// the driver it would share a Go runtime sized at start (before the driver
// pins itself) and its CPU time with the driver's own bookkeeping.

// openSample is one measured open-loop round of one target.
type openSample struct {
	rate, throughput        float64 // requests sent per second, successful answers per second
	success                 float64 // share of answers 2xx/3xx
	p50, p90, p99, max      float64 // ms
	requests                int64
	failed                  int64   // requests without a 2xx/3xx answer
	cpuUs                   float64 // proxy utime+stime per request
	redisUs                 float64 // redis-server utime+stime per request
	proxyCPUBusyPct         float64 // busy share of the proxy's cpu, -1 if unknown
	genPct, otherPct, steal float64 // generator's own CPU and everything not ours, % of a core; steal %
	errors                  []string
}

// openResult is the open-loop phase at one delay and rate.
type openResult struct {
	delay      time.Duration
	frac       float64   // the rate's share of capacity (-open-rates)
	capacity   float64   // bare proxy's median req/s in its unique wrk rounds
	capRounds  []float64 // those rounds' req/s, when measured by this phase (unique not selected)
	rate       int       // requests per second sent
	bare, idem []openSample
}

// openLine is the generator's OPENLOOP line (internal/bench/openloop Result).
type openLine struct {
	Requests   int64          `json:"requests"`
	Rate       float64        `json:"rate"`
	Throughput float64        `json:"throughput"`
	Success    float64        `json:"success"`
	DurationUs int64          `json:"duration_us"`
	P50Us      int64          `json:"p50_us"`
	P90Us      int64          `json:"p90_us"`
	P99Us      int64          `json:"p99_us"`
	MaxUs      int64          `json:"max_us"`
	CPUUs      int64          `json:"cpu_us"`
	Codes      map[string]int `json:"codes"`
	Errors     []string       `json:"errors"`
}

// parseOpenLine decodes the generator's OPENLOOP line out of its output.
func parseOpenLine(out string) (openLine, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		js, ok := strings.CutPrefix(sc.Text(), "OPENLOOP ")
		if !ok {
			continue
		}
		var l openLine
		if err := json.Unmarshal([]byte(js), &l); err != nil {
			return openLine{}, fmt.Errorf("openloop: bad result line: %w", err)
		}
		if l.Requests <= 0 || l.DurationUs <= 0 || l.P50Us <= 0 || l.P99Us < l.P50Us || l.MaxUs < l.P99Us || l.Success < 0 || l.Success > 1 {
			return openLine{}, fmt.Errorf("openloop: implausible result %s", js)
		}
		return l, nil
	}
	return openLine{}, errors.New("openloop: no OPENLOOP line in output")
}

// openCapacity is the bare proxy's median req/s in the unique results of rs
// (one delay), 0 if unique did not run.
func openCapacity(rs []result) float64 {
	for _, r := range rs {
		if r.workload == "unique" && len(r.bare) > 0 {
			return median(r.bare, func(s sample) float64 { return s.rps })
		}
	}
	return 0
}

// openPhase runs the open-loop rounds at one delay, one rate of
// -open-rates after the other; rs holds this delay's closed-loop results.
func (b *bench) openPhase(ctx context.Context, up *upstream, delay time.Duration, rs []result) error {
	cfg := b.cfg
	capacity := openCapacity(rs)
	var capRounds []float64
	if capacity == 0 {
		logf("delay=%v open: measuring the bare proxy's unique req/s first (%d round(s))", delay, cfg.rounds)
		var caps []sample
		for r := 0; r < cfg.rounds; r++ {
			s, err := b.round(ctx, up, "unique", "bare", r, delay)
			if err != nil {
				return fmt.Errorf("open delay=%v capacity round %d: %w", delay, r+1, err)
			}
			b.logSample(delay, "unique", r, "bare", s)
			caps = append(caps, s)
			capRounds = append(capRounds, s.rps)
		}
		capacity = median(caps, func(s sample) float64 { return s.rps })
	}
	for _, frac := range cfg.openFracs {
		res := openResult{delay: delay, frac: frac, capacity: capacity, capRounds: capRounds}
		res.rate = max(1, int(math.Round(capacity*frac)))
		logf("delay=%v open: %d req/s (%.0f %% of the bare proxy's %.0f req/s)", delay, res.rate, 100*frac, capacity)
		err := b.openRounds(ctx, up, &res)
		if len(res.bare) > 0 || len(res.idem) > 0 {
			b.opens = append(b.opens, res)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// openRounds runs res's rounds, bare and idemproxy alternating.
func (b *bench) openRounds(ctx context.Context, up *upstream, res *openResult) error {
	cfg := b.cfg
	for r := 0; r < cfg.openRounds; r++ {
		order := []string{"bare", "idem"}
		if r%2 == 1 {
			order = []string{"idem", "bare"}
		}
		for _, kind := range order {
			s, err := b.openRound(ctx, up, kind, r, res.delay, res.rate)
			if err != nil {
				return fmt.Errorf("open delay=%v rate %d round %d %s: %w", res.delay, res.rate, r+1, kind, err)
			}
			logf("delay=%-4v open   round %d/%d %-4s %6.0f req/s sent, %6.0f answered/s, success %.4f  p50 %6.2fms  p90 %6.2fms  p99 %7.2fms  max %7.2fms  cpu %6.1fµs/req  redis %5.1fµs/req | busy: proxy's cpu %s; generator %.0f%%, other processes %.0f%% of a core, steal %.1f%%",
				res.delay, r+1, cfg.openRounds, kind, s.rate, s.throughput, s.success, s.p50, s.p90, s.p99, s.max, s.cpuUs, s.redisUs, pct(s.proxyCPUBusyPct), s.genPct, s.otherPct, s.steal)
			if kind == "bare" {
				res.bare = append(res.bare, s)
			} else {
				res.idem = append(res.idem, s)
			}
		}
	}
	return nil
}

// openRound sends the unique workload at rate to a fresh proxy of kind.
func (b *bench) openRound(ctx context.Context, up *upstream, kind string, r int, delay time.Duration, rate int) (openSample, error) {
	cfg := b.cfg
	if kind != "bare" {
		if _, err := redisDo(b.redisAddr, "FLUSHALL"); err != nil {
			return openSample{}, err
		}
	}
	t, err := b.startTarget(ctx, kind, up, "unique")
	if err != nil {
		return openSample{}, err
	}
	defer t.p.stop()
	const timeout = 10 * time.Second
	ctx, cancel := context.WithTimeout(ctx, cfg.openWarmup+cfg.openDuration+timeout+30*time.Second)
	defer cancel()
	argv := pinned(cfg.nice, cfg.cpus["wrk"], b.openBin,
		"-url", t.url+workloadPath("unique"), "-rate", strconv.Itoa(rate),
		"-duration", cfg.openDuration.String(), "-warmup", cfg.openWarmup.String(),
		"-key-prefix", roundTag(b.runID, delay, "open"+strconv.Itoa(rate), r, kind), "-body", benchBody,
		"-timeout", timeout.String())
	// The generator prints MEASURE when its warm-up is over: the window
	// starts there; it ends when the generator has its last answer.
	var s0 snap
	var snapErr error
	measuring := false
	out, stderr, err := runHelper(ctx, argv, func(line string, _ int) {
		if line == "MEASURE" && !measuring {
			measuring = true
			s0, snapErr = b.snapshot(t, up)
		}
	})
	if err != nil {
		return openSample{}, fmt.Errorf("openloop: %w\n%s%s", err, out, stderr)
	}
	if snapErr != nil {
		return openSample{}, snapErr
	}
	if !measuring {
		return openSample{}, fmt.Errorf("openloop: no MEASURE line\n%s%s", out, stderr)
	}
	s1, err := b.snapshot(t, up)
	if err != nil {
		return openSample{}, err
	}
	l, err := parseOpenLine(out)
	if err != nil {
		return openSample{}, fmt.Errorf("%w\n%s", err, stderr)
	}
	if cfg.verbose {
		fmt.Fprint(os.Stderr, out, stderr)
	}
	s := openSampleOf(l)
	perReqUs := func(ticks int64) float64 {
		return float64(ticks) * 1e6 / float64(b.clkTck) / float64(l.Requests)
	}
	s.cpuUs = perReqUs(s1.proxy - s0.proxy)
	s.redisUs = perReqUs(s1.redis - s0.redis)
	s.proxyCPUBusyPct, _ = s1.coreBusy(s0)
	s.steal, s.genPct, s.otherPct = b.noise(s0, s1, time.Duration(l.CPUUs)*time.Microsecond)
	return s, nil
}

// openSampleOf converts the generator's figures (the driver adds the CPU
// figures it measures itself).
func openSampleOf(l openLine) openSample {
	var ok int64
	for c, n := range l.Codes {
		if len(c) == 3 && (c[0] == '2' || c[0] == '3') {
			ok += int64(n)
		}
	}
	return openSample{
		rate:            l.Rate,
		throughput:      l.Throughput,
		success:         l.Success,
		p50:             float64(l.P50Us) / 1000,
		p90:             float64(l.P90Us) / 1000,
		p99:             float64(l.P99Us) / 1000,
		max:             float64(l.MaxUs) / 1000,
		requests:        l.Requests,
		failed:          l.Requests - ok,
		proxyCPUBusyPct: -1,
		errors:          l.Errors,
	}
}

// issue 14's open-loop targets: idemproxy's first-request latency at most
// this much above the bare proxy's, at the same fixed rate.
const (
	openP50Slack = 0.2 // ms
	openP99Slack = 0.5 // ms
)

// openReport is the open-loop section of the report.
func openReport(opens []openResult, cfg *config, idemName string) []string {
	if len(opens) == 0 {
		return nil
	}
	out := []string{
		fmt.Sprintf("open loop (issue 14): the unique workload (a fresh Idempotency-Key per request) sent by vegeta (internal/bench/openloop, pinned to cpu %s) at a fixed rate,", cfg.cpus["wrk"]),
		fmt.Sprintf("whatever the answers: %.0f %% of the bare proxy's median req/s in its unique wrk rounds at the same delay; %v warm-up at that rate, then %v measured;", 100*opens[0].frac, cfg.openWarmup, cfg.openDuration),
		fmt.Sprintf("medians of %d round(s) per target, rounds alternated, a fresh proxy process per round. Latency runs from each request's scheduled send.", cfg.openRounds),
		"",
	}
	var sb strings.Builder
	tw := newTable(&sb)
	fmt.Fprintln(tw, "delay\ttarget\trate\tsent/s\tanswered/s\tsuccess\tp50\tp90\tp99\tmax\tcpu µs/req\tredis µs/req\tproxy's core busy\tfailed")
	var below []string
	for _, o := range opens {
		delay := delayString(o.delay)
		row := func(name string, ss []openSample) {
			var failed int64
			for _, s := range ss {
				failed += s.failed
			}
			med := func(f func(openSample) float64) float64 { return median(ss, f) }
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.4f\t%.2fms\t%.2fms\t%.2fms\t%.2fms\t%.1f\t%.1f\t%s\t%d\n", delay, name, o.rate,
				med(func(s openSample) float64 { return s.rate }),
				med(func(s openSample) float64 { return s.throughput }),
				med(func(s openSample) float64 { return s.success }),
				med(func(s openSample) float64 { return s.p50 }),
				med(func(s openSample) float64 { return s.p90 }),
				med(func(s openSample) float64 { return s.p99 }),
				med(func(s openSample) float64 { return s.max }),
				med(func(s openSample) float64 { return s.cpuUs }),
				med(func(s openSample) float64 { return s.redisUs }),
				pct(med(func(s openSample) float64 { return s.proxyCPUBusyPct })),
				failed)
		}
		row("bare", o.bare)
		row(idemName, o.idem)
		p50 := func(s openSample) float64 { return s.p50 }
		p99 := func(s openSample) float64 { return s.p99 }
		d50 := median(o.idem, p50) - median(o.bare, p50)
		d99 := median(o.idem, p99) - median(o.bare, p99)
		fmt.Fprintf(tw, "%s\t%s−bare\t\t\t\t\t%+.2fms\t%+.2fms\t%+.2fms\t%+.2fms\t\t\t\t\n", delay, idemName, d50,
			median(o.idem, func(s openSample) float64 { return s.p90 })-median(o.bare, func(s openSample) float64 { return s.p90 }),
			d99, median(o.idem, func(s openSample) float64 { return s.max })-median(o.bare, func(s openSample) float64 { return s.max }))
		var pairs, other []string
		var genMax float64
		for i := 0; i < len(o.bare) && i < len(o.idem); i++ {
			pairs = append(pairs, fmt.Sprintf("%+.2f/%+.2f", o.idem[i].p50-o.bare[i].p50, o.idem[i].p99-o.bare[i].p99))
			other = append(other, fmt.Sprintf("%.0f/%.0f%%", o.bare[i].otherPct, o.idem[i].otherPct))
			genMax = max(genMax, o.bare[i].genPct, o.idem[i].genPct)
		}
		capacity := fmt.Sprintf("rate %d req/s = %.0f %% of bare's %.0f req/s", o.rate, 100*o.frac, o.capacity)
		if len(o.capRounds) > 0 {
			var rr []string
			for _, v := range o.capRounds {
				rr = append(rr, fmt.Sprintf("%.0f", v))
			}
			capacity += " (bare-only unique wrk rounds of this phase: " + strings.Join(rr, ", ") + ")"
		}
		notes, invalid := openChecks(o, idemName)
		verdict := ""
		if invalid > 0 {
			verdict = fmt.Sprintf(" — NOT VALID: in %d of %d rounds the generator or the bare proxy did not hold the rate (notes below)", invalid, len(o.bare)+len(o.idem))
		}
		below = append(below, fmt.Sprintf("open   delay %-4s %s: %s−bare p50 %+.2f ms, p99 %+.2f ms; issue 14 targets: p50 ≤ bare + %.1f ms %s, p99 ≤ bare + %.1f ms %s%s "+
			"(per round pair p50/p99 ms %s; other processes, bare/idem: %s of a core; generator ≤%.0f%% of its core)",
			delay, capacity, idemName, d50, d99, openP50Slack, metMark(d50 <= openP50Slack), openP99Slack, metMark(d99 <= openP99Slack), verdict,
			strings.Join(pairs, " "), strings.Join(other, " "), genMax))
		below = append(below, notes...)
	}
	tw.Flush()
	out = append(out, strings.Split(strings.TrimRight(sb.String(), "\n"), "\n")...)
	out = append(out, "")
	return append(out, below...)
}

// openChecks flags rounds whose figures are not latency at the rate: the
// generator fell behind (the load was lighter than asked), or a proxy did not
// keep up (its latency is then mostly queueing). invalid counts the rounds
// that make the comparison meaningless: the generator's, and the bare
// proxy's, since "added latency" needs a bare proxy that held the rate; an
// idemproxy that cannot hold it is a result, not a fault of the measurement.
func openChecks(o openResult, idemName string) (notes []string, invalid int) {
	check := func(name string, ss []openSample) {
		for i, s := range ss {
			switch {
			case s.rate < 0.95*float64(o.rate):
				invalid++
				notes = append(notes, fmt.Sprintf("  NOTE: delay %s %s round %d: the generator sent only %.0f req/s of the %d asked (its own cpu %.0f %%, other processes %.0f %% of a core): a lighter load than asked",
					delayString(o.delay), name, i+1, s.rate, o.rate, s.genPct, s.otherPct))
			case s.throughput < 0.95*float64(o.rate) || s.success < 0.999:
				if name == "bare" {
					invalid++
				}
				errs := ""
				if len(s.errors) > 0 {
					errs = " (errors: " + strings.Join(s.errors, "; ") + ")"
				}
				notes = append(notes, fmt.Sprintf("  NOTE: delay %s %s round %d: answered %.0f/s of %d/s sent, success %.4f, other processes %.0f %% of a core: the proxy did not keep up at this rate, so its latency is mostly queueing%s",
					delayString(o.delay), name, i+1, s.throughput, o.rate, s.success, s.otherPct, errs))
			}
		}
	}
	check("bare", o.bare)
	check(idemName, o.idem)
	return notes, invalid
}

func metMark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func delayString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}
