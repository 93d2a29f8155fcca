package main

import (
	"net/http"

	"github.com/rs/xid"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/proxy"
)

// withRequestLog gives every request a new id, sent as X-Request-Id, and a
// logger that carries it as request_id, which hlog.FromRequest returns.
// It does what hlog.NewHandler and hlog.RequestIDHandler do together in one
// request copy instead of two and with four allocations fewer (every request
// pays it, replays included; issue 14); nothing reads the id from the
// context, so it is not stored there.
func withRequestLog(logger zerolog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := xid.New().String()
		l := logger.With().Str("request_id", id).Logger()
		w.Header()[proxy.RequestIDHeader] = []string{id}
		next.ServeHTTP(w, r.WithContext(l.WithContext(r.Context())))
	})
}
