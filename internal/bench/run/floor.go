package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The floor phase (issue 14, -only floor): how much Redis CPU idemproxy's
// two scripts cost per first request when nothing else runs on Redis's core
// and no HTTP is in the way. In the wrk rounds Redis shares its core with
// the proxy and the upstream, and its CPU per request includes what that
// sharing costs (wake-ups, shallower pipelines); this phase shows the floor
// under it, the figure a target on Redis CPU can be held against.
//
// The load is internal/bench/redisfloor, run like the open-loop generator:
// a separate process under taskset on the load generator's cpu, a fresh one
// per round. It calls the claim package as idemproxy does; the driver reads
// Redis's CPU and INFO counters around the window it announces.

// floorMode is one way of driving Redis in the floor phase.
type floorMode struct{ client, script string }

func (m floorMode) String() string { return m.client + "+" + m.script }

// floorModes, in the order of the first round: idemproxy's scripts as it
// sends them by default; the same pipelining with two trivial scripts (the
// floor of any design with two scripts per request); idemproxy's scripts on
// pooled connections, one call per round trip (REDIS_AUTOPIPELINE=false);
// two scripts that write once each and check nothing (the floor of any
// design that keeps a record in two scripts); the same two writes as plain
// commands (the floor of any design that writes a claim and a record);
// idemproxy's scripts writing string records (RECORD_FORMAT=string); the
// least hash design's scripts (onehash, as ceilingproxy runs them): beside
// the first, what idemproxy's fields, arguments and clock cost Redis.
var floorModes = []floorMode{{"auto", "scripts"}, {"auto", "return1"}, {"plain", "scripts"}, {"auto", "minimal"}, {"auto", "commands"}, {"auto", "strings"}, {"auto", "onehash"}}

// The floor rounds' window: long enough for a few hundred clock ticks of
// Redis CPU, short enough that seven modes fit in about 35 seconds.
const (
	floorDuration = 4 * time.Second
	floorWarmup   = time.Second
)

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// floorLine is redisfloor's REDISFLOOR line (internal/bench/redisfloor Result).
type floorLine struct {
	Script     string `json:"script"`
	Client     string `json:"client"`
	Goroutines int    `json:"goroutines"`
	Iterations int64  `json:"iterations"`
	ElapsedUs  int64  `json:"elapsed_us"`
	CPUUs      int64  `json:"cpu_us"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error"`
}

// parseFloorLine decodes the REDISFLOOR line out of redisfloor's output.
func parseFloorLine(out string) (floorLine, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		js, ok := strings.CutPrefix(sc.Text(), "REDISFLOOR ")
		if !ok {
			continue
		}
		var l floorLine
		if err := json.Unmarshal([]byte(js), &l); err != nil {
			return floorLine{}, fmt.Errorf("redisfloor: bad result line: %w", err)
		}
		if l.Iterations <= 0 || l.ElapsedUs <= 0 || l.CPUUs < 0 || l.Goroutines < 1 || l.Errors < 0 || l.Script == "" || l.Client == "" {
			return floorLine{}, fmt.Errorf("redisfloor: implausible result %s", js)
		}
		return l, nil
	}
	return floorLine{}, errors.New("redisfloor: no REDISFLOOR line in output")
}

// floorSample is one measured floor round of one mode.
type floorSample struct {
	iterPerSec     float64
	redisUs        float64 // redis-server utime+stime per iteration (a first request: claim + complete)
	redisBusyPct   float64 // redis-server CPU over the window, % of one core
	readsPerIter   float64 // INFO stats total_reads_processed per iteration
	cmdsPerRead    float64 // total_commands_processed per read (commands inside scripts included)
	scriptsPerRead float64 // EVALSHA and EVAL calls per read: the pipeline depth Redis saw
	driverPct      float64 // redisfloor's own CPU, % of its core
	otherPct       float64 // CPU of every process but ours, % of one core (the noise)
	iterations     int64
	errors         int64
	firstError     string
}

// floorResult holds every round of one mode.
type floorResult struct {
	mode    floorMode
	samples []floorSample
}

// floorSnap is what the driver reads before and after a floor window.
type floorSnap struct {
	redis, self int64 // utime+stime ticks
	all         cpuTimes
	red         redisCounters
}

func (b *bench) floorSnapshot() (floorSnap, error) {
	var s floorSnap
	var e [2]error
	s.redis, e[0] = cpuTicks(b.redis.pid())
	s.self, _ = cpuTicks(os.Getpid())
	s.red, e[1] = readRedisCounters(b.redisAddr)
	s.all, _ = readCPUTimes("cpu")
	return s, errors.Join(e[:]...)
}

// floorPhase runs every mode -rounds times, the order reversed every other
// round so that a drift of the machine does not favour one mode.
func (b *bench) floorPhase(ctx context.Context) error {
	cfg := b.cfg
	res := make([]floorResult, len(floorModes))
	for i, m := range floorModes {
		res[i].mode = m
	}
	defer func() {
		for _, r := range res {
			if len(r.samples) > 0 {
				b.floors = append(b.floors, r)
			}
		}
	}()
	logf("floor: %d round(s) of %v (after %v warm-up) per mode, redisfloor on cpu %s, Redis alone on cpu %s",
		cfg.rounds, floorDuration, floorWarmup, cfg.cpus["wrk"], cfg.cpus["redis"])
	for r := 0; r < cfg.rounds; r++ {
		for j := range floorModes {
			i := j
			if r%2 == 1 {
				i = len(floorModes) - 1 - j
			}
			s, err := b.floorRound(ctx, floorModes[i])
			if err != nil {
				return fmt.Errorf("floor round %d %v: %w", r+1, floorModes[i], err)
			}
			logf("floor  round %d/%d %-13v %8.0f it/s  redis %5.1fµs/it (busy %3.0f%%)  reads/it %.2f  commands/read %.1f  scripts/read %.1f | redisfloor %.0f%% of its core, other processes %.0f%% of a core, errors %d",
				r+1, cfg.rounds, floorModes[i], s.iterPerSec, s.redisUs, s.redisBusyPct, s.readsPerIter, s.cmdsPerRead, s.scriptsPerRead, s.driverPct, s.otherPct, s.errors)
			res[i].samples = append(res[i].samples, s)
		}
	}
	return nil
}

// floorRound runs redisfloor once in mode m against the bench's Redis,
// emptied first.
func (b *bench) floorRound(ctx context.Context, m floorMode) (floorSample, error) {
	cfg := b.cfg
	if _, err := redisDo(b.redisAddr, "FLUSHALL"); err != nil {
		return floorSample{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, floorWarmup+floorDuration+45*time.Second)
	defer cancel()
	argv := pinned(cfg.nice, cfg.cpus["wrk"], b.floorBin,
		"-addr", b.redisAddr, "-g", strconv.Itoa(cfg.conns), "-script", m.script, "-client", m.client,
		"-duration", floorDuration.String(), "-warmup", floorWarmup.String())
	// The window starts at MEASURE and ends at the result line, which
	// redisfloor prints once its last iteration has ended and before it
	// closes its connections.
	var s0, s1 floorSnap
	var err0, err1 error
	measuring, ended := false, false
	out, stderr, err := runHelper(ctx, argv, func(line string, pid int) {
		switch {
		case line == "MEASURE" && !measuring:
			measuring = true
			s0, err0 = b.floorSnapshot()
			b.notePidAffinity("redisfloor", pid)
		case strings.HasPrefix(line, "REDISFLOOR ") && measuring && !ended:
			ended = true
			s1, err1 = b.floorSnapshot()
		}
	})
	if err != nil {
		return floorSample{}, fmt.Errorf("redisfloor: %w\n%s%s", err, out, stderr)
	}
	if !ended {
		return floorSample{}, fmt.Errorf("redisfloor: no MEASURE then REDISFLOOR line\n%s%s", out, stderr)
	}
	if err := errors.Join(err0, err1); err != nil {
		return floorSample{}, err
	}
	l, err := parseFloorLine(out)
	if err != nil {
		return floorSample{}, fmt.Errorf("%w\n%s", err, stderr)
	}
	if cfg.verbose {
		fmt.Fprint(os.Stderr, out, stderr)
	}
	return b.floorSampleOf(l, s0, s1), nil
}

// floorSampleOf turns redisfloor's line and the snapshots around its window
// into a sample.
func (b *bench) floorSampleOf(l floorLine, s0, s1 floorSnap) floorSample {
	tick := 1e6 / float64(b.clkTck) // µs
	elapsed := float64(l.ElapsedUs)
	n := float64(l.Iterations)
	redisUs := float64(s1.redis-s0.redis) * tick
	// s0's INFO is counted in s1's figures; the reads of the driver's own
	// INFO connections (two or three) are left in, noise against thousands.
	reads := float64(s1.red.reads - s0.red.reads)
	cmds := float64(s1.red.commands - s0.red.commands - 1)
	scripts := float64(s1.red.calls["evalsha"] - s0.red.calls["evalsha"] + s1.red.calls["eval"] - s0.red.calls["eval"])
	per := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	s := floorSample{
		iterPerSec:     n * 1e6 / elapsed,
		redisUs:        redisUs / n,
		redisBusyPct:   100 * redisUs / elapsed,
		readsPerIter:   reads / n,
		cmdsPerRead:    per(cmds, reads),
		scriptsPerRead: per(scripts, reads),
		driverPct:      100 * float64(l.CPUUs) / elapsed,
		iterations:     l.Iterations,
		errors:         l.Errors,
		firstError:     l.FirstError,
	}
	if d := s1.all.sub(s0.all); d.total > 0 {
		perCPU := float64(d.total) / float64(b.ncpu)
		ours := float64(s1.redis-s0.redis+s1.self-s0.self) + float64(l.CPUUs)/tick
		s.otherPct = max(0, 100*(float64(d.busy)-ours)/perCPU)
	}
	return s
}

// floorTarget is issue 14's target on Redis CPU per first request.
const floorTarget = 15.0 // µs

// floorReport is the floor section of the report.
func floorReport(floors []floorResult, cfg *config, affinity map[string]string) []string {
	if len(floors) == 0 {
		return nil
	}
	seen := func(role string) string {
		if a := affinity[role]; a != "" {
			return a
		}
		return "?"
	}
	out := []string{
		"Redis CPU floor (issue 14): idemproxy's own scripts with no HTTP in the way. internal/bench/redisfloor runs " + strconv.Itoa(cfg.conns) + " goroutines (-conns),",
		"each looping on a fresh key: Store.Acquire (claim.lua), then Lease.Complete (complete.lua) with the upstream's 201 answer (~200-byte body),",
		"through a go-redis client made as idemproxy makes it. auto: automatic pipelining, idemproxy's default; plain: pooled connections, one script",
		"per round trip (REDIS_AUTOPIPELINE=false); return1: two EVALSHAs of `return 1` per iteration instead, the floor of any two-script design;",
		"minimal: two scripts that write once each (SET NX GET PX of the claim, SET PX of the record) and check nothing, the floor of any design keeping a record in two scripts;",
		"commands: the same two writes as plain commands (no script), the floor of any design that writes a claim and then a record;",
		"strings: idemproxy's scripts as in auto+scripts, writing string records (RECORD_FORMAT=string);",
		"onehash: the least hash design's two scripts (HSETNX, PEXPIRE NX; HGET, the token compared, HSET, PEXPIRE), as ceilingproxy -design onehash runs them.",
		fmt.Sprintf("redisfloor on cpu %s, redis-server on cpu %s (affinity read back: %s, %s), nothing else of the bench running; %v warm-up, then %v measured,",
			cfg.cpus["wrk"], cfg.cpus["redis"], seen("redisfloor"), seen("redis"), floorWarmup, floorDuration),
		fmt.Sprintf("FLUSHALL before each round, modes in turn (reversed every other round), medians of %d round(s).", cfg.rounds),
		"",
	}
	var sb strings.Builder
	tw := newTable(&sb)
	fmt.Fprintln(tw, "mode\titerations/s\tredis µs/iteration\tredis busy\treads/iteration\tcommands/read\tscripts/read\tredisfloor cpu\tother processes\terrors")
	var notes []string
	for _, f := range floors {
		med := func(g func(floorSample) float64) float64 { return median(f.samples, g) }
		var errs int64
		for i, s := range f.samples {
			errs += s.errors
			if s.errors > 0 {
				notes = append(notes, fmt.Sprintf("  NOTE: floor %v round %d: %d failed iteration(s), the first: %s", f.mode, i+1, s.errors, s.firstError))
			}
			if s.driverPct >= 90 {
				notes = append(notes, fmt.Sprintf("  NOTE: floor %v round %d: redisfloor used %.0f%% of its core (Redis %.0f%% of its own): the driver, not Redis, set the pace, "+
					"so iterations/s is not Redis's capacity; Redis CPU per iteration is still the figure", f.mode, i+1, s.driverPct, s.redisBusyPct))
			}
		}
		fmt.Fprintf(tw, "%v\t%.0f\t%.1f\t%.0f%%\t%.2f\t%.1f\t%.1f\t%.0f%%\t%.0f%%\t%d\n", f.mode,
			med(func(s floorSample) float64 { return s.iterPerSec }),
			med(func(s floorSample) float64 { return s.redisUs }),
			med(func(s floorSample) float64 { return s.redisBusyPct }),
			med(func(s floorSample) float64 { return s.readsPerIter }),
			med(func(s floorSample) float64 { return s.cmdsPerRead }),
			med(func(s floorSample) float64 { return s.scriptsPerRead }),
			med(func(s floorSample) float64 { return s.driverPct }),
			med(func(s floorSample) float64 { return s.otherPct }),
			errs)
	}
	tw.Flush()
	out = append(out, strings.Split(strings.TrimRight(sb.String(), "\n"), "\n")...)
	out = append(out, "")
	byMode := map[floorMode][]floorSample{}
	for _, f := range floors {
		byMode[f.mode] = f.samples
	}
	redisUs := func(s floorSample) float64 { return s.redisUs }
	var parts []string
	if ss := byMode[floorModes[0]]; len(ss) > 0 {
		v := median(ss, redisUs)
		parts = append(parts, fmt.Sprintf("idemproxy's scripts, pipelined as it sends them: %.1f µs of Redis CPU per first request; issue 14 target ≤ %.0f µs: %s at the floor", v, floorTarget, metMark(v <= floorTarget)))
	}
	if ss := byMode[floorModes[1]]; len(ss) > 0 {
		parts = append(parts, fmt.Sprintf("any two scripts, same pipelining: %.1f µs", median(ss, redisUs)))
	}
	if ss := byMode[floorModes[2]]; len(ss) > 0 {
		parts = append(parts, fmt.Sprintf("idemproxy's scripts on pooled connections: %.1f µs", median(ss, redisUs)))
	}
	if ss := byMode[floorModes[3]]; len(ss) > 0 {
		v := median(ss, redisUs)
		parts = append(parts, fmt.Sprintf("two scripts that write once each and check nothing (below any correct two-script design): %.1f µs, under the target: %s", v, yesNo(v <= floorTarget)))
	}
	if ss := byMode[floorModes[4]]; len(ss) > 0 {
		v := median(ss, redisUs)
		parts = append(parts, fmt.Sprintf("the same two writes as plain commands (the least any design writes): %.1f µs, under the target: %s", v, yesNo(v <= floorTarget)))
	}
	if ss := byMode[floorModes[5]]; len(ss) > 0 {
		v := median(ss, redisUs)
		parts = append(parts, fmt.Sprintf("idemproxy's scripts with RECORD_FORMAT=string: %.1f µs; issue 14 target: %s at the floor", v, metMark(v <= floorTarget)))
	}
	if ss := byMode[floorModes[6]]; len(ss) > 0 {
		v := median(ss, redisUs)
		part := fmt.Sprintf("the least hash design's scripts (onehash): %.1f µs, under the target: %s", v, yesNo(v <= floorTarget))
		if idem := byMode[floorModes[0]]; len(idem) > 0 {
			if d := median(idem, redisUs) - v; d >= 0 {
				part += fmt.Sprintf(", idemproxy's scripts %.1f µs above it", d)
			} else {
				part += fmt.Sprintf(", idemproxy's scripts %.1f µs below it", -d)
			}
		}
		parts = append(parts, part)
	}
	out = append(out, "floor  "+strings.Join(parts, "; ")+".")
	out = append(out, "redis µs/iteration: redis-server utime+stime (/proc/<pid>/stat) over the window / iterations. redis busy: the same over the",
		"window's length. reads, commands: INFO stats total_reads_processed, total_commands_processed (commands inside scripts count);",
		"scripts/read: EVALSHA and EVAL calls (INFO commandstats) per read, the pipeline depth Redis saw (commands/read for commands). redisfloor cpu: its own",
		"utime+stime, % of its core: near 100 % the driver, not Redis, set the pace. iterations/s is Redis's capacity only where redis",
		"busy is near 100 %; below, the round trips of a closed loop set it. Redis CPU per iteration is the floor either way.")
	if cfg.cpus["redis"] == cfg.cpus["wrk"] {
		notes = append(notes, "  NOTE: redis-server and redisfloor share cpu "+cfg.cpus["redis"]+" (-cpus): Redis did not have its core alone")
	}
	return append(out, notes...)
}
