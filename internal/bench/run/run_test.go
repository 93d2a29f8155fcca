package main

import (
	"bufio"
	"strings"
	"testing"
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
	for _, bad := range [][]string{{"-only", "nope"}, {"-delays", "x"}, {"-cpus", "wrk=0"}, {"-idem-env", "NOEQUALS"}, {"-rounds", "0"}} {
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
