package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
)

// go-redis retries a failed command 3 times and a failed dial 5 times, with
// backoff: with Redis down, a fail-closed 503 would take about 2s. One retry
// of each rides out a dropped connection and still answers within
// milliseconds when Redis is gone.
const (
	maxRetries    = 1
	dialerRetries = 1
)

// defaultReadTimeout is go-redis's read timeout when none is set.
const defaultReadTimeout = 5 * time.Second

// waitReadTimeout is the read timeout the Redis client needs with
// REDIS_WAIT_REPLICAS: WAIT holds the connection for up to
// REDIS_WAIT_TIMEOUT, and a read timeout that ends first turns every claim
// into an I/O error instead of "not acknowledged by enough replicas". So it
// is at least REDIS_WAIT_TIMEOUT + 1s. Zero (go-redis's default) without WAIT.
func (c *Config) waitReadTimeout() time.Duration {
	if c.RedisWaitReplicas <= 0 {
		return 0
	}
	return max(defaultReadTimeout, c.RedisWaitTimeout+time.Second)
}

// store is the Redis the proxy talks to, and how to check and close it.
type store struct {
	client   redis.UniversalClient
	embedded *miniredis.Miniredis
	close    func()
	// explain, when set, turns a failure into what an operator can act on
	// (Sentinel: a REDIS_MASTER_NAME that no sentinel monitors).
	explain func(context.Context, error) error
}

// openRedis connects to the configured Redis, or starts the embedded one.
// It does not wait for Redis to answer: an unreachable Redis is reported by
// /readyz and handled per FAIL_MODE, not by refusing to start.
func openRedis(cfg *Config, logger zerolog.Logger, guard *breakers) (*store, error) {
	return openRedisBounded(cfg, logger, 0, guard)
}

// openRedisBounded is openRedis for a command that must end within limit
// (idemproxy keys --timeout), whatever Redis does: the clients honour the
// context's deadline on the socket (ContextTimeoutEnabled), and no dial,
// read or write waits longer than limit, the handshake's included (it
// does not always get the caller's context). limit <= 0: the proxy's own
// settings.
//
// guard, when set, puts a Breaker on every server (see breakers).
func openRedisBounded(cfg *Config, logger zerolog.Logger, limit time.Duration, guard *breakers) (*store, error) {
	redis.SetLogger(redisLogger{logger}) // go-redis's own lines as JSON, not plain text on stderr
	readTimeout := cfg.waitReadTimeout()
	bound := func(ctxTimeout *bool, timeouts ...*time.Duration) {
		if limit <= 0 {
			return
		}
		*ctxTimeout = true
		for _, t := range timeouts {
			if *t <= 0 || *t > limit { // 0: go-redis's default (seconds); negative: none
				*t = limit
			}
		}
	}
	switch {
	case cfg.RedisMode == "sentinel" || cfg.RedisMode == "cluster":
		// One set of options for both modes, the way go-redis's own
		// UniversalOptions derives each mode's.
		u := &redis.UniversalOptions{
			Addrs:      cfg.RedisAddrs,
			MasterName: cfg.RedisMasterName,
			Username:   cfg.RedisUsername,
			Password:   cfg.RedisPassword,
			// The sentinels' own credentials (requirepass or an ACL user
			// on the sentinels), distinct from the data nodes'.
			SentinelUsername: cfg.RedisSentinelUsername,
			SentinelPassword: cfg.RedisSentinelPassword,
			MaxRetries:       maxRetries,
			DialerRetries:    dialerRetries,
			ReadTimeout:      readTimeout,
		}
		bound(&u.ContextTimeoutEnabled, &u.DialTimeout, &u.ReadTimeout, &u.WriteTimeout)
		u.TLSConfig = redisTLS(cfg)
		if cfg.RedisMode == "sentinel" {
			c := redis.NewFailoverClient(u.Failover())
			if guard != nil {
				// FailoverOptions has no Limiter: it is set on the client's
				// own options before the client is used.
				p := u.Failover()
				p.PoolSize, p.MaxRetries, p.ContextTimeoutEnabled = 1, -1, true
				p.DialTimeout, p.ReadTimeout, p.WriteTimeout = breakerProbeTimeout, breakerProbeTimeout, breakerProbeTimeout
				guard.guard(c.Options(), "master "+cfg.RedisMasterName, redis.NewFailoverClient(p), nil)
			}
			explain := func(ctx context.Context, err error) error { return explainSentinel(ctx, cfg, err) }
			return &store{client: c, close: closeAll(guard, c), explain: explain}, nil
		}
		co := u.Cluster()
		var c *redis.ClusterClient
		if guard != nil {
			co.NewClient = func(opt *redis.Options) *redis.Client {
				addr := opt.Addr
				// A node that failed over away is no longer a master: its
				// Breaker retires instead of counting it unreachable.
				inUse := func(ctx context.Context) bool {
					ctx, cancel := context.WithTimeout(ctx, breakerProbeTimeout)
					defer cancel()
					var master atomic.Bool
					err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
						if m.Options().Addr == addr {
							master.Store(true)
						}
						return nil
					})
					return err != nil || master.Load()
				}
				guard.guard(opt, addr, redis.NewClient(probeOptions(*opt)), inUse)
				return redis.NewClient(opt)
			}
		}
		// go-redis re-reads the slot map on MOVED/ASK, or when it is older
		// than this (default 60s). A dead master sends no MOVED, so with the
		// default a shard stays unreachable for a minute after the cluster
		// has failed over in two seconds.
		co.ClusterStateReloadInterval = time.Second
		c = redis.NewClusterClient(co)
		return &store{client: c, close: closeAll(guard, c)}, nil
	case cfg.RedisURL != "":
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL=%q: malformed URL%s", redactURL(cfg.RedisURL), safeReason(cfg.RedisURL, err))
		}
		// URL query parameters (max_retries=, dial_timeout=, pool_size=,
		// read_timeout=) win; loadConfig refused a read_timeout= that WAIT
		// cannot finish within.
		if opt.MaxRetries == 0 {
			opt.MaxRetries = maxRetries
		}
		if opt.DialerRetries == 0 {
			opt.DialerRetries = dialerRetries
		}
		if opt.ReadTimeout == 0 {
			opt.ReadTimeout = readTimeout
		}
		bound(&opt.ContextTimeoutEnabled, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout)
		if guard != nil {
			guard.guard(opt, opt.Addr, redis.NewClient(probeOptions(*opt)), nil)
		}
		c := redis.NewClient(opt)
		return &store{client: c, close: closeAll(guard, c)}, nil
	}
	logger.Debug().Msg("REDIS_URL is empty: starting the embedded Redis")
	return startEmbedded()
}

// closeAll closes the Breakers' probes (guard may be nil), then c.
func closeAll(guard *breakers, c redis.UniversalClient) func() {
	return func() {
		if guard != nil {
			guard.close()
		}
		_ = c.Close()
	}
}

// startEmbedded runs miniredis on a loopback port. miniredis never expires
// keys by itself, and a claim that never expires would lock its key forever,
// so a ticker advances its clock with the real one.
//
// Any local process can connect to a loopback port, and whoever talks to
// this Redis can read every record and forge the answer a retry replays. So
// it requires a password drawn from crypto/rand at each start, known only
// to this process, and its address is not logged. The warning that it is
// embedded is logged once, by the readiness check (configWarnings).
func startEmbedded() (*store, error) {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("start embedded Redis: generate its password: %w", err)
	}
	password := hex.EncodeToString(secret[:])
	mr := miniredis.NewMiniRedis()
	mr.RequireAuth(password)
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Password: password})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { advanceClock(ctx, mr, 50*time.Millisecond) })
	return &store{client: c, embedded: mr, close: func() {
		cancel()
		wg.Wait()
		_ = c.Close()
		mr.Close()
	}}, nil
}

func advanceClock(ctx context.Context, mr *miniredis.Miniredis, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			mr.FastForward(now.Sub(last))
			last = now
		}
	}
}

// scripter is what the claim scripts run on. By default it is go-redis's
// automatic pipeliner: the scripts of concurrent requests are batched into
// one write and one read on a connection, which under load halves the
// client's and Redis's CPU per request (make bench). REDIS_AUTOPIPELINE=false
// sends each script on its own pooled connection instead. With
// REDIS_WAIT_REPLICAS the plain client is used: WAIT must follow the script
// on the connection that ran it. So it is with Cluster (see below).
func (s *store) scripter(cfg *Config) (redis.Scripter, error) {
	if !cfg.RedisAutoPipeline || cfg.RedisWaitReplicas > 0 {
		return s.client, nil
	}
	if _, cluster := s.client.(*redis.ClusterClient); cluster {
		// Its batches span slot ranges of several masters, and a batch ends
		// when its slowest node answers: one stalled master would stall the
		// claims of every shard. Plain pooled connections per node instead.
		return s.client, nil
	}
	c, ok := s.client.(interface {
		AutoPipelineWithOptions(*redis.AutoPipelineOptions) (*redis.AutoPipeliner, error)
	})
	if !ok {
		return s.client, nil
	}
	ap, err := c.AutoPipelineWithOptions(claim.AutoPipelineOptions())
	if err != nil {
		return nil, fmt.Errorf("REDIS_AUTOPIPELINE: %w", err)
	}
	return ap, nil
}

// How a Breaker probes a Redis it found unreachable: requests go back to
// Redis at most this long after it answers again.
const (
	breakerProbeEvery   = 500 * time.Millisecond
	breakerProbeTimeout = time.Second
)

// breakers puts a claim.Breaker on every Redis server the proxy talks to
// (the standalone server or the Sentinel master; each Cluster node on its
// own), so that once one is found unreachable keyed requests fail at once
// (503, or a forward with FAIL_MODE=open) instead of each waiting out a dial
// or read timeout, until it answers a probe. Each probe goes through a
// client of its own, without a Breaker. The embedded Redis runs in this
// process and needs none; idemproxy keys runs without them.
type breakers struct {
	logger zerolog.Logger
	down   atomic.Int64 // servers being failed fast: idemproxy_redis_unreachable
	mu     sync.Mutex
	closes []func()
}

// guard makes opt's client guarded by a new Breaker; probe is the client
// the Breaker asks whether the server answers.
func (bs *breakers) guard(opt *redis.Options, name string, probe redis.UniversalClient, inUse func(context.Context) bool) {
	b := claim.NewBreaker(func(ctx context.Context) error { return probe.Ping(ctx).Err() }, breakerProbeEvery, breakerProbeTimeout,
		func(open bool, cause error) {
			if open {
				bs.down.Add(1)
				bs.logger.Warn().Err(cause).Str("redis", name).
					Msg("Redis unreachable: keyed requests get 503 (or are forwarded, FAIL_MODE=open) at once, without asking it, until it answers a probe (every 500ms)")
				return
			}
			bs.down.Add(-1)
			bs.logger.Info().Str("redis", name).Msg("Redis answers again: keyed requests are claimed again")
		})
	if inUse != nil {
		b.InUse(inUse)
	}
	opt.Limiter = b
	bs.mu.Lock()
	bs.closes = append(bs.closes, func() { b.Close(); _ = probe.Close() })
	bs.mu.Unlock()
}

// probeOptions are the options of a Breaker's probe client: one
// connection, no retry, every wait bounded by the probe's timeout.
func probeOptions(opt redis.Options) *redis.Options {
	opt.Limiter, opt.PoolSize, opt.MinIdleConns, opt.MaxRetries, opt.DialerRetries = nil, 1, 0, -1, 1
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = breakerProbeTimeout, breakerProbeTimeout, breakerProbeTimeout
	opt.ContextTimeoutEnabled = true
	return &opt
}

// register exports idemproxy_redis_unreachable.
func (bs *breakers) register(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_redis_unreachable",
		Help: "Redis servers (with Cluster, nodes) this replica found unreachable and fails keyed requests against at once, until one answers a probe (every 500ms).",
	}, func() float64 { return float64(bs.down.Load()) }))
}

func (bs *breakers) close() {
	bs.mu.Lock()
	closes := bs.closes
	bs.mu.Unlock()
	for _, c := range closes {
		c()
	}
}

// ping checks that Redis answers. With Cluster every master must answer:
// while a shard has no master, its keys get 503, and the cluster reports
// itself down anyway (cluster-require-full-coverage).
func (s *store) ping(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("master %s: %w", c.Options().Addr, err)
			}
			return nil
		})
	}
	err := s.client.Ping(ctx).Err()
	if err != nil && s.explain != nil {
		err = s.explain(ctx, err)
	}
	return err
}

// sentinelClient is a client of one sentinel of REDIS_ADDRS, with the
// sentinels' own credentials, for a single question: no retry, and every
// dial, read and write bounded by timeout and the context's deadline.
func sentinelClient(cfg *Config, addr string, timeout time.Duration) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr: addr, Username: cfg.RedisSentinelUsername, Password: cfg.RedisSentinelPassword, TLSConfig: redisTLS(cfg),
		MaxRetries: -1, DialerRetries: dialerRetries,
		ContextTimeoutEnabled: true, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
	})
}

// redisTLS is the TLS configuration of REDIS_TLS (nil without it).
func redisTLS(cfg *Config) *tls.Config {
	if !cfg.RedisTLS {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// explainSentinel: go-redis says "all sentinels specified in configuration
// are unreachable" also when every sentinel answered that it monitors no
// master of REDIS_MASTER_NAME. Asked again, the sentinels tell which: when
// some answer and none knows the name, that is the error (naming the
// variable and its value), not the network. Otherwise err as it was.
func explainSentinel(ctx context.Context, cfg *Config, err error) error {
	// Only when a sentinel answered "no such master" (go-redis's redis.Nil
	// in the joined errors): a sentinel that does not answer at all is
	// what the message says, and asking again would only take more time
	// (idemproxy keys must end within --timeout).
	if msg := err.Error(); !strings.Contains(msg, "all sentinels specified in configuration are unreachable") || !strings.Contains(msg, redis.Nil.Error()) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	answered, known := 0, 0
	for _, addr := range cfg.RedisAddrs {
		wg.Go(func() {
			sc := sentinelClient(cfg, addr, time.Second)
			defer sc.Close()
			_, gerr := sc.GetMasterAddrByName(ctx, cfg.RedisMasterName).Result()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case gerr == nil:
				answered++
				known++
			case errors.Is(gerr, redis.Nil):
				answered++
			}
		})
	}
	wg.Wait()
	if answered > 0 && known == 0 {
		// go-redis's own words ("unreachable") would say the reverse of
		// what happened: they are left out.
		return fmt.Errorf("REDIS_MASTER_NAME=%q: %d of %d sentinels of REDIS_ADDRS answered, and none monitors a master of that name (SENTINEL MASTERS lists the names they do)",
			cfg.RedisMasterName, answered, len(cfg.RedisAddrs))
	}
	return err
}

// configWarnings reads settings that weaken the guarantee. An evicted record
// lets a retry execute again, so anything but maxmemory-policy noeviction is
// reported (log, /readyz, metric). With Cluster every master is checked.
func (s *store) configWarnings(ctx context.Context) ([]string, error) {
	if s.embedded != nil {
		return []string{"store: embedded in-process Redis (REDIS_URL empty): single instance, nothing persisted. Fine for one replica; with several, each has its own keys and nothing is guaranteed"}, nil
	}
	check := func(ctx context.Context, c redis.Cmdable, where string) ([]string, error) {
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil && (claim.Unavailable(err) || ctx.Err() != nil) {
			// Redis did not answer this time: the settings are read
			// once and their warning kept, so this must not stand for
			// them. The check fails and is made again.
			return nil, fmt.Errorf("read maxmemory-policy%s: %w", where, err)
		}
		if err != nil {
			// A refusal (CONFIG renamed or denied, as managed Redis does).
			return []string{fmt.Sprintf("store: could not read maxmemory-policy%s (%v); make sure it is noeviction", where, err)}, nil
		}
		if p := v["maxmemory-policy"]; p != "noeviction" {
			return []string{fmt.Sprintf("store: maxmemory-policy is %q%s; use noeviction, or an evicted record lets a retry execute again", p, where)}, nil
		}
		return nil, nil
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var all []string
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			w, err := check(ctx, c, " on "+c.Options().Addr)
			mu.Lock()
			all = append(all, w...)
			mu.Unlock()
			return err
		})
		return all, err
	}
	return check(ctx, s.client, "")
}

// watchPurges runs s.WatchPurges on rdb until the returned close function
// is called, which then closes the store with closeStore. So `idemproxy
// keys purge` reaches this replica's replay cache.
func watchPurges(s *claim.Store, rdb redis.UniversalClient, closeStore func(), logger zerolog.Logger) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// Logged when the state changes, and again at most once a minute while
	// a failure lasts (errors carry changing local ports).
	const every = time.Minute
	failing, loggedAt := false, time.Time{}
	report := func(err error) {
		now, was := time.Now(), failing
		failing = err != nil
		switch {
		case !failing && was:
			logger.Info().Msg("purge subscription confirmed: replay cache on again, from empty")
		case failing && (!was || now.Sub(loggedAt) >= every):
			loggedAt = now
			msg := "purge subscription failed: the replay cache is off (replays are read from Redis, or follow FAIL_MODE while it is unreachable) until a new one is confirmed, so that `idemproxy keys purge` is never missed"
			switch e := err.Error(); {
			case strings.Contains(e, "NOPERM") && strings.Contains(e, "publish its probe"):
				msg += "; give the proxy's Redis user PUBLISH on the channel (ACL SETUSER <user> +publish &<KEY_PREFIX>purge)"
			case strings.Contains(e, "NOPERM"):
				msg += "; give the proxy's Redis user the channel (ACL SETUSER <user> &<KEY_PREFIX>purge)"
			}
			logger.Error().Err(err).Msg(msg)
		}
	}
	go func() {
		defer close(done)
		_ = s.WatchPurges(ctx, rdb, report)
	}()
	return func() {
		cancel()
		t := time.NewTimer(purgeWatchStopWait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C: // stalled: go on closing; the watch ends when go-redis gives up
		}
		closeStore()
	}
}
