// Command redisfloor measures the Redis CPU floor of idemproxy's own scripts
// (issue 14): what a first request costs Redis when nothing but the scripts
// reaches it, no HTTP, no upstream, no proxy sharing its core. The driver
// internal/bench/run builds it and runs it under taskset on the load
// generator's cpu (-only floor), and measures Redis's CPU around the window.
//
// -g goroutines each loop on a fresh key: Store.Acquire (claim.lua), then
// Lease.Complete (complete.lua) with the record of the bench upstream's 201
// answer, through the claim package as idemproxy calls it; -script strings
// the same with string records (RECORD_FORMAT=string). -script return1
// sends two EVALSHAs of "return 1" per iteration instead: the floor of any
// design with two scripts per request; -script minimal two scripts that
// write once each (SET NX GET PX, then SET PX of the record) and check
// nothing: the floor of any design that keeps a record in two scripts;
// -script commands the same two writes as plain commands, no script (SET NX
// GET EX, SET EX): the least any design writes for a first request, at
// this client's deepest batching. -script onehash runs the scripts of the
// least hash design (internal/bench/leastdesign, ceilingproxy's -design
// onehash): claim (HSETNX, PEXPIRE NX) and completion (HGET, the token
// compared, HSET, PEXPIRE), with none of idemproxy's fields or arguments;
// beside -script scripts, what idemproxy's features cost Redis with
// nothing else on its core. -client auto is go-redis's automatic
// pipelining, idemproxy's default; -client plain a pooled connection per
// call (REDIS_AUTOPIPELINE=false).
//
// It runs -warmup first, prints "MEASURE" on a line of its own (the driver
// takes its snapshots then), runs -duration more, waits for the iterations
// in flight, and prints one line "REDISFLOOR {json}".
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/bench/leastdesign"
)

// Result is the REDISFLOOR line; the driver decodes it.
type Result struct {
	Script     string `json:"script"`
	Client     string `json:"client"`
	Goroutines int    `json:"goroutines"`
	Iterations int64  `json:"iterations"` // completed in the measured window (those in flight at its end included)
	ElapsedUs  int64  `json:"elapsed_us"` // from MEASURE until the last iteration in flight ended
	CPUUs      int64  `json:"cpu_us"`     // this process's user+system time over the same span
	Errors     int64  `json:"errors"`     // failed iterations, warm-up included
	FirstError string `json:"first_error,omitempty"`
}

// The lock TTL's value does not change the scripts' work (idemproxy's
// default is 60s); the record's TTL is idemproxy's default.
var terms = claim.Terms{LockTTL: 10 * time.Second, TTL: 24 * time.Hour}

// The minimal scripts: two scripts that write once each and do nothing
// else, with only what any two-script design must send: the key, a
// 48-byte claim (token and fingerprint) and the TTL; then the key, the
// encoded record and the TTL. The claim is one SET NX GET PX, the record
// one SET PX: no token check, no state, no clock, so every correct
// two-script design does more. What they cost Redis is the floor of such
// designs on this server, not of designs that claim outside a script.
var (
	minimalClaim    = redis.NewScript("return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])")
	minimalComplete = redis.NewScript("return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])")
)

// redisClient is what an iteration sends through: scripts, or commands (-script
// commands; typed, as the AutoPipeliner batches only those). go-redis's
// Client and AutoPipeliner both are.
type redisClient interface {
	redis.Scripter
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
}

// answer is what internal/bench/upstream sends for a POST, as idemproxy
// records it: its status, its recordable headers (Go's server adds Date) and
// its ~200-byte JSON body.
func answer() *claim.Record {
	body := `{"id":"ord_000000000001","object":"order","status":"created","amount":1000,"currency":"eur",` +
		`"customer":"cus_bench","description":"benchmark order","metadata":{"source":"idemproxy-bench"},` +
		`"livemode":false}`
	return &claim.Record{
		Status: 201,
		Header: map[string][]string{
			"Content-Type":   {"application/json"},
			"Content-Length": {strconv.Itoa(len(body))},
			"Date":           {time.Now().UTC().Format(time.RFC1123)},
		},
		Body: []byte(body),
	}
}

// requestBody is the bench's POST body; only its fingerprint reaches Redis.
const requestBody = `{"amount":1000,"currency":"eur","customer":"cus_bench","description":"benchmark order"}`

// Bounds: a run that goes wrong ends on its own instead of looping on.
const (
	maxErrors     = 100           // failed iterations before the run gives up
	maxIterations = 1_000_000_000 // far beyond what a few seconds can reach
	drainTimeout  = 15 * time.Second
)

func main() {
	addr := flag.String("addr", "", "redis-server address host:port")
	g := flag.Int("g", 64, "concurrent goroutines, each a request at a time (as wrk's connections)")
	duration := flag.Duration("duration", 4*time.Second, "measured window")
	warmup := flag.Duration("warmup", time.Second, "warm-up before the measured window (0: none)")
	script := flag.String("script", "scripts", "scripts: claim.lua then complete.lua on a fresh key; strings: the same with RECORD_FORMAT=string; return1: two EVALSHAs of \"return 1\"; minimal: two scripts that write once each (SET NX GET PX, SET PX) and check nothing; commands: the same two writes as plain commands (SET NX GET EX, SET EX: go-redis sends the 24 h TTL as EX); onehash: the least hash design's two scripts (internal/bench/leastdesign)")
	client := flag.String("client", "auto", "auto: go-redis automatic pipelining (idemproxy's default); plain: pooled connections")
	prefix := flag.String("key-prefix", "idem:", "KEY_PREFIX of the records written")
	flag.Parse()
	if *addr == "" || *g < 1 || *duration <= 0 || *warmup < 0 ||
		!validScript(*script) || (*client != "auto" && *client != "plain") {
		fmt.Fprintln(os.Stderr, "redisfloor: need -addr, -g >= 1, -duration > 0, -warmup >= 0, -script "+strings.Join(scriptModes, "|")+", -client auto|plain")
		os.Exit(2)
	}
	if err := run(*addr, *g, *duration, *warmup, *script, *client, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "redisfloor:", err)
		os.Exit(1)
	}
}

// scriptModes are the -script values, in the order the usage lists them.
var scriptModes = []string{"scripts", "strings", "return1", "minimal", "commands", "onehash"}

func validScript(s string) bool { return slices.Contains(scriptModes, s) }

// run prints the REDISFLOOR line itself: before its deferred closes, so that
// the driver's snapshot at that line leaves out the connections' teardown.
func run(addr string, g int, duration, warmup time.Duration, script, client, prefix string) error {
	// The client as idemproxy makes it from REDIS_URL (redis.go openRedis).
	opt, err := redis.ParseURL("redis://" + addr)
	if err != nil {
		return err
	}
	opt.MaxRetries, opt.DialerRetries = 1, 1
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var scripter redisClient = rdb
	if client == "auto" {
		ap, err := rdb.AutoPipelineWithOptions(claim.AutoPipelineOptions()) // as idemproxy
		if err != nil {
			return fmt.Errorf("AutoPipeline: %w", err)
		}
		defer ap.Close()
		scripter = ap
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmup+duration+drainTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("PING %s: %w", addr, err)
	}
	iter, err := iteration(scripter, script, prefix)
	if err != nil {
		return err
	}
	var run [8]byte
	_, _ = rand.Read(run[:])
	runID := hex.EncodeToString(run[:])

	var done, failed atomic.Int64
	var firstErr atomic.Pointer[string]
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	var wg sync.WaitGroup
	for w := range g {
		wg.Go(func() {
			keyPrefix := runID + "-" + strconv.Itoa(w) + "-"
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := iter(ctx, keyPrefix+strconv.Itoa(i)); err != nil {
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					if failed.Add(1) >= maxErrors || ctx.Err() != nil {
						halt()
					}
					continue
				}
				if done.Add(1) >= maxIterations {
					halt()
				}
			}
		})
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()

	sleep := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-stop:
		}
	}
	sleep(warmup)
	n0, cpu0, t0 := done.Load(), cpuTime(), time.Now()
	fmt.Println("MEASURE")
	sleep(duration)
	halt()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		return fmt.Errorf("iterations still in flight %v after the window", drainTimeout)
	}
	res := Result{
		Script:     script,
		Client:     client,
		Goroutines: g,
		Iterations: done.Load() - n0,
		ElapsedUs:  time.Since(t0).Microseconds(),
		CPUUs:      (cpuTime() - cpu0).Microseconds(),
		Errors:     failed.Load(),
	}
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	if res.Errors >= maxErrors {
		return fmt.Errorf("%d failed iterations, the first: %s", res.Errors, res.FirstError)
	}
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Printf("REDISFLOOR %s\n", line)
	return nil
}

// iteration returns one iteration of the mode: what a first request asks of
// Redis.
func iteration(scripter redisClient, script, prefix string) (func(ctx context.Context, key string) error, error) {
	if !validScript(script) {
		return nil, fmt.Errorf("-script %q: want one of %s", script, strings.Join(scriptModes, ", "))
	}
	if script == "return1" {
		one := redis.NewScript("return 1")
		return func(ctx context.Context, _ string) error {
			for range 2 {
				v, err := one.Run(ctx, scripter, nil).Int64()
				if err != nil {
					return err
				}
				if v != 1 {
					return fmt.Errorf("return 1 answered %d", v)
				}
			}
			return nil
		}, nil
	}
	fp := claim.Fingerprint(sha256.Sum256([]byte(requestBody)))
	rec := answer()
	if script == "minimal" || script == "commands" {
		enc := rec.Encode()
		ttl := terms.TTL.Milliseconds()
		return func(ctx context.Context, key string) error {
			var claimed [16 + sha256.Size]byte
			_, _ = rand.Read(claimed[:16])
			copy(claimed[16:], fp[:])
			rk := claim.RecordKey(prefix, claim.NewKey(nil, key))
			if script == "commands" {
				if err := scripter.SetArgs(ctx, rk, claimed[:], redis.SetArgs{Mode: "NX", Get: true, TTL: terms.TTL}).Err(); err != redis.Nil {
					return fmt.Errorf("SET NX GET of a fresh key: %v, want nil (claimed)", err)
				}
				return scripter.SetArgs(ctx, rk, enc, redis.SetArgs{TTL: terms.TTL}).Err()
			}
			if err := minimalClaim.Run(ctx, scripter, []string{rk}, claimed[:], ttl).Err(); err != redis.Nil {
				return fmt.Errorf("minimal claim of a fresh key: %v, want nil (claimed)", err)
			}
			return minimalComplete.Run(ctx, scripter, []string{rk}, enc, ttl).Err()
		}, nil
	}
	if script == "onehash" {
		enc := rec.Encode()
		lock, ttl := terms.LockTTL.Milliseconds(), terms.TTL.Milliseconds()
		return func(ctx context.Context, key string) error {
			var tok [16]byte
			_, _ = rand.Read(tok[:])
			rk := claim.RecordKey(prefix, claim.NewKey(nil, key))
			v, err := leastdesign.ClaimHash.Run(ctx, scripter, []string{rk}, tok[:], fp[:], lock).StringSlice()
			if err != nil {
				return fmt.Errorf("onehash claim: %w", err)
			}
			if len(v) != 1 || v[0] != "claimed" {
				return fmt.Errorf("onehash claim of a fresh key answered %q, want claimed", v)
			}
			s, err := leastdesign.CompleteHash.Run(ctx, scripter, []string{rk}, tok[:], enc, ttl).Text()
			if err != nil {
				return fmt.Errorf("onehash complete: %w", err)
			}
			if s != "ok" {
				return fmt.Errorf("onehash complete of its own claim answered %q, want ok", s)
			}
			return nil
		}, nil
	}
	// The options idemproxy's Store has in the bench (main.go), at their
	// defaults: a replay cache (missed by every fresh key, as in the unique
	// workload) and an upstream id, whose hash the scripts store and
	// compare. No metrics observer and no tracing: they cost the client, not
	// Redis.
	store := claim.NewStore(scripter, prefix, nil, claim.ReplayCache(16<<20, time.Minute), claim.Upstream("http://127.0.0.1"),
		claim.StringRecords(script == "strings"))
	return func(ctx context.Context, key string) error {
		lease, replayed, err := store.Acquire(ctx, claim.NewKey(nil, key), fp, terms)
		if err != nil {
			return err
		}
		if lease == nil {
			return errors.New("a fresh key was not claimed (replayed: " + strconv.FormatBool(replayed != nil) + ")")
		}
		return lease.Complete(ctx, rec, terms.TTL)
	}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
