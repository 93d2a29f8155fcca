package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseWrk(t *testing.T) {
	out := "Running 2s test @ http://127.0.0.1:1/v1/orders\n" +
		"BENCH requests=2000 duration_us=2000000 bytes=1 p50_us=1500 p90_us=2000 p99_us=9000 max_us=12000 " +
		"err_connect=1 err_read=2 err_write=0 err_status=3 err_timeout=4\n"
	got, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkResult{requests: 2000, durationUs: 2000000, p50Us: 1500, p90Us: 2000, p99Us: 9000, maxUs: 12000, errStatus: 3, errSocket: 7}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got.rps() != 1000 {
		t.Errorf("rps: got %v, want 1000", got.rps())
	}
	for _, bad := range []string{"no line\n", "BENCH requests=1\n", "BENCH requests=x duration_us=1 p50_us=1 p99_us=1\n"} {
		if _, err := parseWrk(bad); err == nil {
			t.Errorf("parseWrk(%q): no error", bad)
		}
	}
}

func TestParseStatTicks(t *testing.T) {
	// The command name may hold spaces and ')'.
	stat := "1234 (we ird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 100 1000 200\n"
	got, err := parseStatTicks([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if got != 325 {
		t.Errorf("got %d, want 325", got)
	}
	if _, err := parseStatTicks([]byte("1 (x) S 1 2")); err == nil {
		t.Error("short stat: no error")
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tidemproxy\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n"
	got, err := parseStatus(bufio.NewScanner(strings.NewReader(status)), "VmRSS", "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	if got["VmRSS"] != 10240 || got["VmHWM"] != 20480 {
		t.Errorf("got %v, want VmRSS 10240 and VmHWM 20480", got)
	}
	if _, err := parseStatus(bufio.NewScanner(strings.NewReader(status)), "VmSwap"); err == nil {
		t.Error("missing field: no error")
	}
}

func TestMedian(t *testing.T) {
	rps := func(s sample) float64 { return s.rps }
	for _, tt := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{4, 1}, 2.5}, {[]float64{5, 1, 3}, 3}} {
		var ss []sample
		for _, v := range tt.in {
			ss = append(ss, sample{rps: v})
		}
		if got := median(ss, rps); got != tt.want {
			t.Errorf("median(%v): got %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	cfg, code := parseFlags([]string{"-quick", "-only", "replay,mem", "-delays", "0,2ms", "-idem-env", "MAX_STORED_RESPONSE_BYTES=2048"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	if cfg.rounds != 1 || len(cfg.workloads) != 1 || cfg.workloads[0] != "replay" || !cfg.mem || len(cfg.delays) != 2 || cfg.maxStored != 2048 {
		t.Errorf("got %+v", cfg)
	}
	cfg, code = parseFlags([]string{"-only", "unique1k, json1k"})
	if code >= 0 || !slices.Equal(cfg.workloads, []string{"unique1k", "json1k"}) || cfg.mem {
		t.Errorf("-only unique1k,json1k: code %d, workloads %q, mem %v", code, cfg.workloads, cfg.mem)
	}
	cfg, code = parseFlags(nil)
	if code >= 0 || !slices.Equal(cfg.workloads, []string{"unique", "replay", "mixed", "open"}) || !cfg.mem ||
		cfg.openRounds != 2 || cfg.openDuration != 5*time.Second || !slices.Equal(cfg.openFracs, []float64{0.5}) {
		t.Errorf("defaults: code %d, workloads %q, mem %v, open rounds %d duration %v rates %v", code, cfg.workloads, cfg.mem, cfg.openRounds, cfg.openDuration, cfg.openFracs)
	}
	if cfg, code := parseFlags([]string{"-open-rates", "0.1, 0.25,0.5"}); code >= 0 || !slices.Equal(cfg.openFracs, []float64{0.1, 0.25, 0.5}) {
		t.Errorf("-open-rates 0.1,0.25,0.5: code %d, rates %v", code, cfg.openFracs)
	}
	cfg, code = parseFlags([]string{"-quick", "-only", "open,info", "-rounds", "3"})
	if code >= 0 || !slices.Equal(cfg.workloads, []string{"open", "info"}) || cfg.openRounds != 3 || cfg.openDuration != 2*time.Second {
		t.Errorf("-quick -only open,info -rounds 3: code %d, workloads %q, open rounds %d duration %v", code, cfg.workloads, cfg.openRounds, cfg.openDuration)
	}
	cfg, code = parseFlags([]string{"-only", "mem", "-delays", ""})
	if code >= 0 || len(cfg.workloads) != 0 || !cfg.mem || cfg.delayed() {
		t.Errorf("-only mem without delays: code %d, workloads %q, mem %v, delayed %v", code, cfg.workloads, cfg.mem, cfg.delayed())
	}
	for _, bad := range [][]string{{"-only", "nope"}, {"-delays", "x"}, {"-cpus", "wrk=0"}, {"-idem-env", "NOEQUALS"}, {"-rounds", "0"},
		{"-open-rates", "0"}, {"-open-rates", "0.1,x"}, {"-open-rates", "3"}, {"-open-rates", ""}, {"-open-duration", "500ms"}, {"-open-rounds", "-1"}, {"-only", "unique,mem", "-delays", ""},
		{"-only", "floor"}} {
		if _, code := parseFlags(bad); code != exitUsage {
			t.Errorf("parseFlags(%q): exit code %d, want %d", bad, code, exitUsage)
		}
	}
}

func TestRedisInfoField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"
	if got := redisInfoField(info, "redis_version"); got != "7.0.15" {
		t.Errorf("got %q, want 7.0.15", got)
	}
}

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|get:calls=1,usec=3,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n"
	got := parseCommandStats(info)
	if len(got) != 2 || got["evalsha"] != 12 || got["config|get"] != 1 {
		t.Errorf("got %v, want evalsha 12 and config|get 1", got)
	}
}

// eventIDs are ids as the event workloads make them: a round's tag, the
// phase, wrk's thread and a counter.
func eventIDs() []string {
	var ids []string
	for _, wl := range []string{"unique1k", "json1k"} {
		for _, d := range []time.Duration{0, 2 * time.Millisecond, 250 * time.Millisecond} {
			tag := roundTag("1a2b3c4d", d, wl, 1, "idem")
			ids = append(ids, tag+"-p-0", tag+"-probe", tag+"-w-0-1", tag+"-m-0-1234567")
		}
	}
	return ids
}

func TestEventBody(t *testing.T) {
	if n := strings.Count(eventTemplate, eventIDPlaceholder); n != 1 {
		t.Fatalf("eventTemplate holds %s %d times, want once", eventIDPlaceholder, n)
	}
	for _, id := range eventIDs() {
		if !strings.HasPrefix(id, eventKeyPrefix) {
			t.Errorf("id %q: no prefix %q", id, eventKeyPrefix)
		}
		body := eventBody(id)
		if len(body) < 1000 || len(body) > 1060 {
			t.Errorf("id %q: body of %d bytes, want about 1024", id, len(body))
		}
		var ev struct {
			ID     string `json:"id"`
			Object string `json:"object"`
			Type   string `json:"type"`
			Data   struct {
				Object struct {
					ID string `json:"id"`
				} `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &ev); err != nil {
			t.Fatalf("id %q: body is not JSON: %v\n%s", id, err, body)
		}
		if ev.ID != id || ev.Object != "event" || ev.Type != "payment_intent.succeeded" || ev.Data.Object.ID == "" || ev.Data.Object.ID == id {
			t.Errorf("id %q: got id %q, object %q, type %q, data.object.id %q", id, ev.ID, ev.Object, ev.Type, ev.Data.Object.ID)
		}
	}
	if a, b := roundTag("r", 0, "json1k", 0, "idem"), roundTag("r", 0, "unique1k", 0, "idem"); a == b {
		t.Errorf("json1k and unique1k share the tag %q", a)
	}
	if got := roundTag("r", 2*time.Millisecond, "unique", 1, "bare"); got != "r-2000us-unique-1-bare" {
		t.Errorf("roundTag of unique: got %q (the other workloads' keys must not change)", got)
	}
}

func TestIdemEnvFor(t *testing.T) {
	user := []string{"LOG_LEVEL=error", "ROUTES=POST /a off", "ROUTES=POST /b required"}
	if got := idemEnvFor(user, "unique"); !slices.Equal(got, user) {
		t.Errorf("unique: got %q, want -idem-env unchanged", got)
	}
	want := []string{"LOG_LEVEL=error", "ROUTES=POST /hooks/stripe key=json:/id; POST /b required"}
	if got := idemEnvFor(user, "json1k"); !slices.Equal(got, want) {
		t.Errorf("json1k: got %q, want %q", got, want)
	}
	want = []string{"ROUTES=POST /hooks/header"}
	if got := idemEnvFor([]string{"ROUTES="}, "unique1k"); !slices.Equal(got, want) {
		t.Errorf("unique1k with ROUTES=: got %q, want %q", got, want)
	}
	if got := idemEnvFor(nil, "json1k"); !slices.Equal(got, []string{"ROUTES=POST /hooks/stripe key=json:/id"}) {
		t.Errorf("json1k alone: got %q", got)
	}
}

// TestWorkloadLuaEvents runs workload.lua in wrk (when installed) for a second
// per event workload against a local server, which checks that every request
// is what the driver's postAs would send: eventBody of a fresh id, the id in
// Idempotency-Key only for unique1k.
func TestWorkloadLuaEvents(t *testing.T) {
	if _, err := exec.LookPath("wrk"); err != nil {
		t.Skip("wrk not installed")
	}
	dir := t.TempDir()
	script, tpl := filepath.Join(dir, "workload.lua"), filepath.Join(dir, "event.json")
	if err := os.WriteFile(script, []byte(workloadLua), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tpl, []byte(eventTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, wl := range []string{"unique1k", "json1k"} {
		t.Run(wl, func(t *testing.T) {
			ew := eventWorkloads[wl]
			var mu sync.Mutex
			seen := map[string]bool{}
			var bad []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				var ev struct {
					ID string `json:"id"`
				}
				err := json.Unmarshal(body, &ev)
				mu.Lock()
				defer mu.Unlock()
				switch key, has := r.Header.Get("Idempotency-Key"), r.Header["Idempotency-Key"] != nil; {
				case err != nil || r.Method != http.MethodPost || r.URL.Path != ew.path:
					bad = append(bad, r.Method+" "+r.URL.Path+": "+string(body))
				case string(body) != eventBody(ev.ID) || seen[ev.ID] || !strings.HasPrefix(ev.ID, "evt_t-m-"):
					bad = append(bad, "id "+ev.ID+" repeated or body not eventBody(id)")
				case ew.keyHeader && key != ev.ID, !ew.keyHeader && has:
					bad = append(bad, "id "+ev.ID+": Idempotency-Key "+key)
				}
				seen[ev.ID] = true
				w.WriteHeader(http.StatusCreated)
			}))
			defer srv.Close()
			wr := wrkRun{cpu: "0", threads: 1, conns: 2, script: script, event: tpl}
			res, out, err := wr.run(context.Background(), srv.URL+ew.path, wl, "evt_t-m", "evt_t-p", 100, time.Second)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			mu.Lock()
			defer mu.Unlock()
			if res.requests == 0 || len(seen) == 0 {
				t.Fatalf("no request:\n%s", out)
			}
			if len(bad) > 0 {
				t.Errorf("%d of %d requests wrong, first: %s", len(bad), len(seen), bad[0])
			}
		})
	}
}

func TestParseOpenLine(t *testing.T) {
	out := "MEASURE\nOPENLOOP {\"requests\":10000,\"rate\":2000.4,\"throughput\":1990.1,\"success\":0.999,\"duration_us\":4999000," +
		"\"p50_us\":310,\"p90_us\":600,\"p99_us\":2400,\"max_us\":9100,\"mean_us\":400,\"cpu_us\":1200000," +
		"\"codes\":{\"201\":9990,\"0\":6,\"502\":4},\"errors\":[\"Post: timeout\",\"502 Bad Gateway\"]}\n"
	l, err := parseOpenLine(out)
	if err != nil {
		t.Fatal(err)
	}
	if l.Requests != 10000 || l.Rate != 2000.4 || l.P99Us != 2400 || l.CPUUs != 1200000 || l.Codes["201"] != 9990 || len(l.Errors) != 2 {
		t.Errorf("got %+v", l)
	}
	s := openSampleOf(l)
	want := openSample{rate: 2000.4, throughput: 1990.1, success: 0.999, p50: 0.31, p90: 0.6, p99: 2.4, max: 9.1,
		requests: 10000, failed: 10, proxyCPUBusyPct: -1, errors: l.Errors}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("openSampleOf: got %+v, want %+v", s, want)
	}
	for _, bad := range []string{
		"MEASURE\n",
		"OPENLOOP {\n",
		`OPENLOOP {"requests":0,"duration_us":1,"p50_us":1,"p99_us":1,"max_us":1}` + "\n",
		`OPENLOOP {"requests":5,"duration_us":1,"p50_us":9,"p99_us":1,"max_us":10}` + "\n", // p99 < p50
		`OPENLOOP {"requests":5,"duration_us":1,"p50_us":1,"p99_us":2,"max_us":3,"success":1.5}` + "\n",
	} {
		if _, err := parseOpenLine(bad); err == nil {
			t.Errorf("parseOpenLine(%q): no error", bad)
		}
	}
}

func TestOpenCapacity(t *testing.T) {
	rs := []result{
		{workload: "replay", bare: []sample{{rps: 99999}}},
		{workload: "unique", bare: []sample{{rps: 9000}, {rps: 7000}, {rps: 8000}}, idem: []sample{{rps: 1}}},
	}
	if got := openCapacity(rs); got != 8000 {
		t.Errorf("got %v, want 8000 (median of bare's unique rounds)", got)
	}
	if got := openCapacity(rs[:1]); got != 0 {
		t.Errorf("without unique: got %v, want 0", got)
	}
}

func TestOpenReport(t *testing.T) {
	cfg, code := parseFlags([]string{"-only", "open", "-open-rates", "0.25,0.5"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	smp := func(rate, p50, p99 float64) openSample {
		return openSample{rate: rate, throughput: rate, success: 1, p50: p50, p90: p50 * 2, p99: p99, max: p99 * 2, cpuUs: 50, proxyCPUBusyPct: 60}
	}
	opens := []openResult{
		{delay: 0, frac: 0.5, capacity: 8000, rate: 4000,
			bare: []openSample{smp(4000, 0.30, 1.00), smp(4000, 0.40, 1.40)},
			idem: []openSample{smp(4000, 0.45, 1.30), smp(4000, 0.55, 1.70)}}, // +0.15 / +0.30: both met
		{delay: 2 * time.Millisecond, frac: 0.25, capacity: 6000, capRounds: []float64{6000}, rate: 1500,
			bare: []openSample{smp(1500, 2.3, 3.0), smp(1000, 2.3, 3.0)}, // round 2: generator behind
			idem: []openSample{{rate: 1500, throughput: 700, success: 0.9, p50: 900, p90: 1000, p99: 1200, max: 1300, errors: []string{"timeout"}}, smp(1500, 3.0, 9.0)}},
	}
	got := strings.Join(openReport(opens, cfg), "\n")
	for _, re := range []string{
		`(?m)^0\s+4000 \(50%\)\s+4000\s+0\.35/1\.20\s+\+0\.15/\+0\.30$`,
		`(?m)^2ms\s+1500 \(25%\)\s+1100\s+2\.30/3\.00\s+\+449/\+602$`,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("no match for %s in:\n%s", re, got)
		}
	}
	var vs []string
	for _, v := range openVerdicts(opens) {
		vs = append(vs, v.what+" | "+v.measured+" | "+v.outcome)
	}
	want := []string{
		"open 50%, delay 0: p50 ≤ bare + 0.2 ms | +0.15 ms | met",
		"open 50%, delay 0: p99 ≤ bare + 0.5 ms | +0.30 ms | met",
		"open 25%, delay 2ms: p50 ≤ bare + 0.2 ms | +449 ms | not valid (notes)",
		"open 25%, delay 2ms: p99 ≤ bare + 0.5 ms | +602 ms | not valid (notes)",
	}
	if !slices.Equal(vs, want) {
		t.Errorf("verdicts:\n%s\nwant:\n%s", strings.Join(vs, "\n"), strings.Join(want, "\n"))
	}
	notes := strings.Join(openNotes(opens), "\n")
	for _, want := range []string{
		"open 1500/s, delay 2ms, bare round 2: the generator sent only 1000/s",
		"open 1500/s, delay 2ms, idem round 1: answered 700/s, success 0.9000: the proxy did not keep up, so its latency is mostly queueing. Errors: timeout.",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// An idemproxy that does not keep up is a result, not an invalid round.
	o := opens[0]
	o.idem = []openSample{{rate: 4000, throughput: 2000, success: 1, p50: 500, p99: 900}}
	if v := openVerdicts([]openResult{o}); v[0].outcome != "missed by 499.45 ms" {
		t.Errorf("idemproxy behind: %+v, want missed", v[0])
	}
	if openReport(nil, cfg) != nil {
		t.Error("no open results: want no section")
	}
}

func TestInfoReport(t *testing.T) {
	s := func(cpu float64) sample { return sample{cpuUs: cpu} }
	infos := []infoResult{
		{delay: 0, warn: []sample{s(100), s(110)}, info: []sample{s(108), s(114)}}, // 111 vs 105: +5.7 %
		{delay: 2 * time.Millisecond, warn: []sample{s(100)}, info: []sample{s(111)}},
	}
	got := strings.Join(infoReport(infos), "\n")
	for _, re := range []string{
		// pairs +8.0 and +3.6 %: mean 5.8, sd 3.1, t(1) 12.706: ±27.7
		`(?m)^0\s+105\.0\s+111\.0\s+\+5\.7 %\s+\+5\.8 % \(-21\.9 to \+33\.5 %\), 2 pairs$`,
		`(?m)^2ms\s+100\.0\s+111\.0\s+\+11\.0 %\s+too few for an interval$`,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("no match for %s in:\n%s", re, got)
		}
	}
}

// The LOG_LEVEL verdict comes from the round pairs' mean and its 95 % t
// interval, so that a few noisy rounds can neither meet nor miss the target
// by chance.
func TestInfoVerdictFromRoundPairs(t *testing.T) {
	if m, h, ok := meanInterval([]float64{1, 2, 3, 4, 5}); !ok || m != 3 || math.Abs(h-2.776*math.Sqrt(2.5)/math.Sqrt(5)) > 1e-9 {
		t.Errorf("meanInterval(1..5) = %v ± %v (%v), want 3 ± %.4f", m, h, ok, 2.776*math.Sqrt(2.5)/math.Sqrt(5))
	}
	if _, h, _ := meanInterval(make([]float64, 100)); h != 0 {
		t.Errorf("no scatter: half-width %v, want 0", h)
	}
	if got := t975(100); got != 2.042 {
		t.Errorf("t975(100) = %v, want the table's last, 2.042", got)
	}
	pairs := func(changes ...float64) infoResult {
		var in infoResult
		for _, c := range changes {
			in.warn = append(in.warn, sample{cpuUs: 100})
			in.info = append(in.info, sample{cpuUs: 100 + c})
		}
		return in
	}
	for _, c := range []struct {
		in                infoResult
		measured, outcome string
	}{
		// mean 3, sd 1.58, t(4) 2.776: 1.04 to 4.96
		{pairs(1, 2, 3, 4, 5), "+3.0 %", "met"},
		{pairs(11, 12, 13, 14, 15), "+13.0 %", "missed by 3.0 %"},
		// the medians (+8) are under the limit, the interval is not
		{pairs(-10, 8, 30), "+9.3 %", "not shown (more -rounds)"},
		{pairs(9.99, 10, 10.01), "+10.0 %", "not shown (more -rounds)"},
		{pairs(4), "?", "not shown (more -rounds)"},
		{infoResult{warn: []sample{{cpuUs: 0}, {cpuUs: 100}}, info: []sample{{cpuUs: 50}, {cpuUs: 101}}}, "?", "not shown (more -rounds)"},
	} {
		v := infoVerdicts([]infoResult{c.in})[0]
		if v.what != "info log, delay 0: CPU ≤ +10 % of warn" || v.measured != c.measured || v.outcome != c.outcome {
			t.Errorf("infoVerdicts: %+v, want %s, %s", v, c.measured, c.outcome)
		}
	}
}

func TestOtherBenches(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "idemproxy-bench.t")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A process whose argv[0] looks like another driver's: a copy of sleep.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bench")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	want := fmt.Sprintf("pid %d: %s", cmd.Process.Pid, bin)
	if got := otherBenches("/tmp/idemproxy-bench.elsewhere"); !slices.Contains(got, want) {
		t.Errorf("another driver's workdir: got %q, want it to hold %q", got, want)
	}
	if got := otherBenches(dir); slices.Contains(got, want) {
		t.Errorf("our own workdir: got %q, want %q left out", got, want)
	}
}

func TestParseRedisCounters(t *testing.T) {
	info := "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:427111\r\ninstantaneous_ops_per_sec:0\r\n" +
		"total_reads_processed:31669\r\n\r\n# Memory\r\nused_memory:1043840\r\nused_memory_human:1019.38K\r\n\r\n" +
		"# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n\r\n" +
		"# Keyspace\r\ndb0:keys=4000,expires=3999,avg_ttl=86395716\r\n"
	got, err := parseRedisCounters(info)
	if err != nil {
		t.Fatal(err)
	}
	if got.calls["evalsha"] != 12 || got.memory != 1043840 || got.keys != 4000 {
		t.Errorf("got %+v", got)
	}
	if got, err := parseRedisCounters("total_reads_processed:1\r\ntotal_commands_processed:1\r\nused_memory:5\r\n"); err != nil || got.keys != 0 {
		t.Errorf("an empty db0 (no keyspace line): got %+v, %v; want 0 keys and no error", got, err)
	}
	if _, err := parseRedisCounters("# Stats\r\ntotal_commands_processed:1\r\n"); err == nil {
		t.Error("no used_memory: no error")
	}
}

func TestKeyBytesLine(t *testing.T) {
	ss := []sample{{redisKeyBytes: 1100}, {redisKeyBytes: 1112.4}, {redisKeyBytes: 1300}}
	if got, want := keyBytesLine(ss), "; 1112 B of Redis memory per new key"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := keyBytesLine([]sample{{}, {}}); got != "" {
		t.Errorf("no keys added (replays): got %q, want none", got)
	}
}

func TestRoundOrder(t *testing.T) {
	if got := roundOrder(0, false); !slices.Equal(got, []string{"bare", "idem"}) {
		t.Errorf("round 0: %q", got)
	}
	if got := roundOrder(1, false); !slices.Equal(got, []string{"idem", "bare"}) {
		t.Errorf("round 1: %q", got)
	}
	// With the third target, each goes first, second and third once in
	// three rounds (the usual -rounds 3) and twice in six; over six rounds
	// each of any two goes before the other three times; every round has all
	// three.
	pos := map[string][]int{}
	before := map[[2]string]int{}
	for r := range 6 {
		o := roundOrder(r, true)
		if len(o) != 3 || !slices.Contains(o, "bare") || !slices.Contains(o, "idem") || !slices.Contains(o, "b") {
			t.Fatalf("round %d: %q", r, o)
		}
		for i, k := range o {
			pos[k] = append(pos[k], i)
			for _, l := range o[i+1:] {
				before[[2]string{k, l}]++
			}
		}
	}
	for _, k := range []string{"bare", "idem", "b"} {
		p3 := slices.Sorted(slices.Values(pos[k][:3]))
		p6 := slices.Sorted(slices.Values(pos[k]))
		if !slices.Equal(p3, []int{0, 1, 2}) || !slices.Equal(p6, []int{0, 0, 1, 1, 2, 2}) {
			t.Errorf("%s at positions %v over six rounds, want each of 0, 1, 2 once in the first three and twice in six", k, pos[k])
		}
	}
	for pair, n := range before {
		if n != 3 {
			t.Errorf("%s before %s in %d rounds of six, want 3", pair[0], pair[1], n)
		}
	}
	// A round's order is its own: changing it changes no other round's.
	roundOrder(0, true)[0] = "x"
	if roundOrder(6, true)[0] != "bare" {
		t.Error("roundOrder hands out its table's slices")
	}
}

// -ab-bin and -ab-env add build B as a third target: B runs -ab-bin (A's
// binary without it) with -idem-env and then -ab-env, A with -idem-env only;
// without -only the closed-loop workloads run, which are the ones B has.
func TestParseFlagsAB(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemproxy-b")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, code := parseFlags([]string{"-ab-bin", bin, "-idem-env", "RECORD_FORMAT=hash", "-ab-env", "RECORD_FORMAT=string", "-ab-env", "GOGC=200"})
	if code >= 0 || !cfg.ab || cfg.abBin != bin || !slices.Equal(cfg.workloads, []string{"unique", "replay", "mixed"}) || cfg.mem {
		t.Fatalf("-ab-bin: code %d, ab %v, binary %q, workloads %q, mem %v", code, cfg.ab, cfg.abBin, cfg.workloads, cfg.mem)
	}
	b := &bench{cfg: cfg}
	if got, want := b.idemExtraEnv("b", "unique"), []string{"RECORD_FORMAT=hash", "RECORD_FORMAT=string", "GOGC=200"}; !slices.Equal(got, want) {
		t.Errorf("B's env %q, want %q", got, want)
	}
	if got, want := b.idemExtraEnv("idem", "unique"), []string{"RECORD_FORMAT=hash"}; !slices.Equal(got, want) {
		t.Errorf("A's env %q, want %q", got, want)
	}
	if cfg, code := parseFlags([]string{"-ab-env", "RECORD_FORMAT=string", "-only", "unique,json1k"}); code >= 0 || !cfg.ab || cfg.abBin != "" {
		t.Errorf("-ab-env alone: code %d, ab %v, binary %q", code, cfg.ab, cfg.abBin)
	}

	notExec := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{
		{"-ab-bin", bin, "-only", "unique,open"}, // B has no open-loop rounds
		{"-ab-bin", bin, "-only", "unique,mem"},
		{"-ab-env", "A=B", "-only", "info"},
		{"-ab-bin", bin, "-only", "unique", "-idem-bare"},
		{"-ab-bin", filepath.Join(t.TempDir(), "missing"), "-only", "unique"},
		{"-ab-bin", notExec, "-only", "unique"},
		{"-ab-bin", t.TempDir(), "-only", "unique"},
		{"-ab-bin", bin, "-ab-env", "GOGC", "-only", "unique"},
	} {
		if _, code := parseFlags(bad); code != exitUsage {
			t.Errorf("parseFlags(%q): exit code %d, want %d", bad, code, exitUsage)
		}
	}
}

// The saved report says which two builds it compared.
func TestReportNamesTheBuilds(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "idemproxy-b")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, code := parseFlags([]string{"-ab-bin", bin, "-ab-env", "RECORD_FORMAT=string", "-only", "unique", "-rounds", "1"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	b := &bench{cfg: cfg, idemBin: "/x/idem-a", abBin: bin}
	smp := sample{rps: 1000, cpuUs: 100, p50ms: 1, p99ms: 2, rssMiB: 20}
	var sb strings.Builder
	b.report(&sb, []result{{workload: "unique", bare: []sample{smp}, idem: []sample{smp}, b: []sample{smp}}}, nil, cpuTimes{}, "")
	want := fmt.Sprintf("builds: idem /x/idem-a; idem(B) %s, -ab-env [\"RECORD_FORMAT=string\"]\n", bin)
	if got := strings.Join(strings.Fields(sb.String()), " "); !strings.Contains(got, strings.TrimSpace(want)) {
		t.Errorf("report has no %q:\n%s", want, sb.String())
	}
}

// A proxy under test runs from its own copy of the binary (a fresh file for
// every process), which goes when the process exits; the original stays.
func TestStartProxyRunsACopy(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("taskset not installed") // the bench itself needs it; .ci/run does not
	}
	work := t.TempDir()
	bin := filepath.Join(t.TempDir(), "idemproxy")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nwhile :; do sleep 1; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := &bench{cfg: &config{workdir: work, cpus: map[string]string{"proxy": "0"}}}
	t.Cleanup(b.procs.stopAll)
	var seen []string
	for range 2 {
		p, err := b.startProxy("idem", nil, filepath.Join(work, "log"), bin)
		if err != nil {
			t.Fatal(err)
		}
		var cmdline []byte
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if cmdline, _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid())); bytes.Contains(cmdline, []byte("/idemproxy")) {
				break
			}
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		ran := args[len(args)-1]
		if filepath.Dir(filepath.Dir(ran)) != work || filepath.Base(ran) != "idemproxy" || slices.Contains(seen, ran) {
			t.Fatalf("process runs %q (cmdline %q); want a fresh copy named idemproxy under %s, not one of %q", ran, args, work, seen)
		}
		seen = append(seen, ran)
		p.stop()
		<-p.done
		if _, err := os.Stat(filepath.Dir(ran)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("copy's directory after exit: %v, want it gone", err)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		t.Errorf("original binary: %v", err)
	}
}

// The report is a short table of ratios and the targets, each line within
// width (a word longer than a line, such as a path, excepted), and says of
// each target whether it was met or by how much it was missed.
func TestReportShortAndJudged(t *testing.T) {
	cfg, code := parseFlags([]string{"-only", "unique,replay,open,info", "-open-rates", "0.1,0.5"})
	if code >= 0 {
		t.Fatalf("exit code %d", code)
	}
	b := &bench{cfg: cfg, started: time.Now(), affinity: map[string]string{}}
	smp := func(rps, cpu, redis, p99 float64) sample {
		return sample{rps: rps, cpuUs: cpu, redisUs: redis, p99ms: p99, otherPct: 3, wrkPct: 40}
	}
	res := []result{
		{workload: "unique", bare: []sample{smp(20000, 37, 0, 6), smp(19000, 38, 0, 6)}, idem: []sample{smp(10200, 62, 22.6, 9), smp(9700, 61, 22.6, 9)}},
		{workload: "replay", bare: []sample{smp(19000, 38, 0, 6), smp(19000, 38, 0, 6)}, idem: []sample{smp(80000, 13, 0, 2), smp(79000, 13, 0, 2)}},
		{workload: "unique", delay: 2 * time.Millisecond, bare: []sample{smp(14000, 36, 0, 6)}, idem: []sample{smp(8100, 66, 25.4, 9)}},
	}
	osmp := func(p50, p99 float64) openSample {
		return openSample{rate: 9000, throughput: 9000, success: 1, p50: p50, p99: p99}
	}
	b.opens = []openResult{{frac: 0.5, capacity: 18000, rate: 9000, bare: []openSample{osmp(0.23, 1.56)}, idem: []openSample{osmp(412.2, 721.5)}}}
	b.infos = []infoResult{{warn: []sample{{cpuUs: 80}, {cpuUs: 80}}, info: []sample{{cpuUs: 82}, {cpuUs: 83}}}}
	res[2].idem[0].otherPct, res[1].bare[1].otherPct, res[1].bare[1].errs = 45, 30, 7
	mem := []memResult{{pass: true, lines: []string{"10 MiB answer …"}}}
	var sb strings.Builder
	b.report(&sb, res, mem, cpuTimes{}, "0.10 0.20 0.30")
	got := sb.String()
	for _, l := range strings.Split(got, "\n") {
		if n := len([]rune(l)); n > width && strings.Contains(strings.TrimSpace(l), " ") {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
	for _, re := range []string{
		`(?m)^unique\s+0\s+0\.51×\s+37\.5 → 61\.5 \(1\.64×\)\s+22\.6$`,
		`(?m)^replay\s+0\s+4\.18×\s+38\.0 → 13\.0 \(0\.34×\)\s+0\.0$`,
		`(?m)^unique\s+2ms\s+0\.58×`,
		`(?m)^  unique, delay 0: req/s ≥ 0\.65× bare\s+0\.51×\s+missed by 0\.14×$`,
		`(?m)^  unique, delay 2ms: req/s ≥ 0\.70× bare\s+0\.58×\s+missed by 0\.12×$`,
		`(?m)^  unique, delay 0: Redis ≤ 15 µs/req\s+22\.6 µs\s+missed by 7\.6 µs$`,
		`(?m)^  replay, delay 0: req/s ≥ 4\.0× bare\s+4\.18×\s+met$`,
		`(?m)^  open 50%, delay 0: p99 ≤ bare \+ 0\.5 ms\s+\+720 ms\s+missed by 719\.44 ms$`,
		`(?m)^  info log, delay 0: CPU ≤ \+10 % of warn\s+\+3\.1 %\s+not shown \(more -rounds\)$`,
		`req/s ×bare per round: unique 0: 0\.51 0\.51; replay 0: 4\.21 4\.16;`,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("no match for %s in:\n%s", re, got)
		}
	}
	flat := strings.Join(strings.Fields(got), " ") // prose is wrapped
	for _, want := range []string{
		"NOTE: replay delay 0: 7 requests failed",
		"NOTE: other processes used up to 45 % of a core during the closed-loop rounds (replay delay 0 30 %, unique delay 2ms 45 %): the figures are noisy.",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if regexp.MustCompile(`(?i:issue|review)|MISSED`).MatchString(got) {
		t.Errorf("report names the work's history or shouts:\n%s", got)
	}
	if testing.Verbose() {
		t.Log("\n" + got)
	}
}
