package main

import (
	"bufio"
	"context"
	_ "embed"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed workload.lua
var workloadLua string

// wrkResult is what workload.lua's done() prints.
type wrkResult struct {
	requests   int64
	durationUs int64
	p50Us      int64
	p90Us      int64
	p99Us      int64
	maxUs      int64
	errStatus  int64         // responses with status >= 400
	errSocket  int64         // connect + read + write + timeout
	cpu        time.Duration // wrk's own user+system time (rusage)
}

func (w wrkResult) rps() float64 {
	if w.durationUs == 0 {
		return 0
	}
	return float64(w.requests) / (float64(w.durationUs) / 1e6)
}

type wrkRun struct {
	cpu     string
	nice    int
	threads int
	conns   int
	script  string // path of workload.lua
	event   string // path of the event body template (unique1k, json1k)
}

// run drives url for d (whole seconds, at least 1) with the given workload.
func (wr wrkRun) run(ctx context.Context, url, mode, uprefix, pprefix string, nprimed int, d time.Duration) (wrkResult, string, error) {
	secs := max(1, int((d+time.Second/2)/time.Second))
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	argv := pinned(wr.nice, wr.cpu, "wrk",
		"-t", strconv.Itoa(wr.threads), "-c", strconv.Itoa(wr.conns),
		"-d", fmt.Sprintf("%ds", secs), "--timeout", "10s", "-s", wr.script, url,
		"--", mode, uprefix, pprefix, strconv.Itoa(nprimed), wr.event)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, string(out), fmt.Errorf("wrk: %w\n%s", err, out)
	}
	res, err := parseWrk(string(out))
	if err != nil {
		return wrkResult{}, string(out), fmt.Errorf("%w\n%s", err, out)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return res, string(out), nil
}

// parseWrk finds the "BENCH k=v ..." line in wrk's output.
func parseWrk(out string) (wrkResult, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "BENCH ")
		if !ok {
			continue
		}
		kv := map[string]int64{}
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return wrkResult{}, fmt.Errorf("wrk: bad field %q", f)
			}
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return wrkResult{}, fmt.Errorf("wrk: field %q: %w", f, err)
			}
			kv[k] = int64(n)
		}
		for _, k := range []string{"requests", "duration_us", "p50_us", "p99_us"} {
			if _, ok := kv[k]; !ok {
				return wrkResult{}, fmt.Errorf("wrk: no %s in %q", k, line)
			}
		}
		return wrkResult{
			requests:   kv["requests"],
			durationUs: kv["duration_us"],
			p50Us:      kv["p50_us"],
			p90Us:      kv["p90_us"],
			p99Us:      kv["p99_us"],
			maxUs:      kv["max_us"],
			errStatus:  kv["err_status"],
			errSocket:  kv["err_connect"] + kv["err_read"] + kv["err_write"] + kv["err_timeout"],
		}, nil
	}
	return wrkResult{}, fmt.Errorf("wrk: no BENCH line in output")
}
