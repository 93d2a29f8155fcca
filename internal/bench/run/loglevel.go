package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// The info phase: the bench runs idemproxy at LOG_LEVEL=warn, so
// its figures leave out the access log that the default level, info, writes:
// one JSON line per request on stdout. This phase runs the unique workload
// through idemproxy at warn and at info, alternated round by round (the bare
// proxy has no such setting), and compares the proxy CPU per request. The
// log goes to a file, as all output of the processes under test does.

// infoResult is the info phase at one delay.
type infoResult struct {
	delay      time.Duration
	warn, info []sample
}

func (b *bench) infoPhase(ctx context.Context, up *upstream, delay time.Duration) error {
	res := infoResult{delay: delay}
	defer func() {
		if len(res.warn) > 0 && len(res.info) > 0 {
			b.infos = append(b.infos, res)
		}
	}()
	for r := 0; r < b.cfg.rounds; r++ {
		order := []string{"warn", "info"}
		if r%2 == 1 {
			order = []string{"info", "warn"}
		}
		for _, kind := range order {
			s, err := b.round(ctx, up, "unique", kind, r, delay)
			if err != nil {
				return fmt.Errorf("info delay=%v round %d LOG_LEVEL=%s: %w", delay, r+1, kind, err)
			}
			b.logSample(delay, "info", r, kind, s)
			if kind == "warn" {
				res.warn = append(res.warn, s)
			} else {
				res.info = append(res.info, s)
			}
		}
	}
	return nil
}

// infoReport is the LOG_LEVEL section of the report: proxy CPU per request
// at info against warn.
func infoReport(infos []infoResult) []string {
	if len(infos) == 0 {
		return nil
	}
	var sb strings.Builder
	para(&sb, "LOG_LEVEL=info against warn: the unique workload through idemproxy at each level, "+
		"alternating round by round; at info idemproxy writes a JSON access-log line per request, to a file.")
	sb.WriteString("\n")
	tw := newTable(&sb)
	fmt.Fprintln(tw, "delay\twarn µs/req\tinfo µs/req\tchange\tround pairs: mean (95 % interval)")
	for _, in := range infos {
		w, i := median(in.warn, cpu), median(in.info, cpu)
		pairs := "too few for an interval"
		if mean, half, n, ok := in.pairs(); ok {
			pairs = fmt.Sprintf("%+.1f %% (%+.1f to %+.1f %%), %d pairs", mean, mean-half, mean+half, n)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%+.1f %%\t%s\n", delayString(in.delay), w, i, 100*(i/w-1), pairs)
	}
	tw.Flush()
	return strings.Split(strings.TrimRight(sb.String(), "\n"), "\n")
}

// infoLimit is the target: LOG_LEVEL=info may cost at most 10 % more proxy
// CPU per request than warn.
const infoLimit = 10.0

// pairs is the mean of the round pairs' changes of proxy CPU per request,
// info over warn in %, the half-width of its 95 % interval and the number of
// pairs; ok is false for fewer than two pairs.
func (in infoResult) pairs() (mean, half float64, n int, ok bool) {
	var d []float64
	for k := 0; k < len(in.warn) && k < len(in.info); k++ {
		if in.warn[k].cpuUs > 0 {
			d = append(d, 100*(in.info[k].cpuUs/in.warn[k].cpuUs-1))
		}
	}
	mean, half, ok = meanInterval(d)
	return mean, half, len(d), ok
}

// infoVerdicts judges the target on the round pairs, not on the medians:
// on a shared machine one pair's change scatters by ±10 % or more, so a few
// rounds' medians can land on either side of the limit by chance. Each pair
// ran back to back, so its change cancels most of the machine's drift;
// their mean, with a 95 % Student t interval, says whether the cost is
// below the limit (the interval's top under it), above it (its bottom over
// it), or not resolved by this many rounds.
func infoVerdicts(infos []infoResult) []verdict {
	var out []verdict
	for _, in := range infos {
		v := verdict{what: fmt.Sprintf("info log, delay %s: CPU ≤ +10 %% of warn", delayString(in.delay)),
			measured: "?", outcome: "not shown (more -rounds)"}
		if mean, half, _, ok := in.pairs(); ok {
			v.measured = fmt.Sprintf("%+.1f %%", mean)
			switch {
			case mean+half <= infoLimit:
				v.outcome = "met"
			case mean-half > infoLimit:
				v.outcome = fmt.Sprintf("missed by %.1f %%", mean-infoLimit)
			}
		}
		out = append(out, v)
	}
	return out
}

// meanInterval is the mean of v and the half-width of its 95 % Student t
// interval; ok is false for fewer than two values.
func meanInterval(v []float64) (mean, half float64, ok bool) {
	n := len(v)
	if n < 2 {
		return 0, 0, false
	}
	for _, x := range v {
		mean += x
	}
	mean /= float64(n)
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return mean, t975(n-1) * sd / math.Sqrt(float64(n)), true
}

// t975 is Student's t distribution's 97.5th percentile for df degrees of
// freedom (two-sided 95 %); above 30 the table's last value, which errs
// on the wide side (1.96 in the limit).
func t975(df int) float64 {
	table := [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df > len(table) {
		return table[len(table)-1]
	}
	return table[df-1]
}
