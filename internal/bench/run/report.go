package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// width is the report's line length: tables are laid out and prose is
// wrapped to fit it.
const width = 80

// verdict is one target judged on a run's medians.
type verdict struct{ what, measured, outcome string }

// judge says "met", or "missed by" how much, with the difference in format.
func judge(v, limit float64, atMost bool, format string) string {
	if (atMost && v <= limit) || (!atMost && v >= limit) {
		return "met"
	}
	d := limit - v
	if atMost {
		d = v - limit
	}
	return "missed by " + fmt.Sprintf(format, d)
}

// goal is a target of idemproxy against the bare proxy in one closed-loop
// workload at one upstream delay.
type goal struct {
	workload string
	delay    time.Duration
	what     string  // the figure and its bound, as printed
	limit    float64 // the bound
	atMost   bool
	unit     string // how the figure is printed: "×" (a ratio to bare) or " µs"
	value    func(r result) float64
}

func ratioOf(num, den []sample, f func(sample) float64) float64 {
	if d := median(den, f); d != 0 {
		return median(num, f) / d
	}
	return 0
}

func rps(s sample) float64     { return s.rps }
func cpu(s sample) float64     { return s.cpuUs }
func p99(s sample) float64     { return s.p99ms }
func redisUs(s sample) float64 { return s.redisUs }

// goals are the closed-loop targets: what a first request (unique) and a
// replay may cost against the bare proxy.
var goals = []goal{
	{"unique", 0, "req/s ≥ 0.65× bare", 0.65, false, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, rps) }},
	{"unique", 2 * time.Millisecond, "req/s ≥ 0.70× bare", 0.70, false, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, rps) }},
	{"unique", 0, "proxy CPU ≤ 1.25× bare", 1.25, true, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, cpu) }},
	{"unique", 0, "Redis ≤ 15 µs/req", 15, true, " µs", func(r result) float64 { return median(r.idem, redisUs) }},
	{"replay", 0, "req/s ≥ 4.0× bare", 4.0, false, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, rps) }},
	{"replay", 0, "p99 ≤ 0.5× bare", 0.5, true, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, p99) }},
	{"replay", 0, "proxy CPU ≤ 0.4× bare", 0.4, true, "×", func(r result) float64 { return ratioOf(r.idem, r.bare, cpu) }},
}

func closedVerdicts(results []result) []verdict {
	var out []verdict
	for _, g := range goals {
		for _, r := range results {
			if r.workload != g.workload || r.delay != g.delay || len(r.idem) == 0 || len(r.bare) == 0 {
				continue
			}
			f := "%.2f" + g.unit
			if g.unit != "×" {
				f = "%.1f" + g.unit
			}
			v := g.value(r)
			out = append(out, verdict{fmt.Sprintf("%s, delay %s: %s", g.workload, delayString(g.delay), g.what),
				fmt.Sprintf(f, v), judge(v, g.limit, g.atMost, f)})
		}
	}
	return out
}

// keySourceLimit bounds the proxy CPU per request of a key taken from the
// JSON body (json1k) over one taken from the header (unique1k), in %.
const keySourceLimit = 10.0

// keySourceVerdicts compares json1k with unique1k at each delay where both ran.
func keySourceVerdicts(results []result) []verdict {
	var out []verdict
	for _, j := range results {
		if j.workload != "json1k" || len(j.idem) == 0 {
			continue
		}
		for _, h := range results {
			if h.workload == "unique1k" && h.delay == j.delay && len(h.idem) > 0 && median(h.idem, cpu) > 0 {
				c := 100 * (median(j.idem, cpu)/median(h.idem, cpu) - 1)
				out = append(out, verdict{fmt.Sprintf("json1k, delay %s: CPU ≤ +10 %% of unique1k", delayString(j.delay)),
					fmt.Sprintf("%+.1f %%", c), judge(c, keySourceLimit, true, "%.1f %%")})
			}
		}
	}
	return out
}

func (b *bench) report(w io.Writer, results []result, mem []memResult, steal cpuTimes, load string) {
	cfg := b.cfg
	idemName := "idem"
	if cfg.idemBare {
		idemName = "idem(bare)"
	}
	var notes []string
	if len(results) > 0 {
		fmt.Fprintln(w)
		para(w, fmt.Sprintf("Closed loop: wrk, %d connections, %v measured after %v warm-up; %s, "+
			"the targets alternating, a fresh proxy process each round. req/s ×bare is idemproxy's median over the bare "+
			"proxy's; proxy µs/req is each proxy process's CPU per request; Redis µs/req is redis-server's CPU per request "+
			"through idemproxy.", cfg.conns, cfg.duration, cfg.warmup, medians(cfg.rounds)))
		fmt.Fprintln(w)
		tw := newTable(w)
		build := ""
		if cfg.ab {
			build = "build\t"
		}
		fmt.Fprintf(tw, "workload\tdelay\t%sreq/s ×bare\tproxy µs/req (×bare)\tRedis µs/req\n", build)
		for _, r := range results {
			row := func(name string, ss []sample) {
				if cfg.ab {
					name += "\t"
				} else {
					name = ""
				}
				fmt.Fprintf(tw, "%s\t%s\t%s%.2f×\t%.1f → %.1f (%.2f×)\t%.1f\n", r.workload, delayString(r.delay), name,
					ratioOf(ss, r.bare, rps), median(r.bare, cpu), median(ss, cpu), ratioOf(ss, r.bare, cpu), median(ss, redisUs))
			}
			row(idemName, r.idem)
			if len(r.b) > 0 {
				row("idem(B)", r.b)
			}
		}
		tw.Flush()
		notes = roundNotes(results)
		fmt.Fprintln(w)
		para(w, perRoundLine(results, cfg.ab))
		if l := eventWorkloadsLine(cfg.workloads); l != "" {
			para(w, l)
		}
		if cfg.verbose {
			for _, r := range results {
				if c := cmdsLine(r.idem); c != "" {
					para(w, fmt.Sprintf("Redis per request, %s delay %s: %s%s", r.workload, delayString(r.delay), c, keyBytesLine(r.idem)))
				}
			}
		}
	}
	for _, sec := range [][]string{openReport(b.opens, cfg), infoReport(b.infos)} {
		if len(sec) > 0 {
			fmt.Fprintln(w)
			for _, l := range sec {
				fmt.Fprintln(w, l)
			}
		}
	}
	var vs []verdict
	vs = append(vs, closedVerdicts(results)...)
	vs = append(vs, keySourceVerdicts(results)...)
	vs = append(vs, openVerdicts(b.opens)...)
	vs = append(vs, infoVerdicts(b.infos)...)
	if len(vs) > 0 && !cfg.idemBare {
		fmt.Fprintln(w, "\nTargets (measured, not checks: a miss does not fail the run):")
		tw := newTable(w)
		for _, v := range vs {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.what, v.measured, v.outcome)
		}
		tw.Flush()
	}
	if len(mem) > 0 {
		fmt.Fprintln(w, "\nMemory (idemproxy; the bare proxy in brackets):")
		for _, m := range mem {
			for _, l := range m.lines {
				fmt.Fprintln(w, "  "+l)
			}
		}
	}
	notes = append(notes, openNotes(b.opens)...)
	notes = append(notes, b.notes...)
	if len(notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, n := range notes {
		para(w, "NOTE: "+n)
	}
	fmt.Fprintln(w)
	if cfg.ab {
		para(w, fmt.Sprintf("builds: idem %s; idem(B) %s, -ab-env %q", b.idemBin, b.abBin, cfg.abEnv))
	}
	para(w, "cores: "+b.coresLine())
	para(w, "host: "+b.machineLine(steal, load))
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// para writes text word-wrapped to width, later lines indented by two.
func para(w io.Writer, text string) {
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len([]rune(line))+1+len([]rune(word)) > width {
			fmt.Fprintln(w, line)
			line = "  " + word
			continue
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		fmt.Fprintln(w, line)
	}
}

// perRoundLine gives idemproxy's req/s ratio to bare in each round pair,
// which shows how far the rounds of a run scatter; with build B, B's too.
func perRoundLine(results []result, ab bool) string {
	var parts []string
	for _, r := range results {
		var pairs []string
		for i := 0; i < len(r.bare) && i < len(r.idem); i++ {
			p := fmt.Sprintf("%.2f", r.idem[i].rps/r.bare[i].rps)
			if ab && i < len(r.b) {
				p += fmt.Sprintf("/%.2f", r.b[i].rps/r.bare[i].rps)
			}
			pairs = append(pairs, p)
		}
		parts = append(parts, fmt.Sprintf("%s %s: %s", r.workload, delayString(r.delay), strings.Join(pairs, " ")))
	}
	what := "req/s ×bare per round"
	if ab {
		what = "req/s ×bare per round, idem/idem(B)"
	}
	return what + ": " + strings.Join(parts, "; ") + "."
}

// medians says how many rounds' medians a table gives.
func medians(rounds int) string {
	if rounds == 1 {
		return "one round each"
	}
	return fmt.Sprintf("medians of %d rounds", rounds)
}

// roundNotes flags rounds whose figures are suspect: failed requests, a
// load generator at the limit of its core, other processes busy.
func roundNotes(results []result) []string {
	var notes, busy []string
	var most float64
	for _, r := range results {
		var errs int64
		var other, gen float64
		for _, ss := range [][]sample{r.bare, r.idem, r.b} {
			for _, s := range ss {
				errs += s.errs
				other, gen = max(other, s.otherPct), max(gen, s.wrkPct)
			}
		}
		at := fmt.Sprintf("%s delay %s", r.workload, delayString(r.delay))
		if errs > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d requests failed (status >= 400 or a socket error).", at, errs))
		}
		if gen > 90 {
			notes = append(notes, fmt.Sprintf("%s: wrk used up to %.0f %% of its core: the load generator may have been the limit.", at, gen))
		}
		if other > 20 {
			busy, most = append(busy, fmt.Sprintf("%s %.0f %%", at, other)), max(most, other)
		}
	}
	if len(busy) > 0 {
		notes = append(notes, fmt.Sprintf("other processes used up to %.0f %% of a core during the closed-loop rounds (%s): "+
			"the figures are noisy.", most, strings.Join(busy, ", ")))
	}
	return notes
}

// coresLine says which roles shared which cpus (taskset -c).
func (b *bench) coresLine() string {
	c := b.cfg.cpus
	byCPU := map[string][]string{}
	var order []string
	for _, role := range []string{"wrk", "proxy", "upstream", "redis"} {
		if byCPU[c[role]] == nil {
			order = append(order, c[role])
		}
		byCPU[c[role]] = append(byCPU[c[role]], map[string]string{
			"wrk": "wrk and the open-loop generator", "proxy": "the proxy under test",
			"upstream": "the upstream", "redis": "redis-server"}[role])
	}
	var parts []string
	for _, cpus := range order {
		rs := byCPU[cpus]
		who := rs[len(rs)-1]
		if len(rs) > 1 {
			who = strings.Join(rs[:len(rs)-1], ", ") + " and " + who
		}
		parts = append(parts, fmt.Sprintf("%s on cpu %s", who, cpus))
	}
	s := strings.Join(parts, "; ") + " (taskset; Go processes get GOMAXPROCS 1 per core)"
	if b.cfg.nice != 0 {
		s += fmt.Sprintf(", at nice %d", b.cfg.nice)
	}
	for _, role := range []string{"proxy", "upstream", "redis"} {
		if a := b.affinity[role]; a != "" && a != c[role] {
			s += fmt.Sprintf("; %s ran on cpus %s, not %s as asked", role, a, c[role])
		}
	}
	return s + "."
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
		if f := strings.Fields(firstLine(string(out))); len(f) > 1 {
			wrkV = f[1]
		}
	}
	redisV := "?"
	if info, err := redisDo(b.redisAddr, "INFO", "server"); err == nil {
		redisV = redisInfoField(info, "redis_version")
	}
	st := "?"
	if steal.total > 0 {
		st = fmt.Sprintf("%.1f %%", 100*float64(steal.steal)/float64(steal.total))
	}
	return fmt.Sprintf("%s, %d cpus, Linux %s; %s, wrk %s, Redis %s; %s, load average at start %s, cpu steal %s; took %v.",
		model, n, strings.TrimSpace(string(kernel)), runtime.Version(), wrkV, redisV,
		time.Now().UTC().Format("2006-01-02 15:04 MST"), load, st, time.Since(b.started).Round(time.Second))
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
		if v := median(ss, func(s sample) float64 { return s.redisCmds[c] }); v >= 0.005 {
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

// keyBytesLine gives the median Redis memory per key added in the window
// ("" when no round added keys: a replay adds none).
func keyBytesLine(ss []sample) string {
	b := median(ss, func(s sample) float64 { return s.redisKeyBytes })
	if b <= 0 {
		return ""
	}
	return fmt.Sprintf("; %.0f B of Redis memory per new key", b)
}

// eventWorkloadsLine describes the requests of the event workloads, when
// one is selected ("" when none is).
func eventWorkloadsLine(workloads []string) string {
	for _, wl := range workloads {
		if _, ok := eventWorkloads[wl]; ok {
			return fmt.Sprintf("unique1k and json1k send a ~%d-byte Stripe event whose fresh \"id\" is the key: "+
				"in Idempotency-Key too for unique1k (ROUTES %q), from the body for json1k (ROUTES %q).",
				len(eventBody(eventKeyPrefix+strings.Repeat("x", 42))), eventWorkloads["unique1k"].rule, eventWorkloads["json1k"].rule)
		}
	}
	return ""
}
