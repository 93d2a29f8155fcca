package main

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/idemproxy/idemproxy/internal/testutil"
)

// TestReview12bShutdownNotHeldByPurgeWatch: with a Redis that accepts
// connections and never answers, a proxy must still shut down within
// SHUTDOWN_TIMEOUT. watchPurges' close waits for WatchPurges, whose
// deferred PubSub.Close waits for the PubSub's mutex, which go-redis holds
// while it redials and handshakes (5 s and more each time): shutdown(1s)
// takes about 9 s. With REPLAY_CACHE_BYTES=0 (no watch) it takes under a
// millisecond.
func TestReview12bShutdownNotHeldByPurgeWatch(t *testing.T) {
	addr := blackHole(t)
	up := newUpstream(t)
	cfg, err := loadConfig([]string{"REDIS_URL=redis://" + addr + "/0", "UPSTREAM_URL=" + up.URL, "LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR="})
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(cfg, zerolog.New(&testutil.SyncBuffer{}))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the purge watch is redialling now
	began := time.Now()
	err = a.shutdown(time.Second)
	if took := time.Since(began); took > 2500*time.Millisecond {
		t.Errorf("shutdown(1s) with a stalled Redis took %v (err %v): the purge watch holds it", took.Round(time.Millisecond), err)
	}
}
