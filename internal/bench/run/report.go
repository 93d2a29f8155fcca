package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// target ratios of issue 5 (idemproxy/bare, 64 connections, upstream delay 0).
type goal struct {
	name   string
	atMost bool
	v      float64
}

var goals = map[string][]goal{
	"unique": {{"req/s", false, 0.90}, {"p99", true, 1.2}, {"cpu", true, 1.25}},
	"replay": {{"req/s", false, 4.0}, {"p99", true, 0.5}, {"cpu", true, 0.4}},
}

func (b *bench) report(w io.Writer, results []result, mem []memResult, steal cpuTimes, load string) {
	cfg := b.cfg
	idemName := "idem"
	switch {
	case cfg.idemBare:
		idemName = "idem(bare)"
	}
	if len(results) > 0 {
		fmt.Fprintf(w, "\nidemproxy benchmark: medians of %d round(s) per target, rounds alternated (bare,idem / idem,bare / …), a fresh proxy process per round;\n", cfg.rounds)
		what := fmt.Sprintf("POST /v1/orders with a %d-byte JSON body", len(benchBody))
		if !slices.ContainsFunc(cfg.workloads, func(wl string) bool { _, ok := eventWorkloads[wl]; return !ok }) {
			what = "POST with a ~1 KiB JSON body (below)"
		}
		fmt.Fprintf(w, "wrk %d connection(s), %d thread(s), %v measured after %v warm-up; %s; upstream answers 201 with ~200 bytes.\n\n",
			cfg.conns, cfg.threads, cfg.duration, cfg.warmup, what)
		if l := eventWorkloadsLine(cfg.workloads); l != "" {
			fmt.Fprintln(w, l+"\n")
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "workload\tdelay\ttarget\treq/s\tp50\tp99\tcpu µs/req\tpeak rss\tredis µs/req\tupstream µs/req\tupstream/req\terrors")
		var below, cmds []string
		for _, r := range results {
			delay := r.delay.String()
			if r.delay == 0 {
				delay = "0"
			}
			row := func(name string, ss []sample) {
				var errs int64
				for _, s := range ss {
					errs += s.errs
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.2fms\t%.2fms\t%.1f\t%.1f MiB\t%.1f\t%.1f\t%.2f\t%d\n", r.workload, delay, name,
					median(ss, func(s sample) float64 { return s.rps }),
					median(ss, func(s sample) float64 { return s.p50ms }),
					median(ss, func(s sample) float64 { return s.p99ms }),
					median(ss, func(s sample) float64 { return s.cpuUs }),
					median(ss, func(s sample) float64 { return s.rssMiB }),
					median(ss, func(s sample) float64 { return s.redisUs }),
					median(ss, func(s sample) float64 { return s.upstreamUs }),
					median(ss, func(s sample) float64 { return s.upPerReq }),
					errs)
			}
			row("bare", r.bare)
			row(idemName, r.idem)
			ratioOf := func(num, den []sample, f func(sample) float64) float64 {
				d := median(den, f)
				if d == 0 {
					return 0
				}
				return median(num, f) / d
			}
			ratio := func(f func(sample) float64) float64 { return ratioOf(r.idem, r.bare, f) }
			rs := map[string]float64{
				"req/s": ratio(func(s sample) float64 { return s.rps }),
				"p50":   ratio(func(s sample) float64 { return s.p50ms }),
				"p99":   ratio(func(s sample) float64 { return s.p99ms }),
				"cpu":   ratio(func(s sample) float64 { return s.cpuUs }),
				"rss":   ratio(func(s sample) float64 { return s.rssMiB }),
			}
			var pairs, other []string
			var wrkMax float64
			for i := 0; i < len(r.bare) && i < len(r.idem); i++ {
				pairs = append(pairs, fmt.Sprintf("%.2f", r.idem[i].rps/r.bare[i].rps))
				other = append(other, fmt.Sprintf("%.0f/%.0f%%", r.bare[i].otherPct, r.idem[i].otherPct))
				wrkMax = max(wrkMax, r.bare[i].wrkPct, r.idem[i].wrkPct)
			}
			extra := fmt.Sprintf("%-6s delay %-4s req/s ratio per round pair %s (other processes, bare/idem: %s of a core; wrk ≤%.0f%% of its core)",
				r.workload, delay, strings.Join(pairs, " "), strings.Join(other, " "), wrkMax)
			if gs, ok := goals[r.workload]; ok && r.delay == 0 {
				var parts []string
				for _, g := range gs {
					ok := rs[g.name] >= g.v
					op := "≥"
					if g.atMost {
						ok, op = rs[g.name] <= g.v, "≤"
					}
					mark := "met"
					if !ok {
						mark = "MISSED"
					}
					parts = append(parts, fmt.Sprintf("%s %s%.2f %s", g.name, op, g.v, mark))
				}
				extra += "; issue 5 targets: " + strings.Join(parts, ", ")
			}
			below = append(below, extra)
			if c := cmdsLine(r.idem); c != "" {
				cmds = append(cmds, fmt.Sprintf("%-6s delay %-4s %s%s%s", r.workload, delay, c, readsLine(r.idem), keyBytesLine(r.idem)))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s/bare\t%.2f×\t%.2f×\t%.2f×\t%.2f×\t%.2f×\t\t\t\t\n", r.workload, delay, idemName,
				rs["req/s"], rs["p50"], rs["p99"], rs["cpu"], rs["rss"])
			if len(r.b) > 0 {
				ceilName := "idem(B)"
				row(ceilName, r.b)
				ratios := func(name string, num, den []sample) {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f×\t%.2f×\t%.2f×\t%.2f×\t%.2f×\t\t\t\t\n", r.workload, delay, name,
						ratioOf(num, den, func(s sample) float64 { return s.rps }),
						ratioOf(num, den, func(s sample) float64 { return s.p50ms }),
						ratioOf(num, den, func(s sample) float64 { return s.p99ms }),
						ratioOf(num, den, func(s sample) float64 { return s.cpuUs }),
						ratioOf(num, den, func(s sample) float64 { return s.rssMiB }))
				}
				ratios(ceilName+"/bare", r.b, r.bare)
				ratios(idemName+"/"+ceilName, r.idem, r.b)
				var pairs []string
				for i := 0; i < len(r.bare) && i < len(r.idem) && i < len(r.b); i++ {
					pairs = append(pairs, fmt.Sprintf("%.2f/%.2f", r.idem[i].rps/r.bare[i].rps, r.b[i].rps/r.bare[i].rps))
				}
				below = append(below, fmt.Sprintf("%-6s delay %-4s req/s ratio to bare per round, idem/%s: %s", r.workload, delay, ceilName, strings.Join(pairs, " ")))
				if c := cmdsLine(r.b); c != "" {
					cmds = append(cmds, fmt.Sprintf("%-6s delay %-4s %s: %s%s%s", r.workload, delay, ceilName, c, readsLine(r.b), keyBytesLine(r.b)))
				}
			}
		}
		tw.Flush()
		fmt.Fprintln(w)
		for _, l := range below {
			fmt.Fprintln(w, l)
		}
		if cmp := keySourceLines(results, idemName); len(cmp) > 0 {
			fmt.Fprintln(w)
			for _, l := range cmp {
				fmt.Fprintln(w, l)
			}
		}
		if len(cmds) > 0 {
			fmt.Fprintln(w, "\nRedis commands per request through "+idemName+" (INFO commandstats, medians; calls made inside Lua scripts count too),")
			fmt.Fprintln(w, "Redis socket reads per request (INFO stats total_reads_processed; each read carries one command or a pipelined batch),")
			fmt.Fprintln(w, "and Redis memory per key the measured window added, where it added keys (INFO used_memory over db0's keys; each holds the upstream's ~200-byte answer):")
			for _, l := range cmds {
				fmt.Fprintln(w, "  "+l)
			}
		}
		fmt.Fprintln(w)
		for _, l := range []string{
			"cpu µs/req: utime+stime of the proxy process (/proc/<pid>/stat) over the measured window / requests. peak rss: VmHWM of",
			"that process (a fresh one per round, so the warm-up counts). redis, upstream µs/req: CPU of those processes / requests.",
			"upstream/req: upstream hits / requests (1 = forwarded, 0 = replayed). Ratios: idemproxy's median / bare's median.",
			"other processes: CPU used during the round by everything but the benchmark's own processes, in % of one core (the",
			"machine's noise). wrk near 100% of its core would mean the load generator, not the proxy, was the limit.",
		} {
			fmt.Fprintln(w, l)
		}
	}
	for _, sec := range [][]string{infoReport(b.infos, cfg), openReport(b.opens, cfg, idemName)} {
		if len(sec) > 0 {
			fmt.Fprintln(w)
			for _, l := range sec {
				fmt.Fprintln(w, l)
			}
		}
	}
	if len(b.profiles) > 0 {
		fmt.Fprintln(w, "\nperf profiles (perf record -g on the proxy's cpu during the warm-up of the first idemproxy round; entries over 1%; -keep keeps the data):")
		for _, p := range b.profiles {
			fmt.Fprintln(w, p)
		}
	}
	for _, n := range b.notes {
		fmt.Fprintln(w, "NOTE:", n)
	}
	fmt.Fprintln(w)
	if b.cfg.ab {
		// The saved report names the two builds it compared.
		fmt.Fprintf(w, "builds: idem %s; idem(B) %s, -ab-env %q\n", b.idemBin, b.abBin, b.cfg.abEnv)
	}
	fmt.Fprintln(w, "cores: "+b.coresLine())
	fmt.Fprintln(w, "machine: "+b.machineLine(steal, load))
	if len(mem) > 0 {
		fmt.Fprintln(w, "\nmemory checks (fresh proxy processes; figures and limits are idemproxy's, bare proxy for reference):")
		for _, m := range mem {
			fmt.Fprintln(w, "  "+m.line)
		}
	}
	fmt.Fprintf(w, "\nbench took %v\n", time.Since(b.started).Round(time.Second))
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func (b *bench) coresLine() string {
	c := b.cfg.cpus
	seen := func(role string) string {
		if a := b.affinity[role]; a != "" {
			return a
		}
		return "?"
	}
	s := fmt.Sprintf("wrk (%d thread) pinned to cpu %s; proxy under test on cpu %s, upstream on cpu %s, redis-server on cpu %s "+
		"(taskset -c; affinity read back from /proc: proxy %s, upstream %s, redis %s)",
		b.cfg.threads, c["wrk"], c["proxy"], c["upstream"], c["redis"], seen("proxy"), seen("upstream"), seen("redis"))
	if c["proxy"] == c["upstream"] && c["proxy"] == c["redis"] {
		s += "; proxy, upstream and Redis share that one core, so a replay (no upstream work) frees core time for the proxy"
	}
	s += "; the Go processes size GOMAXPROCS from their affinity (1 per pinned core); the driver waits on the wrk core"
	if b.cfg.nice != 0 {
		s += fmt.Sprintf("; all of them run at nice %d", b.cfg.nice)
	}
	s += "."
	return s
}

func (b *bench) machineLine(steal cpuTimes, load string) string {
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	model, n := "?", 0
	for _, l := range strings.Split(string(cpuinfo), "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch strings.TrimSpace(k) {
		case "processor":
			n++
		case "model name":
			model = strings.TrimSpace(v)
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	wrkV := "?"
	if out, _ := exec.Command("wrk", "-v").CombinedOutput(); len(out) > 0 {
		f := strings.Fields(firstLine(string(out)))
		if len(f) > 1 {
			wrkV = f[1]
		}
	}
	redisV := "?"
	if info, err := redisDo(b.redisAddr, "INFO", "server"); err == nil {
		redisV = redisInfoField(info, "redis_version")
	}
	st := "?"
	if steal.total > 0 {
		st = fmt.Sprintf("%.1f%%", 100*float64(steal.steal)/float64(steal.total))
	}
	return fmt.Sprintf("%s, nproc %d, %s, Linux %s, %s, wrk %s, redis %s; load average at start %s; cpu steal during the run %s",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), n, model, strings.TrimSpace(string(kernel)),
		runtime.Version(), wrkV, redisV, load, st)
}

// cmdsLine lists the median Redis commands per request over rounds, most
// frequent first, leaving out those under 0.005 per request.
func cmdsLine(ss []sample) string {
	names := map[string]bool{}
	for _, s := range ss {
		for c := range s.redisCmds {
			names[c] = true
		}
	}
	type cmd struct {
		name string
		v    float64
	}
	var list []cmd
	for c := range names {
		v := median(ss, func(s sample) float64 { return s.redisCmds[c] })
		if v >= 0.005 {
			list = append(list, cmd{c, v})
		}
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].v != list[j].v {
			return list[i].v > list[j].v
		}
		return list[i].name < list[j].name
	})
	parts := make([]string, len(list))
	for i, c := range list {
		parts[i] = fmt.Sprintf("%s %.2f", c.name, c.v)
	}
	return strings.Join(parts, ", ")
}

// readsLine is the median Redis reads per request over rounds and the
// scripts (EVALSHA, EVAL) per read they give, the pipeline depth Redis saw,
// as "; reads 0.31 (6.5 scripts per read)"; for a design without scripts
// (-ceiling commands) the commands per read; "" without reads.
func readsLine(ss []sample) string {
	reads := median(ss, func(s sample) float64 { return s.redisReads })
	if reads <= 0 {
		return ""
	}
	scripts := median(ss, func(s sample) float64 { return s.redisCmds["evalsha"] + s.redisCmds["eval"] })
	if scripts > 0 {
		return fmt.Sprintf("; reads %.2f (%.1f scripts per read)", reads, scripts/reads)
	}
	cmds := median(ss, func(s sample) float64 {
		n := 0.0
		for _, v := range s.redisCmds {
			n += v
		}
		return n
	})
	return fmt.Sprintf("; reads %.2f (%.1f commands per read)", reads, cmds/reads)
}

// keyBytesLine gives the median Redis memory per key added in the window
// ("" when no round added keys: a replay adds none).
func keyBytesLine(ss []sample) string {
	b := median(ss, func(s sample) float64 { return s.redisKeyBytes })
	if b <= 0 {
		return ""
	}
	return fmt.Sprintf("; %.0f B of Redis memory per new key", b)
}

// eventWorkloadsLine describes the requests of the event workloads selected,
// for the report's header ("" when none is).
func eventWorkloadsLine(workloads []string) string {
	var parts []string
	for _, wl := range workloads {
		ew, ok := eventWorkloads[wl]
		if !ok {
			continue
		}
		how := "key in the body's \"id\" only"
		if ew.keyHeader {
			how = "key in Idempotency-Key, the same as the body's \"id\""
		}
		parts = append(parts, fmt.Sprintf("%s: POST %s (idemproxy's ROUTES %q; %s)", wl, ew.path, ew.rule, how))
	}
	if len(parts) == 0 {
		return ""
	}
	with := "with"
	if len(parts) > 1 {
		with = "both with"
	}
	return strings.Join(parts, "; ") + fmt.Sprintf(";\n%s a ~%d-byte Stripe event body (payment_intent.succeeded) whose \"id\" is fresh per request.",
		with, len(eventBody(eventKeyPrefix+strings.Repeat("x", 42))))
}

// keySourceLines compares json1k with unique1k at each delay where both ran:
// the proxy cpu per request of a key taken from the JSON body against one
// taken from the header, on the same bodies (issue 11: at most +10 %). The
// bare proxy, which gets the same requests and ignores keys, shows the noise.
func keySourceLines(results []result, idemName string) []string {
	type pair struct{ json, header *result }
	var delays []time.Duration
	byDelay := map[time.Duration]*pair{}
	for i := range results {
		r := &results[i]
		if r.workload != "json1k" && r.workload != "unique1k" {
			continue
		}
		p := byDelay[r.delay]
		if p == nil {
			p = &pair{}
			byDelay[r.delay] = p
			delays = append(delays, r.delay)
		}
		if r.workload == "json1k" {
			p.json = r
		} else {
			p.header = r
		}
	}
	cpu := func(s sample) float64 { return s.cpuUs }
	change := func(a, b float64) string {
		if b == 0 {
			return "?"
		}
		return fmt.Sprintf("%+.1f %%", 100*(a/b-1))
	}
	var out []string
	for _, d := range delays {
		p := byDelay[d]
		if p.json == nil || p.header == nil || len(p.json.idem) == 0 || len(p.header.idem) == 0 {
			continue
		}
		delay := d.String()
		if d == 0 {
			delay = "0"
		}
		a, b := median(p.json.idem, cpu), median(p.header.idem, cpu)
		mark := "met"
		if b == 0 || a/b-1 > 0.10 {
			mark = "MISSED"
		}
		var rounds []string
		for i := 0; i < len(p.json.idem) && i < len(p.header.idem); i++ {
			rounds = append(rounds, change(p.json.idem[i].cpuUs, p.header.idem[i].cpuUs))
		}
		out = append(out, fmt.Sprintf("json key source vs header key (1 KiB body, delay %s): proxy cpu µs/req %.1f vs %.1f = %s"+
			" (%s medians; issue 11 target ≤ +10 %%: %s; per round %s; bare proxy, same requests: %.1f vs %.1f = %s)",
			delay, a, b, change(a, b), idemName, mark, strings.Join(rounds, ", "),
			median(p.json.bare, cpu), median(p.header.bare, cpu), change(median(p.json.bare, cpu), median(p.header.bare, cpu))))
	}
	return out
}
