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

// The open-loop phase: the unique workload sent at fixed rates, whatever the
// answers, so that the latency a proxy adds shows at a load it can carry,
// not only at saturation as in the closed-loop (wrk) rounds. Each rate is a
// fraction (-open-rates) of the bare proxy's median req/s in its unique wrk
// rounds at the same delay, measured first in this run.
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
		logf("open %s: measuring the bare proxy's unique req/s first", delayString(delay))
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
		logf("open %s: %d req/s (%.0f %% of the bare proxy's %.0f)", delayString(delay), res.rate, 100*frac, capacity)
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
			logf("open %s %d/s %d/%d %s: %.0f answered/s, p50 %.2fms, p99 %.2fms, others %.0f%%",
				delayString(res.delay), res.rate, r+1, cfg.openRounds, kind, s.throughput, s.p50, s.p99, s.otherPct)
			if cfg.verbose {
				logf("  sent %.0f/s, success %.4f, p90 %.2fms, max %.2fms, cpu %.1fµs/req, redis %.1fµs/req, busy: proxy's cpu %s; generator %.0f%%, steal %.1f%%",
					s.rate, s.success, s.p90, s.max, s.cpuUs, s.redisUs, pct(s.proxyCPUBusyPct), s.genPct, s.steal)
			}
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

// The open-loop targets: idemproxy's first-request latency at most this
// much above the bare proxy's, at the same fixed rate.
const (
	openP50Slack = 0.2 // ms
	openP99Slack = 0.5 // ms
)

// ms prints a latency difference in ms with fewer decimals as it grows.
func ms(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%+.0f", v)
	case a >= 10:
		return fmt.Sprintf("%+.1f", v)
	}
	return fmt.Sprintf("%+.2f", v)
}

func p50Of(s openSample) float64 { return s.p50 }
func p99Of(s openSample) float64 { return s.p99 }

// added is idemproxy's median p50 and p99 less the bare proxy's, in ms.
func (o openResult) added() (d50, d99 float64) {
	return median(o.idem, p50Of) - median(o.bare, p50Of), median(o.idem, p99Of) - median(o.bare, p99Of)
}

// openReport is the open-loop section of the report: one row per delay and
// rate.
func openReport(opens []openResult, cfg *config) []string {
	if len(opens) == 0 {
		return nil
	}
	var sb strings.Builder
	para(&sb, fmt.Sprintf("Open loop: the unique workload sent at a fixed rate whatever the answers (vegeta), "+
		"a share of the bare proxy's unique req/s; %v warm-up, %v measured, %s, the targets alternating. "+
		"Latency runs from each request's scheduled send; added is idemproxy's less the bare proxy's.",
		cfg.openWarmup, cfg.openDuration, medians(cfg.openRounds)))
	sb.WriteString("\n")
	tw := newTable(&sb)
	fmt.Fprintln(tw, "delay\trate/s (of bare)\tanswered/s\tbare p50/p99 ms\tadded p50/p99 ms")
	for _, o := range opens {
		d50, d99 := o.added()
		fmt.Fprintf(tw, "%s\t%d (%.0f%%)\t%.0f\t%.2f/%.2f\t%s/%s\n", delayString(o.delay), o.rate, 100*o.frac,
			median(o.idem, func(s openSample) float64 { return s.throughput }),
			median(o.bare, p50Of), median(o.bare, p99Of), ms(d50), ms(d99))
	}
	tw.Flush()
	return strings.Split(strings.TrimRight(sb.String(), "\n"), "\n")
}

// openVerdicts judges the latency targets at every delay and rate.
func openVerdicts(opens []openResult) []verdict {
	var out []verdict
	for _, o := range opens {
		if len(o.bare) == 0 || len(o.idem) == 0 {
			continue
		}
		d50, d99 := o.added()
		at := fmt.Sprintf("open %.0f%%, delay %s", 100*o.frac, delayString(o.delay))
		j50, j99 := judge(d50, openP50Slack, true, "%.2f ms"), judge(d99, openP99Slack, true, "%.2f ms")
		if _, invalid := openChecks(o); invalid > 0 {
			j50, j99 = "not valid (notes)", "not valid (notes)"
		}
		out = append(out,
			verdict{fmt.Sprintf("%s: p50 ≤ bare + %.1f ms", at, openP50Slack), ms(d50) + " ms", j50},
			verdict{fmt.Sprintf("%s: p99 ≤ bare + %.1f ms", at, openP99Slack), ms(d99) + " ms", j99})
	}
	return out
}

// openNotes are openChecks' notes of every delay and rate.
func openNotes(opens []openResult) []string {
	var out []string
	for _, o := range opens {
		n, _ := openChecks(o)
		out = append(out, n...)
	}
	return out
}

// openChecks flags rounds whose figures are not latency at the rate: the
// generator fell behind (the load was lighter than asked), or a proxy did not
// keep up (its latency is then mostly queueing). invalid counts the rounds
// that make the comparison meaningless: the generator's, and the bare
// proxy's, since "added latency" needs a bare proxy that held the rate; an
// idemproxy that cannot hold it is a result, not a fault of the measurement.
func openChecks(o openResult) (notes []string, invalid int) {
	check := func(name string, ss []openSample) {
		for i, s := range ss {
			at := fmt.Sprintf("open %d/s, delay %s, %s round %d: ", o.rate, delayString(o.delay), name, i+1)
			switch {
			case s.rate < 0.95*float64(o.rate):
				invalid++
				notes = append(notes, fmt.Sprintf("%sthe generator sent only %.0f/s (its own cpu %.0f %%, other processes %.0f %% of a core).",
					at, s.rate, s.genPct, s.otherPct))
			case s.throughput < 0.95*float64(o.rate) || s.success < 0.999:
				if name == "bare" {
					invalid++
				}
				errs := ""
				if len(s.errors) > 0 {
					errs = " Errors: " + strings.Join(s.errors, "; ") + "."
				}
				notes = append(notes, fmt.Sprintf("%sanswered %.0f/s, success %.4f: the proxy did not keep up, so its latency is mostly queueing.%s",
					at, s.throughput, s.success, errs))
			}
		}
	}
	check("bare", o.bare)
	check("idem", o.idem)
	return notes, invalid
}

func delayString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}
