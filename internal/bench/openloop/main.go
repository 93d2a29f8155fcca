// Command openloop is the fixed-rate load generator of the idemproxy
// benchmark; the driver internal/bench/run builds it and runs it under
// taskset on the load generator's cpu, where wrk runs in the closed-loop
// rounds.
//
// It sends POST requests to -url at -rate requests per second with the
// vegeta library, open loop: a request is sent when its time comes, whether
// or not earlier ones were answered (vegeta starts another worker when all
// are busy), and its latency runs from that moment, so a slow server cannot
// slow the load down and hide its own queue. Every request carries a fresh
// Idempotency-Key (-key-prefix, the phase and a counter).
//
// It runs -warmup at the rate first, prints "MEASURE" on a line of its own
// (the driver takes its cpu snapshots then), runs -duration at the rate on
// the same connections, and prints one line "OPENLOOP {json}" with exact
// latency quantiles of the measured requests (vegeta's own are estimates).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Result is the OPENLOOP line; the driver decodes it.
type Result struct {
	Requests   uint64         `json:"requests"`
	Rate       float64        `json:"rate"`       // requests sent per second (vegeta's Metrics.Rate)
	Throughput float64        `json:"throughput"` // successful answers per second, waiting for the last included
	Success    float64        `json:"success"`    // share of answers with status 2xx or 3xx
	DurationUs int64          `json:"duration_us"`
	P50Us      int64          `json:"p50_us"`
	P90Us      int64          `json:"p90_us"`
	P99Us      int64          `json:"p99_us"`
	MaxUs      int64          `json:"max_us"`
	MeanUs     int64          `json:"mean_us"`
	CPUUs      int64          `json:"cpu_us"` // this process's user+system time during the measured phase
	Codes      map[string]int `json:"codes"`  // status code -> count ("0": no answer)
	Errors     []string       `json:"errors,omitempty"`
}

func main() {
	url := flag.String("url", "", "target URL (POST)")
	rate := flag.Int("rate", 0, "requests per second")
	duration := flag.Duration("duration", 5*time.Second, "measured phase")
	warmup := flag.Duration("warmup", time.Second, "warm-up at the same rate before the measured phase (0: none)")
	prefix := flag.String("key-prefix", "ol", "Idempotency-Key prefix; keys are PREFIX-w-N (warm-up) and PREFIX-m-N")
	body := flag.String("body", `{"amount":1000}`, "request body (application/json)")
	timeout := flag.Duration("timeout", 10*time.Second, "per-request timeout (counts as a failure)")
	maxConns := flag.Int("max-conns", 2048, "at most this many connections (a request waiting for one still counts its wait)")
	flag.Parse()
	if *url == "" || *rate < 1 || *duration <= 0 || *warmup < 0 || *maxConns < 1 {
		fmt.Fprintln(os.Stderr, "openloop: need -url, -rate >= 1, -duration > 0, -warmup >= 0, -max-conns >= 1")
		os.Exit(2)
	}
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConnsPerHost: *maxConns,
			MaxConnsPerHost:     *maxConns,
			DisableCompression:  true,
		},
	}
	pace := vegeta.Rate{Freq: *rate, Per: time.Second}
	if *warmup > 0 {
		if _, err := attack(client, pace, *url, []byte(*body), *prefix+"-w", *warmup); err != nil {
			fmt.Fprintln(os.Stderr, "openloop: warm-up:", err)
			os.Exit(1)
		}
	}
	fmt.Println("MEASURE")
	cpu0 := cpuTime()
	res, err := attack(client, pace, *url, []byte(*body), *prefix+"-m", *duration)
	if err != nil {
		fmt.Fprintln(os.Stderr, "openloop:", err)
		os.Exit(1)
	}
	res.CPUUs = (cpuTime() - cpu0).Microseconds()
	line, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, "openloop:", err)
		os.Exit(1)
	}
	fmt.Printf("OPENLOOP %s\n", line)
}

// attack sends at pace for d and waits for every answer. A new Attacker per
// phase (vegeta's Attack stops its Attacker at the end); the client, and so
// its connections, are shared.
func attack(client *http.Client, pace vegeta.Pacer, url string, body []byte, prefix string, d time.Duration) (Result, error) {
	hdr := prefix + "-"
	var n atomic.Uint64
	targeter := func(t *vegeta.Target) error {
		t.Method = http.MethodPost
		t.URL = url
		t.Body = body
		t.Header = http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {hdr + strconv.FormatUint(n.Add(1), 10)},
		}
		return nil
	}
	atk := vegeta.NewAttacker(vegeta.Client(client), vegeta.MaxBody(0), vegeta.Workers(64))
	var m vegeta.Metrics
	lat := make([]time.Duration, 0, int(d.Seconds()+1)*1024)
	for r := range atk.Attack(targeter, pace, d, "") {
		m.Add(r)
		lat = append(lat, r.Latency)
	}
	m.Close()
	if m.Requests == 0 {
		return Result{}, fmt.Errorf("no request sent")
	}
	slices.Sort(lat)
	q := func(p float64) int64 { return quantile(lat, p).Microseconds() }
	errs := m.Errors
	if len(errs) > 5 {
		errs = errs[:5]
	}
	return Result{
		Requests:   m.Requests,
		Rate:       m.Rate,
		Throughput: m.Throughput,
		Success:    m.Success,
		DurationUs: m.Duration.Microseconds(),
		P50Us:      q(0.50),
		P90Us:      q(0.90),
		P99Us:      q(0.99),
		MaxUs:      lat[len(lat)-1].Microseconds(),
		MeanUs:     m.Latencies.Mean.Microseconds(),
		Codes:      m.StatusCodes,
		Errors:     errs,
	}, nil
}

// quantile returns the nearest-rank p-quantile (0 < p <= 1) of sorted, which
// must not be empty: the smallest value with at least p of all at or below it.
func quantile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted))-1e-9)) - 1 // the epsilon: p*n may round just above an integer
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
