package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// TestScripterChoice: automatic pipelining only where it is safe: not
// with WAIT (it must follow the script on its connection), not on Cluster
// (one slow master would stall every shard's batch), not when switched off.
func TestScripterChoice(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = plain.Close(); _ = cluster.Close() })
	tests := []struct {
		name     string
		client   redis.UniversalClient
		cfg      Config
		wantAuto bool
	}{
		{"standalone, default", plain, Config{RedisAutoPipeline: true}, true},
		{"switched off", plain, Config{RedisAutoPipeline: false}, false},
		{"with WAIT", plain, Config{RedisAutoPipeline: true, RedisWaitReplicas: 1}, false},
		{"cluster", cluster, Config{RedisAutoPipeline: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := (&store{client: tt.client}).scripter(&tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			ap, auto := got.(*redis.AutoPipeliner)
			if auto != tt.wantAuto {
				t.Errorf("got %T, want automatic pipelining %v", got, tt.wantAuto)
			}
			// go-redis pools 100-command queue slices; a larger batch size
			// allocates a new one per flush (4.8 KB of garbage each).
			if auto && ap.Config().MaxBatchSize > 100 {
				t.Errorf("MaxBatchSize %d, want at most 100", ap.Config().MaxBatchSize)
			}
		})
	}
}

// TestReadyzListsConfigWarnings: risky-but-allowed settings are reported in
// the /readyz body, as the contract asks.
func TestReadyzListsConfigWarnings(t *testing.T) {
	cfg, err := loadConfig([]string{"UPSTREAM_URL=http://127.0.0.1:9", "LISTEN_ADDR=127.0.0.1:0",
		"ADMIN_ADDR=127.0.0.1:0", "FAIL_MODE=open", "UPSTREAM_TIMEOUT=30s", "LOCK_TTL=32s"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.shutdown(5 * time.Second) })
	resp, err := http.Get("http://" + a.adminAddr.String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"FAIL_MODE=open", "LOCK_TTL=32s leaves 2s", "embedded"} {
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("/readyz %d %q lacks %q", resp.StatusCode, body, want)
		}
	}
}
