package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestReview12bPurgeAfterSentinelFailover: after a Sentinel failover the
// proxy's purge subscription stays on the old master (go-redis's
// FailoverClient filters its command pools on +switch-master, not its
// PubSub connections), while `keys purge` deletes and publishes on the new
// master. Until Sentinel reconfigures the old master (seconds later), the
// announcement never reaches the proxy, whose replay cache keeps replaying
// the purged record: "every replica's replay cache stops replaying a purged
// key within 1 s" does not hold across a failover.
func TestReview12bPurgeAfterSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	up := newFleetUpstream(t)
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=" + s.MasterName()}
	p := startFleetProxy(t, up.URL, env...)
	c := newClient(t)
	waitReplayCacheOn(t, c, p.app) // else both replays come from Redis, and the purge is obeyed whatever happens to it
	k := fleetKeys("failover-purge", 1)[0]
	if a := p.send(k); !fleetExecuted(a) {
		t.Fatalf("first send: %d %v", a.status, a.err)
	}
	redistest.WaitReplicated(t, s.Master(), s.Replica(), 5*time.Second)
	var hits float64
	for i := range 2 { // a replay from Redis, then one from the replay cache
		if i == 1 {
			hits = metric(t, c, p.app, "idemproxy_replay_cache_hits_total")
		}
		if a := p.send(k); !a.replayed {
			t.Fatalf("before the failover: status %d replayed=%v", a.status, a.replayed)
		}
	}
	if n := metric(t, c, p.app, "idemproxy_replay_cache_hits_total") - hits; n != 1 {
		t.Fatalf("the second replay made %v replay cache hits, want 1: the cache does not hold the record, and this test would show nothing", n)
	}
	s.Failover(20 * time.Second)
	if out := keysOK(t, env, "purge", fleetKeyHash(k)); !strings.Contains(out, `"purged":true`) {
		t.Fatalf("keys purge after the failover: %s", out)
	}
	purged := time.Now()
	a, tries := p.sendUntil(k, time.Second, fleetExecuted)
	if !fleetExecuted(a) {
		t.Errorf("1s after keys purge (following a Sentinel failover), %d tries: status %d replayed=%v; want executed (the purged record is still replayed from the replay cache)", tries, a.status, a.replayed)
		// How long it lasts, for the report.
		a, _ = p.sendUntil(k, 20*time.Second, fleetExecuted)
		t.Logf("executed=%v %v after the purge", fleetExecuted(a), time.Since(purged).Round(100*time.Millisecond))
	}
}
