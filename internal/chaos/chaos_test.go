package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	flagMatrix   = flag.Bool("chaos.matrix", false, "run the chaos matrix (make chaos)")
	flagCI       = flag.Bool("chaos.ci", false, "run only the CI slice of the matrix")
	flagSeed     = flag.Uint64("chaos.seed", 1, "seed of every random choice")
	flagDuration = flag.Duration("chaos.duration", 15*time.Second, "fault phase of each row")
	flagRows     = flag.String("chaos.rows", "", "run only these rows: comma-separated names (proxy-kill/expire), or regexps")
	flagOut      = flag.String("chaos.out", "", "directory for each row's history (JSON) and matrix.md")
)

// selectRows keeps the rows that spec names: a comma-separated list whose
// items are row names, or else regexps matched against them.
func selectRows(rows []Row, spec string) ([]Row, error) {
	var keep []Row
	for _, item := range strings.Split(spec, ",") {
		exact := false
		for _, r := range rows {
			if r.Name() == item {
				keep, exact = append(keep, r), true
			}
		}
		if exact {
			continue
		}
		re, err := regexp.Compile(item)
		if err != nil {
			return nil, err
		}
		n := len(keep)
		for _, r := range rows {
			if re.MatchString(r.Name()) {
				keep = append(keep, r)
			}
		}
		if len(keep) == n {
			return nil, fmt.Errorf("-chaos.rows: %q names no row", item)
		}
	}
	return keep, nil
}

// Matrix is every row `make chaos` runs, in order.
func Matrix() []Row {
	clean := func(fault, onUnknown string) Row {
		return Row{Fault: fault, Topology: "standalone", OnUnknown: onUnknown, Expect: "clean"}
	}
	var rows []Row
	rows = append(rows, clean("none", "expire"))
	for _, f := range []string{"proxy-kill", "proxy-pause"} {
		rows = append(rows, clean(f, "expire"), clean(f, "hold"))
	}
	for _, u := range []string{"expire", "hold"} {
		r := clean("redis-restart", u)
		r.AOF = true
		rows = append(rows, r)
	}
	for _, f := range []string{"redis-latency", "redis-blackhole"} {
		rows = append(rows, clean(f, "expire"), clean(f, "hold"))
	}
	rows = append(rows, clean("redis-reset", "expire"), clean("redis-trickle", "expire"))
	for _, f := range []string{"upstream-latency", "upstream-blackhole", "upstream-reset"} {
		rows = append(rows, clean(f, "expire"), clean(f, "hold"))
	}
	rows = append(rows, clean("upstream-trickle", "expire"))
	rows = append(rows,
		Row{Fault: "sentinel-failover", Topology: "sentinel", OnUnknown: "expire", Expect: "async"},
		Row{Fault: "sentinel-failover", Topology: "sentinel", OnUnknown: "expire", Wait: 1, Expect: "clean"},
		Row{Fault: "cluster-master-kill", Topology: "cluster", OnUnknown: "expire", Expect: "async"},
	)
	mutant := clean("proxy-pause", "expire")
	// Twice the fault phase: more paused proxies come back to keys taken
	// over meanwhile, so the catch does not hang on one or two of them.
	mutant.Mutant, mutant.Expect, mutant.Stretch = true, "mutant", 2
	return append(rows, mutant)
}

// ciUpstream is DefaultUpstream, 5xx answers included: a takeover whose
// forward is answered 5xx must be announced too.
var ciUpstream = func() *UpstreamProfile { p := DefaultUpstream; return &p }()

// ciPauseUpstream is PauseUpstream without 5xx answers.
var ciPauseUpstream = func() *UpstreamProfile { p := PauseUpstream; p.Fail5xx = 0; return &p }()

// CISlice is the part of the matrix .ci/run runs, with a fixed seed.
func CISlice() []Row {
	var rows []Row
	for _, r := range Matrix() {
		switch r.Name() {
		case "proxy-pause/expire", "proxy-kill/expire", "redis-restart/hold", "redis-blackhole/expire":
			r.Upstream = ciUpstream
			if r.Fault == "proxy-pause" {
				r.Upstream = ciPauseUpstream
			}
			rows = append(rows, r)
		}
	}
	return rows
}

var (
	buildOnce sync.Once
	buildDir  string
	built     string
	buildErr  error
)

// TestMain removes the binary the tests built, once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binary builds the idemproxy binary of this module once per test binary.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, buildErr = os.MkdirTemp("", "idemproxy-chaos-bin-"); buildErr != nil {
			return
		}
		built, buildErr = buildBinary(root, filepath.Join(buildDir, "idemproxy"))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// TestMatrix runs the matrix (or its CI slice) and prints it. Skipped
// unless -chaos.matrix or -chaos.ci is given: `make chaos`.
func TestMatrix(t *testing.T) {
	if !*flagMatrix && !*flagCI {
		t.Skip("the chaos matrix runs with -chaos.matrix (make chaos) or -chaos.ci")
	}
	opts := DefaultOptions()
	opts.Seed, opts.Duration, opts.Out = *flagSeed, *flagDuration, *flagOut
	opts.Bin = binary(t)
	rows := Matrix()
	if *flagCI {
		rows = CISlice()
	}
	if *flagRows != "" {
		var err error
		if rows, err = selectRows(rows, *flagRows); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rows {
		if r.Mutant && opts.MutantBin == "" {
			root, err := moduleRoot()
			if err != nil {
				t.Fatal(err)
			}
			if opts.MutantBin, err = BuildMutant(root, t.TempDir()); err != nil {
				t.Fatal(err)
			}
		}
	}
	fmt.Printf("chaos: SEED=%d DURATION=%s, %d rows, %d proxies, LOCK_TTL=%s, UPSTREAM_TIMEOUT=%s\n",
		opts.Seed, opts.Duration, len(rows), opts.Proxies, opts.LockTTL, opts.UpstreamTimeout)
	var results []RowResult
	failed := false
	for _, r := range rows {
		var res RowResult
		t.Run(strings.NewReplacer("/", "_", ":", "_").Replace(r.Name()), func(t *testing.T) {
			res = RunRow(t, r, opts)
			fmt.Printf("chaos: %-34s %6.1fs  ops %5d execs %5d dup %d announced %d silent, wrong %d, changed %d, unanswered %d, held %d: %s\n",
				r.Name(), res.Elapsed.Seconds(), res.Report.Ops, res.Report.Execs, res.Report.Announced, res.Report.Silent,
				res.Report.Wrong, res.Report.Changed, res.Report.Unanswered, res.Report.Held, res.Verdict)
			for i, f := range res.Report.Findings {
				if f.Kind == "duplicate-announced" && i >= 3 {
					continue
				}
				if i >= 25 {
					fmt.Printf("chaos:     … %d more findings\n", len(res.Report.Findings)-i)
					break
				}
				fmt.Printf("chaos:     %s\n", f)
			}
			if strings.HasPrefix(res.Verdict, "FAIL") {
				t.Errorf("%s: %s", r.Name(), res.Verdict)
			}
		})
		if res.Row.Fault == "" {
			failed = true
			continue
		}
		results = append(results, res)
	}
	matrix := FormatMatrix(results)
	fmt.Printf("\nchaos matrix, SEED=%d DURATION=%s\n\n%s\n", opts.Seed, opts.Duration, matrix)
	if *flagOut != "" {
		_ = os.MkdirAll(*flagOut, 0o755)
		_ = os.WriteFile(filepath.Join(*flagOut, "matrix.md"), []byte(matrix), 0o644)
	}
	if failed {
		t.Error("a row did not complete")
	}
}

func TestSelectRows(t *testing.T) {
	for _, tt := range []struct{ spec, want string }{
		{"sentinel-failover/expire", "sentinel-failover/expire"},
		{"proxy-kill/hold,redis-reset/expire", "proxy-kill/hold redis-reset/expire"},
		{"^proxy-pause", "proxy-pause/expire proxy-pause/hold"},
		{"MUTANT", "MUTANT:proxy-pause/expire"},
	} {
		rows, err := selectRows(Matrix(), tt.spec)
		var names []string
		for _, r := range rows {
			names = append(names, r.Name())
		}
		if err != nil || strings.Join(names, " ") != tt.want {
			t.Errorf("selectRows(%q) = %v, %v; want %s", tt.spec, names, err, tt.want)
		}
	}
	if _, err := selectRows(Matrix(), "no-such-row"); err == nil {
		t.Errorf("a spec naming no row should be an error")
	}
}

// The mutation that makes the broken build must still apply to the
// scripts as they are: when complete.lua's record format changes, this
// fails and names the constant to update.
func TestRemoveCompletionFenceApplies(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "scripts", "complete.lua"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := RemoveCompletionFence(string(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) >= len(src) || !strings.Contains(out, "chaos mutant") {
		t.Errorf("the mutation changed nothing")
	}
	if _, err := RemoveCompletionFence(out); err == nil {
		t.Errorf("a second mutation of the mutated script should fail: the check is gone")
	}
}

// A tiny run of the harness in the normal suite: two proxies, a proxy
// SIGKILL or two, three seconds, checked clean.
func TestHarnessSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and the built binary")
	}
	opts := DefaultOptions()
	opts.Bin = binary(t)
	opts.Proxies = 2
	opts.Duration = 3 * time.Second
	opts.Workload.Clients = 4
	row := Row{Fault: "proxy-kill", Topology: "standalone", OnUnknown: "expire", Expect: "clean", Upstream: ciUpstream}
	res := RunRow(t, row, opts)
	t.Logf("smoke: %+v", res.Report)
	if res.Report.Ops == 0 || res.Report.Execs == 0 || strings.HasPrefix(res.Verdict, "FAIL") {
		t.Errorf("smoke run: verdict %s, report %+v\n%v", res.Verdict, res.Report, res.Report.Findings)
	}
	if res.Report.Faults == 0 {
		t.Errorf("no fault was injected in %v", opts.Duration)
	}
}
