package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The info phase (issue 14): the bench runs idemproxy at LOG_LEVEL=warn, so
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
// and req/s at info against warn (issue 14 target: info at most +10 % CPU).
func infoReport(infos []infoResult, cfg *config) []string {
	if len(infos) == 0 {
		return nil
	}
	out := []string{
		fmt.Sprintf("LOG_LEVEL=info against warn (issue 14): the unique workload through idemproxy, wrk (%d connection(s), %v after %v warm-up),", cfg.conns, cfg.duration, cfg.warmup),
		fmt.Sprintf("rounds alternated warn,info / info,warn, medians of %d; at info idemproxy writes a JSON access-log line per request to stdout, which goes to a file.", cfg.rounds),
		"",
	}
	var sb strings.Builder
	tw := newTable(&sb)
	fmt.Fprintln(tw, "delay\tLOG_LEVEL\treq/s\tp50\tp99\tcpu µs/req\tredis µs/req\tlog bytes/req\terrors")
	var below []string
	cpu := func(s sample) float64 { return s.cpuUs }
	rps := func(s sample) float64 { return s.rps }
	for _, in := range infos {
		delay := delayString(in.delay)
		row := func(name string, ss []sample) {
			var errs int64
			for _, s := range ss {
				errs += s.errs
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2fms\t%.2fms\t%.1f\t%.1f\t%.0f\t%d\n", delay, name,
				median(ss, rps),
				median(ss, func(s sample) float64 { return s.p50ms }),
				median(ss, func(s sample) float64 { return s.p99ms }),
				median(ss, cpu),
				median(ss, func(s sample) float64 { return s.redisUs }),
				median(ss, func(s sample) float64 { return s.logBytes }),
				errs)
		}
		row("warn", in.warn)
		row("info", in.info)
		w, i := median(in.warn, cpu), median(in.info, cpu)
		change := func(a, b float64) string {
			if b == 0 {
				return "?"
			}
			return fmt.Sprintf("%+.1f %%", 100*(a/b-1))
		}
		var pairs, other []string
		for k := 0; k < len(in.warn) && k < len(in.info); k++ {
			pairs = append(pairs, fmt.Sprintf("%s/%.2f×", change(in.info[k].cpuUs, in.warn[k].cpuUs), in.info[k].rps/in.warn[k].rps))
			other = append(other, fmt.Sprintf("%.0f/%.0f%%", in.warn[k].otherPct, in.info[k].otherPct))
		}
		rr := 0.0
		if m := median(in.warn, rps); m > 0 {
			rr = median(in.info, rps) / m
		}
		below = append(below, fmt.Sprintf("info   delay %-4s info vs warn: proxy cpu µs/req %.1f vs %.1f = %s (issue 14 target ≤ +10 %%: %s); req/s %.2f× "+
			"(per round pair cpu/req/s %s; other processes, warn/info: %s of a core)",
			delay, i, w, change(i, w), metMark(w > 0 && i/w-1 <= 0.10), rr, strings.Join(pairs, " "), strings.Join(other, " ")))
	}
	tw.Flush()
	out = append(out, strings.Split(strings.TrimRight(sb.String(), "\n"), "\n")...)
	out = append(out, "")
	return append(out, below...)
}
