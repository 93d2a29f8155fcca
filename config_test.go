package main

import (
	"reflect"
	"strings"
	"testing"
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
		{"global", []string{up, "TTL=30s", "LOCK_TTL=60s", "SHUTDOWN_TIMEOUT=45s"}, []string{`TTL="30s"`, `LOCK_TTL="60s"`}},
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
