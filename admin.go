package main

import (
	"context"
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
// the log and the idemproxy_store_unsafe gauge.
type readiness struct {
	store  *store
	logger zerolog.Logger
	unsafe prometheus.Gauge

	config []string // configuration warnings, known at start

	mu       sync.Mutex
	checked  bool
	warnings []string
}

// check pings Redis and, on the first success, reads its settings.
func (rd *readiness) check(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rd.store.ping(ctx); err != nil {
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
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: Redis unreachable: " + err.Error() + "\n"))
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
