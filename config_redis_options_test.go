package main

// Redis settings that started anyway, or failed without naming the
// variable (review17c).

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestRedisAddrsMustBeHostPort: REDIS_ADDRS is checked only
// for a ':' with something on each side, so a redis:// URL pasted in (the
// form REDIS_URL takes), a port that is not a number, or host:port:junk
// start the proxy; every keyed request then gets 503 at run time instead of
// the process refusing to start with a message naming REDIS_ADDRS.
func TestRedisAddrsMustBeHostPort(t *testing.T) {
	for _, tc := range []struct{ mode, addrs string }{
		{"sentinel", "redis://10.0.0.1:26379"},
		{"cluster", "redis://10.0.0.1:6379,redis://10.0.0.2:6379"},
		{"cluster", "10.0.0.1:port"},
		{"sentinel", "10.0.0.1:26379:1"},
	} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=" + tc.mode, "REDIS_ADDRS=" + tc.addrs})
		if err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS") {
			t.Errorf("REDIS_MODE=%s REDIS_ADDRS=%q: loadConfig error %v; want a refusal naming REDIS_ADDRS (not host:port)", tc.mode, tc.addrs, err)
		}
	}
}

// TestRedisURLNegativePoolSizeRefused: REDIS_URL's go-redis options
// are honoured but not checked; pool_size=-1 passes loadConfig and start then
// panics inside go-redis ("makechan: size out of range"): the operator gets a
// Go panic and a stack, not a message naming REDIS_URL and the value.
func TestRedisURLNegativePoolSizeRefused(t *testing.T) {
	env := []string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0?pool_size=-1",
		"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR="}
	cfg, err := loadConfig(env)
	if err != nil {
		if !strings.Contains(err.Error(), "REDIS_URL") {
			t.Errorf("loadConfig: %v; want the message to name REDIS_URL", err)
		}
		return
	}
	var startErr error
	panicked := func() (p any) {
		defer func() { p = recover() }()
		a, err := start(cfg, zerolog.Nop())
		startErr = err
		if a != nil {
			_ = a.shutdown(2e9)
		}
		return nil
	}()
	switch {
	case panicked != nil:
		t.Errorf("REDIS_URL=...?pool_size=-1 passed loadConfig and start panicked: %v; want loadConfig to refuse it naming REDIS_URL", panicked)
	case startErr == nil || !strings.Contains(startErr.Error(), "REDIS_URL"):
		t.Errorf("REDIS_URL=...?pool_size=-1: loadConfig accepted it, start returned %v; want a refusal naming REDIS_URL", fmt.Sprint(startErr))
	}
}

// TestRedisURLTimeoutsMustStayOn: go-redis reads a zero or negative
// dial/read/write/pool timeout in REDIS_URL as "no timeout". The claim waits
// on them (go-redis does not put context deadlines on its sockets), so with
// read_timeout=0 a stalled Redis held every keyed request, and the start-up
// check, without end (review17c). Such a URL does not start; positive values
// and the defaults do.
func TestRedisURLTimeoutsMustStayOn(t *testing.T) {
	for _, q := range []string{"read_timeout=0", "read_timeout=-1", "write_timeout=0s", "dial_timeout=-5s", "pool_timeout=0"} {
		_, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://:secret@127.0.0.1:1/0?" + q})
		name, _, _ := strings.Cut(q, "=")
		switch {
		case err == nil:
			t.Errorf("REDIS_URL ...?%s: accepted; want a refusal", q)
		case !strings.Contains(err.Error(), "REDIS_URL") || !strings.Contains(err.Error(), name):
			t.Errorf("REDIS_URL ...?%s: %v; want the message to name REDIS_URL and %s", q, err, name)
		case strings.Contains(err.Error(), "secret"):
			t.Errorf("REDIS_URL ...?%s: the message shows the password: %v", q, err)
		}
	}
	for _, q := range []string{"", "?read_timeout=2s", "?read_timeout=3&write_timeout=1s&dial_timeout=2s&pool_timeout=4s", "?pool_size=0"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=redis://127.0.0.1:1/0" + q}); err != nil {
			t.Errorf("REDIS_URL ...%s: %v; want it accepted", q, err)
		}
	}
}

// TestRedisAddrsForms: the seed forms a dialer takes are accepted.
func TestRedisAddrsForms(t *testing.T) {
	for _, addrs := range []string{"10.0.0.1:26379", "redis-0.redis:26379, redis-1.redis:26379", "[::1]:6379", "[fd00::1]:26379,10.0.0.2:26379"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=sentinel", "REDIS_ADDRS=" + addrs}); err != nil {
			t.Errorf("REDIS_ADDRS=%q: %v; want it accepted", addrs, err)
		}
	}
	for _, addrs := range []string{"10.0.0.1:0", "10.0.0.1:65536", "::1:6379", "10.0.0.1", ":6379"} {
		if _, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_MODE=cluster", "REDIS_ADDRS=" + addrs}); err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS") {
			t.Errorf("REDIS_ADDRS=%q: %v; want a refusal naming REDIS_ADDRS", addrs, err)
		}
	}
}
