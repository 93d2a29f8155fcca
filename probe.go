package main

import (
	"context"
	"net"
	"net/url"
	"time"

	"github.com/rs/zerolog"
)

// probeTimeout bounds the start-up probe of the upstream: start is delayed
// by at most this much, and only when the upstream's address drops packets.
const probeTimeout = time.Second

// probeUpstream opens one TCP connection to the upstream, so that a proxy
// started in front of nothing says so at once rather than with a 502 per
// request. It only warns: upstreams may come up after the proxy. It reports
// whether something answered.
func probeUpstream(ctx context.Context, u *url.URL, logger zerolog.Logger) bool {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		logger.Warn().Err(err).Str("upstream", shownURL(u)).
			Msg("nothing answers at UPSTREAM_URL: requests will get 502 until it does. Is the upstream running? (make run starts its demo upstream only when UPSTREAM_URL is unset)")
		return false
	}
	_ = conn.Close()
	return true
}
