package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
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

// TestStoreOutageFailsFast: with Redis stalled (a partition: connections
// stay open, nothing answers), the first keyed requests wait one Redis read
// timeout and are then answered per FAIL_MODE (forwarded with open, 503
// with closed); from then on keyed requests are answered at once, without
// asking Redis, until it answers a probe, and then claimed again. Before,
// each request waited out its own read timeouts behind the autopipeliner's
// one batch stream: 15 to 40 seconds for a forward or a 503.
func TestStoreOutageFailsFast(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			up := newUpstream(t)
			a, logs := startEnv(t, "UPSTREAM_URL="+up.URL, "REDIS_URL="+srv.URL()+"?read_timeout=300ms",
				"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "FAIL_MODE="+mode)
			c := newClient(t)
			url := "http://" + a.proxyAddr.String() + "/v1/orders"
			want := http.StatusCreated
			if mode == "closed" {
				want = http.StatusServiceUnavailable
			}
			mustPost(t, c, url, "before", "{}")

			srv.Pause()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r := post(c, url, fmt.Sprint("first-", i), "{}"); r.status != want {
						t.Errorf("first requests of the outage: %d, want %d", r.status, want)
					}
				}()
			}
			wg.Wait()
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the first requests of the outage took %v, want about the read timeout (300ms)", took)
			}
			for i := range 5 {
				start := time.Now()
				if r := post(c, url, fmt.Sprint("later-", i), "{}"); r.status != want {
					t.Errorf("request during the outage: %d, want %d", r.status, want)
				}
				if took := time.Since(start); took > 100*time.Millisecond {
					t.Errorf("request %d during the outage took %v, want at once", i, took)
				}
			}
			if got := metric(t, c, a, "idemproxy_redis_unreachable"); got != 1 {
				t.Errorf("idemproxy_redis_unreachable = %v during the outage, want 1", got)
			}

			srv.Resume()
			testutil.Eventually(t, 5*time.Second, "keyed requests are claimed again", func() bool {
				return post(c, url, "after", "{}").status == http.StatusCreated &&
					post(c, url, "after", "{}").header.Get("Idempotent-Replayed") == "true"
			})
			if got := metric(t, c, a, "idemproxy_redis_unreachable"); got != 0 {
				t.Errorf("idemproxy_redis_unreachable = %v after the outage, want 0", got)
			}
			if !strings.Contains(logs.String(), "Redis unreachable: keyed requests get 503") || !strings.Contains(logs.String(), "Redis answers again") {
				t.Errorf("the outage's start and end are not logged:\n%s", logs)
			}
		})
	}
}
