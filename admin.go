package main

import (
	"context"
	"errors"
	"log"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// readiness answers /readyz: Redis must answer PING. The first time it does,
// the Redis settings are checked once and their warnings kept for the body,
// the log and the idemproxy_store_unsafe gauge. Every fresh check (not a
// cached answer) sets the idemproxy_ready gauge: 1 when it passed, 0 when not.
//
// The result is cached for readyCacheFor, and concurrent probes share one
// check, so a flood of /readyz cannot hammer Redis. The reason Redis is
// unreachable (its address, the dial error) goes to the log only, at most
// once per readyLogEvery while it lasts and on every change of state; the
// body says only "not ready: Redis unreachable".
type readiness struct {
	store  *store
	logger zerolog.Logger
	unsafe prometheus.Gauge
	ready  prometheus.Gauge // idemproxy_ready, set by every fresh check

	config []string // configuration warnings, known at start

	// For tests; nil means store.ping and time.Now.
	ping func(context.Context) error
	now  func() time.Time

	probe    sync.Mutex // held across a check: one PING at a time
	at       time.Time  // when the cached result was taken
	cached   bool
	lastErr  error
	down     bool      // state last logged
	loggedAt time.Time // when the unreachable state was last logged

	mu       sync.Mutex
	checked  bool
	warnings []string
}

const (
	readyCacheFor = time.Second      // a /readyz answer is reused this long
	readyLogEvery = 10 * time.Second // an ongoing outage is logged this often
)

// errNotReady is what /readyz says when Redis does not answer; the cause is
// in the log.
var errNotReady = errors.New("Redis unreachable")

func (rd *readiness) clock() time.Time {
	if rd.now != nil {
		return rd.now()
	}
	return time.Now()
}

// check returns the cached result while it is fresh, and otherwise checks
// Redis (one caller at a time; the others wait and reuse its result).
func (rd *readiness) check(ctx context.Context) ([]string, error) {
	rd.probe.Lock()
	defer rd.probe.Unlock()
	now := rd.clock()
	if rd.cached && now.Sub(rd.at) < readyCacheFor && now.Sub(rd.at) >= 0 {
		return rd.result()
	}
	w, err := rd.checkNow(ctx)
	rd.at, rd.cached, rd.lastErr = rd.clock(), true, err
	if err != nil {
		rd.ready.Set(0)
	} else {
		rd.ready.Set(1)
	}
	switch {
	case err != nil && (!rd.down || now.Sub(rd.loggedAt) >= readyLogEvery):
		rd.logger.Error().Err(err).Msg("not ready: Redis unreachable")
		rd.down, rd.loggedAt = true, now
	case err == nil && rd.down:
		rd.logger.Info().Msg("ready: Redis answers again")
		rd.down = false
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (rd *readiness) result() ([]string, error) {
	if rd.lastErr != nil {
		return nil, rd.lastErr
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.warnings, nil
}

// checkNow pings Redis and, on the first success, reads its settings. Its
// result is cached and shared by every caller, so it must not end with the
// one caller that started it: a probe that timed out or an aborted request
// would have made a healthy Redis "unreachable" for everyone.
func (rd *readiness) checkNow(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	ping := rd.ping
	if ping == nil {
		ping = rd.store.ping
	}
	if err := ping(ctx); err != nil {
		return nil, err
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if !rd.checked {
		w, err := rd.store.configWarnings(ctx)
		if err != nil {
			return nil, err
		}
		rd.checked, rd.warnings = true, append(append([]string{}, rd.config...), w...)
		if len(w) > 0 {
			rd.unsafe.Set(1)
		}
		for _, msg := range w {
			rd.logger.Warn().Msg(msg)
		}
	}
	return rd.warnings, nil
}

func adminHandler(reg *prometheus.Registry, rd *readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		warnings, err := rd.check(r.Context())
		if err != nil {
			// The cause (addresses, dial errors) is in the log, not here:
			// the admin port may be reachable by more than the kubelet.
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: " + errNotReady.Error() + "\n"))
			return
		}
		var b strings.Builder
		b.WriteString("ready\n")
		for _, msg := range warnings {
			b.WriteString("warning: " + msg + "\n")
		}
		_, _ = w.Write([]byte(b.String()))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// newStdLog adapts the logger for net/http's ErrorLog.
func newStdLog(l zerolog.Logger) *log.Logger {
	return log.New(l.With().Str("component", "http").Logger(), "", 0)
}
