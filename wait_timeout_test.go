package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestWaitTimeoutAboveReadTimeout: with REDIS_WAIT_REPLICAS and a
// REDIS_WAIT_TIMEOUT above go-redis's default read timeout (5s), a claim that
// no replica acknowledges is ErrNotReplicated, not an i/o timeout: the
// client's read timeout is raised above the WAIT. Real redis-server, no
// replica.
func TestWaitTimeoutAboveReadTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const wait = 5500 * time.Millisecond
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "REDIS_URL=" + srv.URL(),
		"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=" + wait.String(), "SHUTDOWN_TIMEOUT=75s"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := openRedis(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.close)
	scripter, err := st.scripter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := claim.NewStore(scripter, cfg.KeyPrefix, nil, claim.WaitReplicas(cfg.RedisWaitReplicas, cfg.RedisWaitTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	begun := time.Now()
	lease, rec, err := s.Acquire(ctx, claim.NewKey([]string{""}, "wait-1"), claim.Fingerprint{1}, claim.Terms{LockTTL: time.Minute, TTL: time.Hour})
	took := time.Since(begun)
	if lease != nil || rec != nil || !errors.Is(err, claim.ErrNotReplicated) {
		t.Fatalf("claim with no replica and REDIS_WAIT_TIMEOUT=%v: got lease %v record %v err %v after %v; want ErrNotReplicated", wait, lease, rec, err, took)
	}
	if took < wait-200*time.Millisecond {
		t.Errorf("claim answered after %v, want about REDIS_WAIT_TIMEOUT=%v (WAIT ran its course)", took, wait)
	}
}

// TestWaitReadTimeoutOptions: the read timeout each client gets.
func TestWaitReadTimeoutOptions(t *testing.T) {
	const up = "UPSTREAM_URL=http://127.0.0.1:9"
	open := func(env ...string) redis.UniversalClient {
		t.Helper()
		// SHUTDOWN_TIMEOUT covers the claim's WAIT of 8s.
		cfg, err := loadConfig(append([]string{up, "SHUTDOWN_TIMEOUT=75s"}, env...))
		if err != nil {
			t.Fatal(err)
		}
		st, err := openRedis(cfg, zerolog.Nop(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.close)
		return st.client
	}
	readTimeout := func(c redis.UniversalClient) time.Duration {
		switch c := c.(type) {
		case *redis.Client:
			return c.Options().ReadTimeout
		case *redis.ClusterClient:
			return c.Options().ReadTimeout
		}
		t.Fatalf("client %T", c)
		return 0
	}
	tests := []struct {
		name string
		env  []string
		want time.Duration
	}{
		{"standalone without WAIT", []string{"REDIS_URL=redis://127.0.0.1:1/0"}, 5 * time.Second},
		{"standalone, WAIT 8s", []string{"REDIS_URL=redis://127.0.0.1:1/0", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
		{"standalone, WAIT 1s", []string{"REDIS_URL=redis://127.0.0.1:1/0", "REDIS_WAIT_REPLICAS=1"}, 5 * time.Second},
		{"standalone, explicit read_timeout kept", []string{"REDIS_URL=redis://127.0.0.1:1/0?read_timeout=20s", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 20 * time.Second},
		{"sentinel, WAIT 8s", []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=127.0.0.1:1", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
		{"cluster, WAIT 8s", []string{"REDIS_MODE=cluster", "REDIS_ADDRS=127.0.0.1:1", "REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=8s"}, 9 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := readTimeout(open(tt.env...)); got != tt.want {
				t.Errorf("read timeout: got %v, want %v", got, tt.want)
			}
		})
	}
}
