// Command run is the driver of the idemproxy benchmark; scripts/bench.sh (and
// `make bench`) builds and runs it from the repository root.
//
// It builds idemproxy from the tree plus a fake upstream (internal/bench/upstream)
// and a bare httputil.ReverseProxy with idemproxy's transport
// (internal/bench/bareproxy), starts them and a real redis-server on 127.0.0.1,
// drives each proxy with wrk (workload.lua) and then at fixed rates
// (internal/bench/openloop), alternating bare and idemproxy rounds, runs two
// memory checks and prints the ratios of the medians. Absolute figures on a
// shared 2-core machine are noise; the ratios, measured in the same run, are
// the result. docs/performance.md describes the method and the results.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitMemFail     = 3
	exitInterrupted = 130
)

var allWorkloads = []string{"unique", "replay", "mixed", "nokey", "unique1k", "json1k", "open", "info", "mem"}

// defaultWorkloads is -only's default: about 6 minutes with the other
// defaults. info is left out (about 90 s more with two delays): it measures a
// logging setting, not the request path, and is run on its own (-only info).
const defaultWorkloads = "unique,replay,mixed,open,mem"

type config struct {
	repo, workdir string
	keep, verbose bool

	duration, warmup time.Duration
	rounds           int
	conns, threads   int
	primed           int
	workloads        []string // workloads to run: the wrk ones in order, then info and open (per delay)
	mem              bool     // run the memory checks
	delays           []time.Duration
	cpus             map[string]string // wrk, proxy, upstream, redis -> taskset cpu list
	nice             int

	openRounds   int           // open-loop rounds per target and delay
	openDuration time.Duration // measured part of an open-loop round
	openWarmup   time.Duration // warm-up at the same rate before it
	openFracs    []float64     // the fixed rates as shares of the bare proxy's closed-loop req/s

	idemBare bool     // put a second bare proxy in idemproxy's slot (harness self-test)
	idemBin  string   // prebuilt idemproxy binary instead of building the tree
	idemEnv  []string // extra KEY=VALUE for idemproxy
	// ab adds build B, a second idemproxy, as a third target to every
	// closed-loop round, so that bare, idemproxy (A) and B alternate round
	// by round in one run: B is abBin (A's binary when "") with -idem-env
	// and then abEnv in its environment.
	ab    bool
	abBin string
	abEnv []string

	memSlack  int64 // bytes of RSS growth allowed beyond MAX_STORED_RESPONSE_BYTES
	maxStored int64 // MAX_STORED_RESPONSE_BYTES in effect
	slowN     int
	slow      time.Duration
	bigBytes  int64
	memLimit  int64 // RSS limit of the slow-requests check
}

// delayed tells whether a workload runs per upstream delay (every one but
// the memory checks, which start their own upstream).
func (c *config) delayed() bool { return len(c.workloads) > 0 }

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() { os.Exit(run()) }

func run() int {
	// SIGPIPE too: a closed stdout or stderr (bench.sh | head) must still end
	// in the cleanup below, not kill the driver and leave its processes.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	cfg, code := parseFlags(os.Args[1:])
	b := &bench{cfg: cfg, started: time.Now()}
	defer func() {
		b.procs.stopAll()
		switch {
		case cfg.workdir == "":
		case !cfg.keep && strings.HasPrefix(filepath.Base(cfg.workdir), "idemproxy-bench."):
			os.RemoveAll(cfg.workdir) // ours: made by bench.sh or setup (never a directory a user named otherwise)
		default:
			fmt.Fprintf(os.Stderr, "bench: logs kept in %s\n", cfg.workdir)
		}
	}()
	if code >= 0 {
		return code
	}
	code = b.main(ctx)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "bench: interrupted; every process started was stopped")
		return exitInterrupted
	}
	return code
}

func parseFlags(args []string) (*config, int) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	cfg := &config{}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: scripts/bench.sh [flags]  (make bench BENCH_FLAGS='...')\n\n"+
			"Benchmarks idemproxy, built from the tree, against a bare httputil.ReverseProxy\n"+
			"with the same transport, upstream and real Redis (docs/performance.md).\n"+
			"Exit status: 0 done, 1 harness error, 2 usage, 3 a memory check failed,\n"+
			"130 interrupted. A missed target does not fail the run.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.repo, "repo", ".", "repository root (holds go.mod of github.com/idemproxy/idemproxy)")
	fs.StringVar(&cfg.workdir, "workdir", "", "scratch directory for binaries and logs (default: a new one, removed at the end)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the scratch directory (process logs)")
	fs.BoolVar(&cfg.verbose, "v", false, "print every round's figures, wrk's output and Redis's commands per request")
	fs.DurationVar(&cfg.duration, "duration", 8*time.Second, "measured duration of one round (whole seconds)")
	fs.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "warm-up before each measured round (whole seconds, 0 for none)")
	fs.IntVar(&cfg.rounds, "rounds", 2, "rounds per target, alternated; the report gives medians")
	fs.IntVar(&cfg.conns, "conns", 64, "wrk connections")
	fs.IntVar(&cfg.threads, "threads", 1, "wrk threads")
	fs.IntVar(&cfg.primed, "primed", 100, "keys primed for the replay and mixed workloads")
	quick := fs.Bool("quick", false, "smoke test: -duration 2s -warmup 1s -rounds 1 -open-duration 2s (unless given)")
	only := fs.String("only", defaultWorkloads, "comma-separated workloads of "+strings.Join(allWorkloads, ", ")+
		"\n(docs/performance.md says what each measures)")
	fs.IntVar(&cfg.openRounds, "open-rounds", 0, "open-loop rounds per target and delay (0: -rounds)")
	fs.DurationVar(&cfg.openDuration, "open-duration", 5*time.Second, "measured duration of one open-loop round")
	fs.DurationVar(&cfg.openWarmup, "open-warmup", time.Second, "warm-up at the fixed rate before each open-loop round (0 for none)")
	openRates := fs.String("open-rates", "0.5", "open-loop rates as fractions of the bare proxy's unique req/s")
	delays := fs.String("delays", "0,2ms", "comma-separated upstream service delays")
	fs.IntVar(&cfg.nice, "nice", 0, "niceness of every process of the run (e.g. -10, as root)")
	cpus := fs.String("cpus", "wrk=0,proxy=1,upstream=1,redis=1", "taskset cpu list per role")
	fs.BoolVar(&cfg.idemBare, "idem-bare", false, "self-test: a second bare proxy in idemproxy's place shows the noise")
	fs.StringVar(&cfg.idemBin, "idem-bin", "", "benchmark this idemproxy binary instead of building the tree")
	var idemEnv listFlag
	fs.Var(&idemEnv, "idem-env", "extra KEY=VALUE in idemproxy's environment (repeatable)")
	fs.StringVar(&cfg.abBin, "ab-bin", "", "A/B: a second idemproxy binary, B, run in every closed-loop round too")
	var abEnv listFlag
	fs.Var(&abEnv, "ab-env", "A/B: extra KEY=VALUE for B, after -idem-env (repeatable; alone: B is A's binary)")
	memSlackMiB := fs.Float64("mem-slack", 4, "MiB of RSS growth allowed over MAX_STORED_RESPONSE_BYTES, 10 MiB check")
	fs.IntVar(&cfg.slowN, "slow-n", 1000, "concurrent slow requests of the memory check")
	fs.DurationVar(&cfg.slow, "slow", 2*time.Second, "how long the upstream holds each slow request")
	memLimitMiB := fs.Int64("mem-limit", 200, "MiB of peak RSS allowed in the slow-requests check")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, exitOK
		}
		return cfg, exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q\n", fs.Args())
		return cfg, exitUsage
	}
	set := map[string]bool{} // the flags given
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick { // without overriding what is given explicitly
		if !set["duration"] {
			cfg.duration = 2 * time.Second
		}
		if !set["warmup"] {
			cfg.warmup = time.Second
		}
		if !set["rounds"] {
			cfg.rounds = 1
		}
		if !set["open-duration"] {
			cfg.openDuration = 2 * time.Second
		}
	}
	var bad []string
	for _, w := range strings.Split(*only, ",") {
		w = strings.TrimSpace(w)
		switch {
		case w == "":
		case w == "mem":
			cfg.mem = true
		case slices.Contains(allWorkloads, w):
			cfg.workloads = append(cfg.workloads, w)
		default:
			bad = append(bad, fmt.Sprintf("-only: unknown workload %q (want %s)", w, strings.Join(allWorkloads, ", ")))
		}
	}
	for _, d := range strings.Split(*delays, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if d == "0" {
			d = "0s"
		}
		v, err := time.ParseDuration(d)
		if err != nil || v < 0 {
			bad = append(bad, fmt.Sprintf("-delays: bad duration %q", d))
			continue
		}
		cfg.delays = append(cfg.delays, v)
	}
	cfg.cpus = map[string]string{}
	for _, kv := range strings.Split(*cpus, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		cfg.cpus[k] = v
	}
	for _, k := range []string{"wrk", "proxy", "upstream", "redis"} {
		if cfg.cpus[k] == "" || len(cfg.cpus) != 4 {
			bad = append(bad, fmt.Sprintf("-cpus: %q: want role=cpulist for each of wrk, proxy, upstream, redis", *cpus))
			break
		}
	}
	if cfg.nice < -20 || cfg.nice > 19 {
		bad = append(bad, "-nice: want -20..19")
	}
	if cfg.openRounds == 0 {
		cfg.openRounds = cfg.rounds
	}
	if cfg.openRounds < 1 || cfg.openDuration < time.Second || cfg.openWarmup < 0 {
		bad = append(bad, "need -open-rounds >= 0, -open-duration >= 1s, -open-warmup >= 0")
	}
	for _, f := range strings.Split(*openRates, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || v > 2 {
			bad = append(bad, fmt.Sprintf("-open-rates: %q is not a fraction in (0, 2]", f))
			continue
		}
		cfg.openFracs = append(cfg.openFracs, v)
	}
	if cfg.duration < time.Second || cfg.warmup < 0 || cfg.rounds < 1 || cfg.conns < 1 || cfg.threads < 1 || cfg.threads > cfg.conns || cfg.primed < 1 || cfg.slowN < 1 {
		bad = append(bad, "need -duration >= 1s, -warmup >= 0, -rounds >= 1, 1 <= -threads <= -conns, -primed >= 1, -slow-n >= 1")
	}
	if cfg.delayed() && len(cfg.delays) == 0 {
		bad = append(bad, "-delays: none given")
	}
	if len(cfg.workloads) == 0 && !cfg.mem {
		bad = append(bad, "-only: nothing to run")
	}
	cfg.maxStored = 1 << 20
	for _, kv := range idemEnv {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			bad = append(bad, fmt.Sprintf("-idem-env: want KEY=VALUE, got %q", kv))
			continue
		}
		if k == "MAX_STORED_RESPONSE_BYTES" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				bad = append(bad, fmt.Sprintf("-idem-env: MAX_STORED_RESPONSE_BYTES=%q is not an integer", v))
			}
			cfg.maxStored = n
		}
	}
	cfg.idemEnv = idemEnv
	for _, kv := range abEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			bad = append(bad, fmt.Sprintf("-ab-env: want KEY=VALUE, got %q", kv))
		}
	}
	cfg.abEnv = abEnv
	cfg.ab = cfg.abBin != "" || len(abEnv) > 0
	if cfg.abBin != "" {
		if fi, err := os.Stat(cfg.abBin); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			bad = append(bad, fmt.Sprintf("-ab-bin: %q is not an executable file", cfg.abBin))
		}
	}
	if cfg.ab {
		if !set["only"] { // B has closed-loop rounds only
			cfg.workloads, cfg.mem = []string{"unique", "replay", "mixed"}, false
		}
		if cfg.idemBare || cfg.mem || slices.ContainsFunc(cfg.workloads, func(w string) bool { return w == "open" || w == "info" }) {
			bad = append(bad, "-ab-bin, -ab-env: B has closed-loop rounds only: not with -only open, info or mem, nor -idem-bare")
		}
	}
	cfg.memSlack = int64(*memSlackMiB * (1 << 20))
	cfg.memLimit = *memLimitMiB << 20
	cfg.bigBytes = 10 << 20
	if len(bad) > 0 {
		for _, m := range bad {
			fmt.Fprintln(os.Stderr, "bench:", m)
		}
		return cfg, exitUsage
	}
	return cfg, -1
}

// bench holds the state of one run.
type bench struct {
	cfg     *config
	procs   procs
	started time.Time
	runID   string
	clkTck  int64
	ncpu    int // cpus in /proc/stat

	upstreamBin, bareBin, idemBin string
	abBin                         string // build B's binary, absolute
	openBin                       string // the fixed-rate generator (internal/bench/openloop)
	script, eventTpl              string
	redisAddr                     string
	redis                         *proc
	client                        *http.Client
	wrk                           wrkRun

	affinity map[string]string // role -> Cpus_allowed_list seen on a live process
	notes    []string          // warnings printed under the table
	opens    []openResult      // open-loop phases, one per delay
	infos    []infoResult      // LOG_LEVEL=info phases, one per delay
}

func (b *bench) main(ctx context.Context) int {
	cfg := b.cfg
	if err := b.setup(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return exitError
	}
	steal0, _ := readCPUTimes("cpu")
	load0, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(load0)); len(f) >= 3 {
		load0 = []byte(strings.Join(f[:3], " "))
	}

	others := map[string]bool{}
	for _, o := range otherBenches(cfg.workdir) {
		others[o] = true
	}
	var results []result
	for _, d := range cfg.delays {
		if !cfg.delayed() {
			break
		}
		rs, err := b.delayGroup(ctx, d)
		results = append(results, rs...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			if len(results)+len(b.opens)+len(b.infos) == 0 || ctx.Err() != nil {
				return exitError
			}
			b.notes = append(b.notes, "run stopped early: "+firstLine(err.Error()))
			break
		}
	}
	var mem []memResult
	if cfg.mem && ctx.Err() == nil {
		var err error
		if mem, err = b.memChecks(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			if ctx.Err() != nil {
				return exitError
			}
			b.notes = append(b.notes, "memory checks stopped early: "+firstLine(err.Error()))
		}
	}
	for _, o := range otherBenches(cfg.workdir) {
		others[o] = true
	}
	if len(others) > 0 {
		list := slices.Sorted(maps.Keys(others))
		b.notes = append(b.notes, "another benchmark ran on this machine during this run (seen at its start or end): "+strings.Join(list, "; ")+
			": both used the same cores, so neither run's figures are clean")
	}
	steal1, _ := readCPUTimes("cpu")
	b.report(os.Stdout, results, mem, steal1.sub(steal0), strings.TrimSpace(string(load0)))
	for _, m := range mem {
		if !m.pass {
			return exitMemFail
		}
	}
	return exitOK
}

// otherBenches lists the benchmark drivers running besides this one (their
// scratch directories are named idemproxy-bench.*, as bench.sh makes them),
// as "pid N: argv[0]".
func otherBenches(workdir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmd), "\x00")
		if filepath.Base(argv0) == "bench" && strings.Contains(argv0, "/idemproxy-bench.") &&
			(workdir == "" || !strings.HasPrefix(argv0, workdir+"/")) {
			out = append(out, fmt.Sprintf("pid %d: %s", pid, argv0))
		}
	}
	return out
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

// setup checks the tools, builds the binaries, starts redis-server and pins
// the driver itself to the load generator's cpu.
func (b *bench) setup(ctx context.Context) error {
	cfg := b.cfg
	if err := ensureTools(ctx); err != nil {
		return err
	}
	repo, err := filepath.Abs(cfg.repo)
	if err != nil {
		return err
	}
	cfg.repo = repo
	if mod, err := os.ReadFile(filepath.Join(repo, "go.mod")); err != nil || !strings.Contains(string(mod), "module github.com/idemproxy/idemproxy\n") {
		return fmt.Errorf("-repo %s: not the idemproxy repository root (no go.mod of github.com/idemproxy/idemproxy)", repo)
	}
	if cfg.workdir == "" {
		if cfg.workdir, err = os.MkdirTemp("", "idemproxy-bench."); err != nil {
			return err
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	b.runID = hex.EncodeToString(rnd[:])
	b.clkTck = clockTicks()
	b.ncpu = countCPUs()
	b.client = &http.Client{
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, DisableCompression: true},
		Timeout:   30 * time.Second,
	}
	b.affinity = map[string]string{}

	logf("building fake upstream, bare proxy and fixed-rate generator")
	if err := goBuild(ctx, repo, cfg.workdir, "./internal/bench/upstream", "./internal/bench/bareproxy", "./internal/bench/openloop"); err != nil {
		return err
	}
	b.openBin = filepath.Join(cfg.workdir, "openloop")
	b.upstreamBin = filepath.Join(cfg.workdir, "upstream")
	b.bareBin = filepath.Join(cfg.workdir, "bareproxy")
	switch {
	case cfg.idemBare:
		b.idemBin = b.bareBin
		logf("-idem-bare: a second bare proxy takes idemproxy's slot")
	case cfg.idemBin != "":
		if b.idemBin, err = filepath.Abs(cfg.idemBin); err != nil {
			return err
		}
	default:
		logf("building idemproxy from %s", repo)
		b.idemBin = filepath.Join(cfg.workdir, "idemproxy")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.idemBin, ".")
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build -o %s . (idemproxy) failed: %w\n%s\n(use -idem-bare to test the harness alone)", b.idemBin, err, out)
		}
	}
	b.abBin = b.idemBin
	if cfg.abBin != "" {
		if b.abBin, err = filepath.Abs(cfg.abBin); err != nil {
			return err
		}
	}
	if cfg.ab {
		logf("A/B: B (%s, %q) alternates with idemproxy (%s)", b.abBin, cfg.abEnv, b.idemBin)
	}
	b.script = filepath.Join(cfg.workdir, "workload.lua")
	if err := os.WriteFile(b.script, []byte(workloadLua), 0o644); err != nil {
		return err
	}
	b.eventTpl = filepath.Join(cfg.workdir, "event.json")
	if err := os.WriteFile(b.eventTpl, []byte(eventTemplate), 0o644); err != nil {
		return err
	}
	b.procs.nice = cfg.nice
	b.wrk = wrkRun{cpu: cfg.cpus["wrk"], nice: cfg.nice, threads: cfg.threads, conns: cfg.conns, script: b.script, event: b.eventTpl}

	// From here on, the driver only waits; keep it off the proxy's cpu.
	if out, err := exec.CommandContext(ctx, "taskset", "-a", "-p", "-c", cfg.cpus["wrk"], strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset -a -p -c %s %d: %w\n%s", cfg.cpus["wrk"], os.Getpid(), err, out)
	}

	port, err := freePort()
	if err != nil {
		return err
	}
	b.redisAddr = fmt.Sprintf("127.0.0.1:%d", port)
	b.redis, err = b.procs.start("redis-server", cfg.cpus["redis"], baseEnv(), filepath.Join(cfg.workdir, "redis.log"),
		"redis-server", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--protected-mode", "yes", "--daemonize", "no")
	if err != nil {
		return err
	}
	if err := waitReady(ctx, b.redis, 10*time.Second, func() error {
		r, err := redisDo(b.redisAddr, "PING")
		if err == nil && r != "PONG" {
			err = fmt.Errorf("PING answered %q", r)
		}
		return err
	}); err != nil {
		return err
	}
	b.noteAffinity("redis", b.redis)
	return nil
}

// ensureTools finds wrk, redis-server and taskset, installing the first two
// with apt-get when missing and running as root.
func ensureTools(ctx context.Context) error {
	if _, err := exec.LookPath("taskset"); err != nil {
		return errors.New("taskset not found: install the util-linux package")
	}
	var missing []string
	for _, t := range []struct{ bin, pkg string }{{"wrk", "wrk"}, {"redis-server", "redis-server"}} {
		if _, err := exec.LookPath(t.bin); err != nil {
			missing = append(missing, t.pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		return fmt.Errorf("missing %s: install the package(s) %s (e.g. sudo apt-get install -y %s) and run again",
			strings.Join(missing, ", "), strings.Join(missing, " "), strings.Join(missing, " "))
	}
	logf("installing %s with apt-get", strings.Join(missing, " "))
	install := func() error {
		cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y"}, missing...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		return cmd.Run()
	}
	if err := install(); err != nil {
		upd := exec.CommandContext(ctx, "apt-get", "update")
		upd.Stdout, upd.Stderr = os.Stderr, os.Stderr
		if err := upd.Run(); err != nil {
			return fmt.Errorf("apt-get update: %w", err)
		}
		if err := install(); err != nil {
			return fmt.Errorf("apt-get install -y %s: %w", strings.Join(missing, " "), err)
		}
	}
	return nil
}

func goBuild(ctx context.Context, repo, outDir string, pkgs ...string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", outDir + "/"}, pkgs...)...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// clockTicks returns USER_HZ, the unit of /proc/<pid>/stat times.
func clockTicks() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}

// countCPUs counts the cpuN lines of /proc/stat (runtime.NumCPU would count
// only the cpus of the driver's affinity).
func countCPUs() int {
	b, err := os.ReadFile("/proc/stat")
	n := 0
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if len(l) > 3 && strings.HasPrefix(l, "cpu") && l[3] >= '0' && l[3] <= '9' {
				n++
			}
		}
	}
	return max(n, 1)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// baseEnv is the whole environment of a child: nothing of the caller's leaks
// in (a stray KEY_PREFIX or ROUTES would change what is measured).
func baseEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// noteAffinity records the cpus the kernel lets p run on, for the report.
func (b *bench) noteAffinity(role string, p *proc) {
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			b.affinity[role] = strings.TrimSpace(v)
		}
	}
}

// ---- processes under test ----

type upstream struct {
	p   *proc
	url string
}

func (b *bench) startUpstream(ctx context.Context, delay time.Duration) (*upstream, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := b.procs.start("upstream", b.cfg.cpus["upstream"], baseEnv(),
		filepath.Join(b.cfg.workdir, fmt.Sprintf("upstream-%d.log", port)), b.upstreamBin,
		"-listen", addr, "-delay", delay.String(), "-slow", b.cfg.slow.String(),
		"-big-bytes", strconv.FormatInt(b.cfg.bigBytes, 10))
	if err != nil {
		return nil, err
	}
	u := &upstream{p: p, url: "http://" + addr}
	if err := waitReady(ctx, p, 10*time.Second, func() error { return b.get(u.url + "/healthz") }); err != nil {
		p.stop()
		return nil, err
	}
	b.noteAffinity("upstream", p)
	return u, nil
}

type upstreamStats struct{ hits, inflightMax int64 }

func (b *bench) upstreamStats(u *upstream, reset bool) (upstreamStats, error) {
	url := u.url + "/stats"
	if reset {
		url += "?reset=1"
	}
	resp, err := b.client.Get(url)
	if err != nil {
		return upstreamStats{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return upstreamStats{}, err
	}
	var v struct {
		Hits        int64 `json:"hits"`
		InflightMax int64 `json:"inflight_max"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return upstreamStats{}, fmt.Errorf("upstream /stats: %w", err)
	}
	return upstreamStats{hits: v.Hits, inflightMax: v.InflightMax}, nil
}

// target is one proxy under test: "bare" or "idem".
type target struct {
	kind string
	p    *proc
	url  string
}

// startTarget starts a fresh proxy and waits until it is ready. A start that
// fails is tried once more on new ports: freePort's port can be taken by
// another program before the proxy binds it.
// wl is the workload (its ROUTES rule, if any, is added to idemproxy's
// environment); "" for none.
func (b *bench) startTarget(ctx context.Context, kind string, up *upstream, wl string) (*target, error) {
	t, err := b.startTargetOnce(ctx, kind, up, wl)
	if err != nil && ctx.Err() == nil {
		logf("%s did not start, trying once more on new ports: %v", kind, err)
		t, err = b.startTargetOnce(ctx, kind, up, wl)
	}
	return t, err
}

func (b *bench) startTargetOnce(ctx context.Context, kind string, up *upstream, wl string) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logPath := filepath.Join(b.cfg.workdir, fmt.Sprintf("%s-%d.log", kind, port))
	t := &target{kind: kind, url: "http://" + addr}
	var ready func() error
	// kind: bare, or idemproxy as idem (LOG_LEVEL=warn, as every idemproxy
	// round), warn (the same, in the info phase) or info (LOG_LEVEL=info, its
	// default: a JSON access-log line per request on stdout, which goes to
	// logPath like everything a process under test writes, never to a pipe).
	if kind == "bare" || b.cfg.idemBare {
		t.p, err = b.startProxy(kind, baseEnv(), logPath, b.bareBin,
			"-listen", addr, "-upstream", up.url)
		ready = func() error { return b.get(t.url + "/healthz") }
	} else {
		aport, err2 := freePort()
		if err2 != nil {
			return nil, err2
		}
		admin := fmt.Sprintf("127.0.0.1:%d", aport)
		env := append(baseEnv(),
			"UPSTREAM_URL="+up.url,
			"LISTEN_ADDR="+addr,
			"ADMIN_ADDR="+admin,
			"REDIS_URL=redis://"+b.redisAddr,
			"LOG_LEVEL=warn")
		env = append(env, b.idemExtraEnv(kind, wl)...)
		switch kind { // last: over any -idem-env LOG_LEVEL
		case "info":
			env = append(env, "LOG_LEVEL=info")
		case "warn":
			env = append(env, "LOG_LEVEL=warn")
		}
		bin := b.idemBin
		if kind == "b" {
			bin = b.abBin
		}
		t.p, err = b.startProxy(kind, env, logPath, bin)
		ready = func() error { return b.get("http://" + admin + "/readyz") }
	}
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, t.p, 15*time.Second, ready); err != nil {
		t.p.stop()
		return nil, err
	}
	b.noteAffinity("proxy", t.p)
	return t, nil
}

// startProxy starts a proxy under test from a fresh copy of bin, made for
// this process and removed when it exits (not before: taskset execs it after
// Start returns). Two copies of one idemproxy binary, each kept for a whole
// run, differed by 8 to 10 % in req/s and 7 to 11 µs of CPU per first
// request, and the faster file stayed faster when the two swapped slots of an
// A/B run: code runs from the page cache's pages of its file, wherever they
// happen to lie, for as long as the file stays cached. A copy per process
// turns that into noise from round to round, which the medians take, instead
// of a bias for a whole run.
func (b *bench) startProxy(kind string, env []string, logPath, bin string, args ...string) (*proc, error) {
	dir, err := os.MkdirTemp(b.cfg.workdir, "bin-")
	if err != nil {
		return nil, err
	}
	// The same base name: the kernel's comm (a profiler's process name) is the
	// file's.
	cp := filepath.Join(dir, filepath.Base(bin))
	if err := copyFile(cp, bin); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p, err := b.procs.startOwning(dir, kind, b.cfg.cpus["proxy"], env, logPath, cp, args...)
	if err != nil {
		_ = os.RemoveAll(dir)
	}
	return p, err
}

// copyFile copies the executable src to dst.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

// idemExtraEnv is what idemproxy's environment gets beyond the bench's own
// when it runs as target kind in workload wl: -idem-env (with the
// workload's routes), and for build B -ab-env after it.
func (b *bench) idemExtraEnv(kind, wl string) []string {
	env := idemEnvFor(b.cfg.idemEnv, wl)
	if kind == "b" {
		env = append(env, b.cfg.abEnv...)
	}
	return env
}

// get succeeds on a 2xx answer.
func (b *bench) get(url string) error {
	resp, err := b.client.Get(url)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

const benchBody = `{"amount":1000,"currency":"eur","customer":"cus_bench","description":"benchmark order"}`

type postResult struct {
	status   int
	replayed bool
	n        int64
}

// post sends the default workload's request with key (none when empty) to url.
func (b *bench) post(ctx context.Context, url, key string) (postResult, error) {
	return b.postAs(ctx, url, "", key)
}

// postAs sends workload wl's request with key to url: for the event
// workloads, eventBody(key), with the key in Idempotency-Key only if the
// workload sends it there; for the others, benchBody with the key (none when
// empty).
func (b *bench) postAs(ctx context.Context, url, wl, key string) (postResult, error) {
	body, header := benchBody, key != ""
	if ew, ok := eventWorkloads[wl]; ok {
		body, header = eventBody(key), ew.keyHeader
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return postResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if header {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return postResult{}, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return postResult{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", n: n}, err
}
