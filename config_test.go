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
