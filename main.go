// Command idemproxy is a reverse proxy that makes retries of non-idempotent
// HTTP APIs safe: a request carrying an Idempotency-Key is executed once, and
// every retry gets the first answer back. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "dev"

// replayCacheMaxAge bounds how long a replica replays a record from memory
// after it was deleted from Redis by hand.
const replayCacheMaxAge = time.Minute

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	if err := run(ctx, os.Args, os.Environ(), os.Stdout, os.Stderr); err != nil {
		if code := exitCode(err); code == 2 {
			os.Exit(code) // a command-line mistake, already reported with the usage
		}
		fmt.Fprintln(os.Stderr, "idemproxy:", err)
		os.Exit(1)
	}
}

// run starts the proxy and blocks until ctx ends, then shuts down
// gracefully. Its error is for the operator: it names what is wrong.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports mistakes itself, with the usage
	showVersion := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, helpText)
		return nil
	case err != nil:
		return badUsage(stderr, err)
	case *showVersion:
		fmt.Fprintf(stdout, "idemproxy %s (%s)\n", version, runtime.Version())
		return nil
	case fs.Arg(0) == "keys":
		return runKeys(ctx, fs.Args()[1:], environ, stdout, stderr)
	case fs.NArg() > 0:
		return badUsage(stderr, fmt.Errorf("unknown command %q", fs.Arg(0)))
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	out := stdout
	var lb *logBuffer
	if cfg.LogFormat == "json" {
		lb = newLogBuffer(stdout, logFlushEvery, logBufferSize)
		defer func() { reportLogError(lb.Close()) }()
		out = lb
	}
	logger := newLogger(cfg, out)
	containerLimit := applyMemoryLimit(cfg, logger)
	a, err := start(cfg, logger)
	if err != nil {
		return err
	}
	// Followed whenever GOMEMLIMIT_RATIO is in force, a limit found at start
	// or not: a limit may be added in place, and a first read may fail.
	if cfg.goMemLimit == "" && cfg.GoMemLimitRatio != 0 {
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			followMemoryLimit(fctx, cfg, logger, containerMemoryLimit, containerLimit, memoryLimitEvery)
		}()
		defer func() { stop(); <-done }() // before the log buffer closes
	}
	if lb != nil {
		reportLogError(lb.Flush()) // the start line at once, not after logFlushEvery
	}
	select {
	case <-ctx.Done():
	case err := <-a.failed:
		a.shutdown(time.Second)
		return err
	}
	return a.shutdown(cfg.ShutdownTimeout)
}

func newLogger(cfg *Config, out io.Writer) zerolog.Logger {
	if cfg.LogFormat == "console" {
		out = zerolog.ConsoleWriter{Out: out, TimeFormat: time.RFC3339, NoColor: !isTerminal(out)}
	}
	return zerolog.New(out).Level(cfg.level).With().Timestamp().Logger()
}

// app is a started proxy.
type app struct {
	logger    zerolog.Logger
	store     *store
	handler   *proxy.Handler
	proxySrv  *http.Server
	adminSrv  *http.Server
	proxyAddr net.Addr
	adminAddr net.Addr
	failed    chan error
	tracing   *tracing // nil: tracing off
}

// start opens Redis, binds the listeners and serves. Listeners are bound
// before it returns, so a bad address is an error here, not in a goroutine.
func start(cfg *Config, logger zerolog.Logger) (*app, error) {
	guard := &breakers{logger: logger}
	st, err := openRedis(cfg, logger, guard)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_build_info", Help: "Build information; always 1.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	unsafe := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_store_unsafe",
		Help: "1 when the store weakens the guarantee: embedded Redis, or maxmemory-policy other than noeviction.",
	})
	ready := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_ready",
		Help: "1 when the last readiness check (at start, then /readyz, at most once a second) found Redis answering; 0 when not, and before the first check.",
	})
	reg.MustRegister(buildInfo, unsafe, ready)
	if st.embedded == nil {
		guard.register(reg)
	}
	metrics := proxy.NewMetrics(reg)

	tr, err := newTracing(cfg.tracing, logger)
	if err != nil {
		st.close()
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = tr.shutdown(context.Background())
		}
	}()
	storeOpts := []claim.Option{claim.ReplayCache(cfg.ReplayCacheBytes, replayCacheMaxAge), claim.CacheAfterSubscribed(), claim.Upstream(cfg.upstreamID), claim.Tracing(tr.provider()),
		claim.StringRecords(cfg.RecordFormat == "string")}
	if cfg.RedisWaitReplicas > 0 {
		storeOpts = append(storeOpts, claim.WaitReplicas(cfg.RedisWaitReplicas, cfg.RedisWaitTimeout))
	}
	scripter, err := st.scripter(cfg)
	if err != nil {
		st.close()
		return nil, err
	}
	cs := claim.NewStore(scripter, cfg.KeyPrefix, metrics.ObserveScript, storeOpts...)
	st.close = watchPurges(cs, st.client, st.close, logger) // idemproxy keys purge reaches this replica's replay cache
	if cfg.ReplayCacheBytes > 0 {
		// Not exported without a cache: an alert on 0 then means a purge
		// subscription that fails, never a cache turned off on purpose.
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_replay_cache_on",
			Help: "1 while this replica's replay cache answers; 0 while its purge subscription is not verified (at start, and after a failure), when replays are read from Redis. Not exported with REPLAY_CACHE_BYTES=0.",
		}, func() float64 {
			if cs.ReplayCacheOn() {
				return 1
			}
			return 0
		}))
	}
	h, err := proxy.New(cs, proxy.Options{
		Upstream:           cfg.upstream,
		KeyHeader:          cfg.IdempotencyHeader,
		Methods:            cfg.Methods,
		Default:            cfg.policy(),
		Routes:             cfg.routes,
		MaxKeyLength:       cfg.MaxKeyLength,
		MaxBodyBytes:       cfg.MaxBodyBytes,
		MaxStoredBytes:     cfg.MaxStoredResponseBytes,
		MaxBufferedBytes:   cfg.MaxBufferedBytes,
		ScopeHeaders:       cfg.ScopeHeaders,
		UpstreamTimeout:    cfg.UpstreamTimeout,
		RequestReadTimeout: cfg.RequestReadTimeout,
		DocsURL:            cfg.DocsURL,
		Logger:             logger,
		Metrics:            metrics,
		TracerProvider:     tr.provider(),
	})
	if err != nil {
		st.close()
		return nil, err
	}
	a := &app{logger: logger, store: st, handler: h, failed: make(chan error, 2), tracing: tr}
	a.proxySrv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: newStdLog(logger)}
	pl, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("LISTEN_ADDR=%q: %w", cfg.ListenAddr, err)
	}
	a.proxyAddr = pl.Addr()
	rd := &readiness{store: st, logger: logger, unsafe: unsafe, ready: ready, config: cfg.warnings}
	for _, msg := range cfg.warnings {
		logger.Warn().Msg(msg)
	}
	if cfg.AdminAddr != "" {
		al, err := net.Listen("tcp", cfg.AdminAddr)
		if err != nil {
			pl.Close()
			st.close()
			return nil, fmt.Errorf("ADMIN_ADDR=%q: %w", cfg.AdminAddr, err)
		}
		a.adminAddr = al.Addr()
		// Every read and write has a deadline here too, and an idle
		// connection is closed: whoever reaches the admin port must not
		// hold connections (file descriptors) open for ever.
		a.adminSrv = &http.Server{Handler: adminHandler(reg, rd), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: newStdLog(logger)}
		go a.serve(a.adminSrv, al)
	}
	go a.serve(a.proxySrv, pl)

	// Check Redis settings now, so the warnings reach the log at start even
	// when nothing polls /readyz; an unreachable Redis is retried by /readyz.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := rd.check(ctx); err != nil {
		logger.Error().Err(err).Msg("Redis unreachable at start; requests with a key get 503 (FAIL_MODE=closed) until it answers")
	}
	probeUpstream(context.Background(), cfg.upstream, logger)
	ev := logger.Info().Str("listen", a.proxyAddr.String()).Str("upstream", shownURL(cfg.upstream)).
		Str("redis_mode", cfg.RedisMode).Str("record_format", cfg.RecordFormat).Str("version", version)
	if a.adminAddr != nil {
		ev = ev.Str("admin", a.adminAddr.String())
	}
	if tr != nil {
		ev = ev.Str("tracing", cfg.tracing.protocol)
	}
	ev.Msg("idemproxy started")
	started = true
	return a, nil
}

func (a *app) serve(srv *http.Server, l net.Listener) {
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.failed <- fmt.Errorf("serve %s: %w", l.Addr(), err)
	}
}

// shutdown stops accepting, lets in-flight requests finish and record their
// answers (http.Server.Shutdown waits for running handlers, and a handler
// returns only after recording), then closes Redis. It fails if the timeout
// ran out first.
func (a *app) shutdown(timeout time.Duration) error {
	a.logger.Info().Str("timeout", timeout.String()).Msg("shutting down: finishing in-flight requests")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a.handler.StopWaiting()
	err := a.proxySrv.Shutdown(ctx)
	if a.adminSrv != nil {
		_ = a.adminSrv.Shutdown(ctx)
	}
	// Closing the store waits for its purge watch and Redis connections,
	// which against a Redis that stopped answering take their own timeouts:
	// never past SHUTDOWN_TIMEOUT.
	closed := make(chan struct{})
	go func() {
		a.store.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-ctx.Done():
		a.logger.Warn().Msg("Redis connections still closing when SHUTDOWN_TIMEOUT ran out; leaving them")
	}
	if terr := a.tracing.shutdown(ctx); terr != nil {
		a.logger.Warn().Err(terr).Msg("spans of the last requests may be lost")
	}
	if err != nil {
		return fmt.Errorf("SHUTDOWN_TIMEOUT=%s ran out before in-flight requests finished: %w", timeout, err)
	}
	a.logger.Info().Msg("shut down cleanly")
	return nil
}
