package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestRedisAddrsTrimmed: "a:26379, b:26379" is two seeds. Before the fix the
// second was kept as " b:26379", which go-redis cannot dial.
func TestRedisAddrsTrimmed(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, mode := range []string{"sentinel", "cluster"} {
		cfg, err := loadConfig([]string{up, "REDIS_MODE=" + mode, "REDIS_ADDRS= a:26379, b:26379 ,,c:26379,"})
		if err != nil {
			t.Fatalf("%s: loadConfig: %v", mode, err)
		}
		if want := []string{"a:26379", "b:26379", "c:26379"}; !reflect.DeepEqual(cfg.RedisAddrs, want) {
			t.Errorf("%s: REDIS_ADDRS parsed as %q, want %q", mode, cfg.RedisAddrs, want)
		}
	}
	for _, v := range []string{",", " , ,"} {
		_, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=" + v})
		if err == nil || !strings.Contains(err.Error(), "REDIS_ADDRS=") || !strings.Contains(err.Error(), "no host:port") {
			t.Errorf("REDIS_ADDRS=%q: error %v, want one naming REDIS_ADDRS and saying it holds no host:port", v, err)
		}
	}
	if _, err := loadConfig([]string{up, "REDIS_MODE=sentinel", "REDIS_ADDRS=a b:26379"}); err == nil || !strings.Contains(err.Error(), `"a b:26379" is not host:port`) {
		t.Errorf("REDIS_ADDRS with an inner blank: error %v, want one quoting the entry", err)
	}
}

// TestTTLNotBelowLock: a record kept for less than its claim's lock is
// refused, globally and per route (the route's ttl= against its own lock=,
// or the global LOCK_TTL it inherits).
func TestTTLNotBelowLock(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"global", []string{up, "TTL=30s", "LOCK_TTL=60s", "SHUTDOWN_TIMEOUT=60s"}, []string{`TTL="30s"`, `LOCK_TTL="60s"`}},
		{"route ttl below global lock", []string{up, "ROUTES=POST /a ttl=30s"}, []string{`ROUTES rule "POST /a ttl=30s"`, "ttl=30s", "LOCK_TTL=1m0s"}},
		{"route ttl below route lock", []string{up, "ROUTES=POST /a ttl=1m lock=2m"}, []string{`ROUTES rule "POST /a ttl=1m lock=2m"`, "ttl=1m0s", "lock=2m0s"}},
		{"route lock above global TTL", []string{up, "TTL=90s", "ROUTES=POST /a lock=2m"}, []string{`ROUTES rule "POST /a lock=2m"`, "TTL=90s", "lock=2m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env)
			if err == nil {
				t.Fatalf("loadConfig(%q) accepted, want an error", tt.env)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %s:\n%v", w, err)
				}
			}
		})
	}
	for _, ok := range [][]string{
		{up, "TTL=60s", "LOCK_TTL=60s"},
		{up, "ROUTES=POST /a ttl=2m lock=2m; POST /b ttl=1h; POST /c off"},
	} {
		if _, err := loadConfig(ok); err != nil {
			t.Errorf("loadConfig(%q): %v, want it accepted", ok, err)
		}
	}
}

// TestBufferedSizesBounded: MAX_BODY_BYTES and MAX_STORED_RESPONSE_BYTES are
// at most 64 MiB; the message names the variable, the value and the bound.
func TestBufferedSizesBounded(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, name := range []string{"MAX_BODY_BYTES", "MAX_STORED_RESPONSE_BYTES"} {
		_, err := loadConfig([]string{up, name + "=67108865"})
		if err == nil || !strings.Contains(err.Error(), name+`="67108865"`) || !strings.Contains(err.Error(), "67108864") {
			t.Errorf("%s=67108865: error %v, want one naming the variable, the value and 67108864", name, err)
		}
		if _, err := loadConfig([]string{up, name + "=67108864"}); err != nil {
			t.Errorf("%s=67108864: %v, want it accepted", name, err)
		}
	}
}

// TestUpstreamID: UPSTREAM_ID defaults to UPSTREAM_URL's identity
// (scheme://host[:port]/path, normalised), and a set value is validated.
func TestUpstreamID(t *testing.T) {
	derived := []struct{ url, want string }{
		{"http://127.0.0.1:9000", "http://127.0.0.1:9000"},
		{"http://API.Example.com:80/", "http://api.example.com"},
		{"https://user:pw@Api.example.com:443/v1/Orders?x=1#frag", "https://api.example.com/v1/Orders"},
		{"https://api.example.com:8443/v1/", "https://api.example.com:8443/v1/"},
		{"HTTP://[::1]:80/x", "http://[::1]/x"},
		{"http://[::1]:8080", "http://[::1]:8080"},
	}
	for _, tt := range derived {
		cfg, err := loadConfig([]string{"UPSTREAM_URL=" + tt.url})
		if err != nil {
			t.Errorf("UPSTREAM_URL=%q: %v", tt.url, err)
			continue
		}
		if cfg.upstreamID != tt.want {
			t.Errorf("UPSTREAM_URL=%q: derived UPSTREAM_ID %q, want %q", tt.url, cfg.upstreamID, tt.want)
		}
	}
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	for _, tt := range []struct{ env, want string }{
		{"UPSTREAM_ID=payments-v1", "payments-v1"},
		{"UPSTREAM_ID=  http://old-api.internal:8080  ", "http://old-api.internal:8080"},
		{"UPSTREAM_ID=", "http://127.0.0.1:9000"}, // empty (as a chart renders it): derived
	} {
		cfg, err := loadConfig([]string{up, tt.env})
		if err != nil || cfg.upstreamID != tt.want {
			t.Errorf("%s: upstreamID %q, err %v; want %q", tt.env, cfg.upstreamID, err, tt.want)
		}
	}
	for _, tt := range []struct{ env, want string }{
		{"UPSTREAM_ID=   ", `UPSTREAM_ID="   "`},
		{"UPSTREAM_ID=" + strings.Repeat("a", 513), "at most 512"},
		{"UPSTREAM_ID=caf\u00e9", `UPSTREAM_ID="café"`},
		{"UPSTREAM_ID=a\tb", "printable ASCII"},
	} {
		if _, err := loadConfig([]string{up, tt.env}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.40s: error %v, want one containing %s", tt.env, err, tt.want)
		}
	}
	if _, err := loadConfig([]string{up, "UPSTREAM_ID=" + strings.Repeat("a", 512)}); err != nil {
		t.Errorf("UPSTREAM_ID of 512 bytes: %v, want it accepted", err)
	}
}

// TestRequestReadTimeout: REQUEST_READ_TIMEOUT defaults to 10s and must be
// above zero.
func TestRequestReadTimeout(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9000"
	cfg, err := loadConfig([]string{up})
	if err != nil || cfg.RequestReadTimeout != 10*time.Second {
		t.Fatalf("default: %v, err %v; want 10s", cfg.RequestReadTimeout, err)
	}
	for _, v := range []string{"0s", "-1s", "soon"} {
		if _, err := loadConfig([]string{up, "REQUEST_READ_TIMEOUT=" + v}); err == nil || !strings.Contains(err.Error(), `REQUEST_READ_TIMEOUT="`+v+`"`) {
			t.Errorf("REQUEST_READ_TIMEOUT=%s: error %v, want one naming it", v, err)
		}
	}
}
