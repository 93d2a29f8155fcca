package e2e

// Tests against a real Redis Cluster: 3 masters with one replica each, their
// own redis-server processes on free loopback ports (internal/redistest),
// and the binary.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testutil"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestCluster runs the proxy on a 3-master Redis Cluster (one replica each)
// with REDIS_MODE=cluster and the six nodes as seeds.
func TestCluster(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	c := redistest.StartCluster(t)
	t.Logf("cluster of %d nodes healthy in %s", len(c.Nodes()), time.Since(t0).Round(time.Millisecond))
	up := newFleetUpstream(t)
	p := startFleetProxy(t, up.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","))

	// Hundreds of keys: each executes once, its record lands on the master
	// that owns its hash slot, all three masters get some, and a second send
	// replays the first answer.
	t.Run("spread and replay", func(t *testing.T) {
		keys := fleetKeys("spread", 300)
		first := p.sendAll(keys, 8)
		perMaster := map[string]int{}
		for _, k := range keys {
			a := first[k]
			if !fleetExecuted(a) {
				t.Fatalf("first send of %s: got status %d replayed=%v err=%v, want 201 executed", k, a.status, a.replayed, a.err)
			}
			// The record key of the proxy's Lua scripts, on its slot's master.
			m := c.NodeForKey(fleetRedisKey(k))
			st, err := fleetNodeClient(t, m).HGet(context.Background(), fleetRedisKey(k), "st").Result()
			if err != nil || st != "c" {
				t.Fatalf("record of %s on %s (slot %d): st=%q err=%v, want completed", k, m.Addr(), c.KeySlot(fleetRedisKey(k)), st, err)
			}
			perMaster[m.Addr()]++
		}
		t.Logf("records per master: %v", perMaster)
		if len(perMaster) != 3 {
			t.Fatalf("records landed on %d masters, want all 3: %v", len(perMaster), perMaster)
		}
		second := p.sendAll(keys, 8)
		for _, k := range keys {
			a := second[k]
			if a.err != nil || a.status != http.StatusCreated || !a.replayed || a.body != first[k].body {
				t.Errorf("second send of %s: status %d replayed=%v err=%v body %q, want a replay of %q",
					k, a.status, a.replayed, a.err, a.body, first[k].body)
			}
			if n := up.KeyCalls(k); n != 1 {
				t.Errorf("%s executed %d times, want 1", k, n)
			}
		}
	})

	// Concurrent duplicates: 20 keys x 10 simultaneous sends. Each key
	// executes once; the other sends get a replay of that answer or 409.
	t.Run("concurrent duplicates", func(t *testing.T) {
		up.delay.Store(int64(100 * time.Millisecond))
		defer up.delay.Store(0)
		keys := fleetKeys("dup", 20)
		const sends = 10
		var mu sync.Mutex
		answers := map[string][]fleetAnswer{}
		startGate := make(chan struct{})
		var wg sync.WaitGroup
		for _, k := range keys {
			for range sends {
				wg.Go(func() {
					<-startGate
					a := p.send(k)
					mu.Lock()
					answers[k] = append(answers[k], a)
					mu.Unlock()
				})
			}
		}
		close(startGate)
		wg.Wait()
		var conflicts, replays int
		for _, k := range keys {
			var winner string
			execs := 0
			for _, a := range answers[k] {
				switch {
				case fleetExecuted(a):
					execs++
					winner = a.body
				case a.err == nil && a.status == http.StatusConflict:
					conflicts++
				case a.err == nil && a.status == http.StatusCreated && a.replayed:
					replays++
				default:
					t.Errorf("%s: unexpected answer status %d err=%v body %q", k, a.status, a.err, a.body)
				}
			}
			if execs != 1 || up.KeyCalls(k) != 1 {
				t.Errorf("%s: %d executed answers, upstream ran it %d times; want 1 and 1", k, execs, up.KeyCalls(k))
				continue
			}
			for _, a := range answers[k] {
				if a.replayed && a.body != winner {
					t.Errorf("%s: replay %q differs from the executed answer %q", k, a.body, winner)
				}
			}
			if a := p.send(k); !a.replayed || a.body != winner {
				t.Errorf("%s: later send got status %d replayed=%v body %q, want replay of %q", k, a.status, a.replayed, a.body, winner)
			}
		}
		t.Logf("%d keys x %d concurrent sends: %d executions, %d replays, %d conflicts (409)",
			len(keys), sends, len(keys), replays, conflicts)
	})

	// RECORD_FORMAT=string beside the hash proxy on one Cluster, as during
	// its rollout: the claim's MGET reads two keys of one slot on every
	// master; each key executes once, is kept as a string on its slot's
	// master, and both proxies replay it.
	t.Run("string records beside hash records", func(t *testing.T) {
		ps := startFleetProxy(t, up.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","), "RECORD_FORMAT=string")
		keys := fleetKeys("strings", 90)
		first := ps.sendAll(keys, 8)
		perMaster := map[string]int{}
		for _, k := range keys {
			if a := first[k]; !fleetExecuted(a) {
				t.Fatalf("first send of %s: status %d replayed=%v err=%v, want 201 executed", k, a.status, a.replayed, a.err)
			}
			m := c.NodeForKey(fleetRedisKey(k))
			if typ, err := fleetNodeClient(t, m).Type(context.Background(), fleetRedisKey(k)).Result(); err != nil || typ != "string" {
				t.Fatalf("record of %s on %s: a Redis %q (%v), want string", k, m.Addr(), typ, err)
			}
			perMaster[m.Addr()]++
		}
		if len(perMaster) != 3 {
			t.Fatalf("records landed on %d masters, want all 3: %v", len(perMaster), perMaster)
		}
		for _, via := range []struct {
			name string
			p    *fleetProxy
		}{{"the hash proxy", p}, {"the string proxy", ps}} {
			for k, a := range via.p.sendAll(keys, 8) {
				if a.err != nil || a.status != http.StatusCreated || !a.replayed || a.body != first[k].body || up.KeyCalls(k) != 1 {
					t.Errorf("%s via %s: status %d replayed=%v err=%v, executed %d times; want a replay of the first answer",
						k, via.name, a.status, a.replayed, a.err, up.KeyCalls(k))
				}
			}
		}
	})

	// NOSCRIPT: a node that was restarted or promoted has an empty script
	// cache. After SCRIPT FLUSH on every node, claims, completions and
	// replays must still work (EVALSHA falls back to EVAL), on all masters.
	t.Run("NOSCRIPT after SCRIPT FLUSH", func(t *testing.T) {
		old := fleetKeys("noscript-old", 60)
		oldAnswers := p.sendAll(old, 4)
		c.FlushScripts()
		ctx := context.Background()
		before := map[string]int64{}
		for _, m := range c.Masters() {
			ex, err := fleetNodeClient(t, m).ScriptExists(ctx, clusterScriptHashes()...).Result()
			if err != nil || ex[0] || ex[1] {
				t.Fatalf("%s after SCRIPT FLUSH: exists=%v err=%v, want no scripts", m.Addr(), ex, err)
			}
			before[m.Addr()] = clusterNoScriptErrors(t, m)
		}
		fresh := p.sendAll(fleetKeys("noscript-new", 60), 4)
		for k, a := range fresh {
			if !fleetExecuted(a) || up.KeyCalls(k) != 1 {
				t.Errorf("fresh %s after SCRIPT FLUSH: status %d replayed=%v err=%v, executed %d times; want 201 executed once",
					k, a.status, a.replayed, a.err, up.KeyCalls(k))
			}
		}
		for k, a := range p.sendAll(old, 4) {
			if !a.replayed || a.body != oldAnswers[k].body || up.KeyCalls(k) != 1 {
				t.Errorf("old %s after SCRIPT FLUSH: status %d replayed=%v err=%v, executed %d times; want a replay",
					k, a.status, a.replayed, a.err, up.KeyCalls(k))
			}
		}
		for _, m := range c.Masters() {
			ex, err := fleetNodeClient(t, m).ScriptExists(ctx, clusterScriptHashes()...).Result()
			after := clusterNoScriptErrors(t, m)
			t.Logf("%s: NOSCRIPT errors %d -> %d, scripts cached again %v", m.Addr(), before[m.Addr()], after, ex)
			if err != nil || !ex[0] || !ex[1] || after <= before[m.Addr()] {
				t.Errorf("%s: scripts cached %v (err %v), NOSCRIPT %d -> %d; want the EVAL fallback to have run there",
					m.Addr(), ex, err, before[m.Addr()], after)
			}
		}
	})
}

// TestClusterWaitReplicas: with REDIS_WAIT_REPLICAS=1 on Cluster, WAIT goes
// to the master that ran the script (not a random node), so every claim and
// completion is acknowledged by that shard's replica before the answer.
func TestClusterWaitReplicas(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	up := newFleetUpstream(t)
	p := startFleetProxy(t, up.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"REDIS_WAIT_REPLICAS=1", "REDIS_WAIT_TIMEOUT=2s")
	ctx := context.Background()
	waits := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range c.Masters() {
			info, err := fleetNodeClient(t, m).Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatalf("INFO commandstats on %s: %v", m.Addr(), err)
			}
			for line := range strings.SplitSeq(info, "\r\n") {
				if v, ok := strings.CutPrefix(line, "cmdstat_wait:calls="); ok {
					var n int64
					_, _ = fmt.Sscan(strings.SplitN(v, ",", 2)[0], &n)
					out[m.Addr()] = n
				}
			}
		}
		return out
	}
	noscript := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range c.Masters() {
			out[m.Addr()] = clusterNoScriptErrors(t, m)
		}
		return out
	}
	before, beforeNS := waits(), noscript()
	keys := fleetKeys("wait", 30)
	perMaster := map[string]int64{}
	for k, a := range p.sendAll(keys, 4) {
		if !fleetExecuted(a) || up.KeyCalls(k) != 1 {
			t.Fatalf("%s: status %d err %v, executed %d times; want 201 once", k, a.status, a.err, up.KeyCalls(k))
		}
		m := c.NodeForKey(fleetRedisKey(k))
		perMaster[m.Addr()] += 2 // one WAIT after the claim, one after the completion
		// Acknowledged means: the shard's replica has the completed record now.
		replica := redis.NewClient(&redis.Options{Addr: c.ReplicaOf(m).Addr(),
			OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
		st, err := replica.HGet(ctx, fleetRedisKey(k), "st").Result()
		_ = replica.Close()
		if err != nil || st != "c" {
			t.Errorf("%s: replica of %s has state %q (%v), want the completed record", k, m.Addr(), st, err)
		}
	}
	after, afterNS := waits(), noscript()
	for addr, want := range perMaster {
		// A script's first run on a node answers NOSCRIPT; the fallback
		// pipeline (EVAL + WAIT) sends one more WAIT.
		want += afterNS[addr] - beforeNS[addr]
		if got := after[addr] - before[addr]; got != want {
			t.Errorf("master %s ran WAIT %d times, want %d (2 per key it owns, plus one per NOSCRIPT fallback)", addr, got, want)
		}
	}
	for k, a := range p.sendAll(keys, 4) {
		if !a.replayed || up.KeyCalls(k) != 1 {
			t.Errorf("%s: replayed=%v executed %d times; want a replay", k, a.replayed, up.KeyCalls(k))
		}
	}
}

// TestClusterFailover kills one master of a 3-master cluster (SIGKILL) and
// checks that the proxy, without a restart, serves that shard again once a
// replica is promoted, and that no recorded key executes twice.
//
// What is guaranteed, and asserted: a key whose record was written AND
// replicated before the kill (the test waits until the replica's offset
// reaches the master's) survives the failover; its retries replay it and the
// upstream never runs it again. Keys on the other two shards are never at
// risk. What is not guaranteed: replication is asynchronous, so a record the
// killed master acknowledged in its last moments may be missing on the
// promoted replica, and that key may execute once more. Keys of the killed
// shard sent during the failover are therefore counted, not asserted.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	up := newFleetUpstream(t)
	up.delay.Store(int64(5 * time.Millisecond))
	p := startFleetProxy(t, up.URL, "REDIS_MODE=cluster", "REDIS_ADDRS="+strings.Join(c.Addrs(), ","),
		"LOCK_TTL=3s", "UPSTREAM_TIMEOUT=2s")
	ctx := context.Background()

	// Phase A: record keys on all shards.
	recorded := fleetKeys("before", 150)
	bodies := map[string]string{}
	for k, a := range p.sendAll(recorded, 8) {
		if !fleetExecuted(a) {
			t.Fatalf("%s before the kill: status %d err %v, want 201 executed", k, a.status, a.err)
		}
		bodies[k] = a.body
	}
	owner := map[string]*redistest.Server{}
	for _, k := range recorded {
		owner[k] = c.NodeForKey(fleetRedisKey(k))
	}
	victim := owner[recorded[0]]
	replica := c.ReplicaOf(victim)
	if replica == nil {
		t.Fatalf("master %s has no replica", victim.Addr())
	}
	var onVictim []string
	for _, k := range recorded {
		if owner[k] == victim {
			onVictim = append(onVictim, k)
		}
	}
	// The replica must hold every record before the kill, or the assertion
	// below would be about luck, not about the proxy.
	redistest.WaitReplicated(t, victim, replica, 10*time.Second)
	cached, err := fleetNodeClient(t, replica).ScriptExists(ctx, clusterScriptHashes()[0]).Result()
	if err != nil {
		t.Fatalf("SCRIPT EXISTS on replica: %v", err)
	}
	t.Logf("killing master %s (%d of %d recorded keys on its shard); replica %s has the claim script cached: %v",
		victim.Addr(), len(onVictim), len(recorded), replica.Addr(), cached[0])

	// Probe keys whose records hash to the victim's shard.
	var probes []string
	for _, k := range fleetKeys("probe", 200) {
		if c.NodeForKey(fleetRedisKey(k)) == victim {
			probes = append(probes, k)
		}
		if len(probes) == 10 {
			break
		}
	}

	load := startFleetLoad(p, recorded, bodies, "during", 4)
	time.Sleep(200 * time.Millisecond) // some load before the kill
	// Everything the victim acknowledged before this instant is on its
	// replica once WaitReplicated returns (it reads the master's offset first).
	replicatedAt := time.Now()
	redistest.WaitReplicated(t, victim, replica, 10*time.Second)
	killedAt := time.Now()
	c.KillMaster(victim)
	// /readyz checks every master: it must report the dead one (bounded
	// poll, since go-redis notices the failure on its next use).
	readyz := func() int {
		resp, err := http.Get(p.adminURL(t, "/readyz"))
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	sawNotReady := false
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !sawNotReady; time.Sleep(20 * time.Millisecond) {
		sawNotReady = readyz() == http.StatusServiceUnavailable
	}
	if !sawNotReady {
		t.Errorf("/readyz never reported the killed master within 2s")
	}
	c.WaitHealthy(30 * time.Second)
	clusterBack := time.Since(killedAt)
	readyBy := time.Now().Add(10 * time.Second)
	for readyz() != http.StatusOK {
		if time.Now().After(readyBy) {
			t.Errorf("/readyz not 200 within 10s of the cluster's recovery")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if role, _, err := redistest.Role(replica); err != nil || role != "master" {
		t.Fatalf("replica %s not promoted: ROLE %q %v", replica.Addr(), role, err)
	}
	// The proxy must serve the shard again without a restart, soon after the
	// cluster itself is healthy: 10 s is generous (the cluster client only
	// has to reload its slot map). Past the bound the test fails but keeps
	// waiting, up to 70 s, so that the invariants below are still checked.
	var recoveredAt time.Duration
	probe := probes[0]
	const recoveryBound = 10 * time.Second
	a, tries := p.sendUntil(probe, recoveryBound, fleetExecuted)
	if !fleetExecuted(a) {
		t.Errorf("the proxy still answers %d (%q) for keys of the failed-over shard %s after the cluster was healthy "+
			"(%s after the kill, %d tries): it keeps sending them to the dead master", a.status, a.body, recoveryBound,
			time.Since(killedAt).Round(time.Millisecond), tries)
		a, _ = p.sendUntil(probe, 70*time.Second-time.Since(killedAt), fleetExecuted)
		if !fleetExecuted(a) {
			load.finish()
			t.Fatalf("the proxy never served the failed-over shard again: last status %d err %v body %q", a.status, a.err, a.body)
		}
	}
	recoveredAt = time.Since(killedAt)
	time.Sleep(300 * time.Millisecond) // some load after recovery
	load.finish()

	// Phase C: after recovery every shard works and records.
	after := fleetKeys("after", 60)
	for k, a := range p.sendAll(append(after, probes[1:]...), 8) {
		if !fleetExecuted(a) {
			t.Errorf("%s after recovery: status %d err %v, want 201 executed", k, a.status, a.err)
		}
	}
	nowCached, _ := fleetNodeClient(t, replica).ScriptExists(ctx, clusterScriptHashes()[0]).Result()

	// The dead master is no longer one the proxy talks to: it stops being
	// counted unreachable (an alert on the gauge would otherwise page until
	// every pod restarts, for a cluster that healed itself).
	testutil.Eventually(t, 15*time.Second, "idemproxy_redis_unreachable back to 0 after the failover", func() bool {
		return p.metric(t, "idemproxy_redis_unreachable") == 0
	})

	// Recorded-before keys: all replay, none executed again.
	fleetWantReplayed(t, p, up, recorded, bodies)
	for _, b := range load.bad {
		t.Error(b)
	}
	// Fresh keys of the load. Safe, and asserted: keys of the two surviving
	// shards, keys answered before the replication checkpoint, keys sent
	// after the kill (nothing can reach the dead master any more). In the
	// window (victim's shard, answered after the checkpoint, sent before the
	// kill) a record acknowledged by the victim may be lost: counted. A
	// recording that failed (the proxy logs "not recorded") leaves the key in
	// flight until LOCK_TTL, after which it may execute again, as the
	// contract allows.
	final := load.settle(10 * time.Second)
	notRecorded := p.keyHashes("not recorded")
	var strict, window, lost int
	for k, first := range load.fresh {
		if f := final[k]; f.err != nil || f.status != http.StatusCreated {
			t.Errorf("fresh key %s: final status %d err %v", k, f.status, f.err)
			continue
		}
		n := up.KeyCalls(k)
		onVictim := c.NodeForKey(fleetRedisKey(k)) == replica
		inWindow := onVictim && load.freshAt[k].Before(killedAt) && !(fleetExecuted(first) && load.doneAt[k].Before(replicatedAt))
		switch {
		case inWindow || notRecorded[fleetKeyHash(k)]:
			window++
			if n > 1 {
				lost++
			}
			if n > 2 {
				t.Errorf("window key %s executed %d times", k, n)
			}
		default:
			strict++
			if n != 1 {
				t.Errorf("fresh key %s (shard of the killed master: %v, sent %s after the kill, first answer %d replayed=%v) executed %d times, want 1",
					k, onVictim, load.freshAt[k].Sub(killedAt), first.status, first.replayed, n)
			}
		}
	}
	t.Logf("cluster healthy %s after the kill, proxy served the shard again after %s (no restart); promoted replica has the claim script cached now: %v",
		clusterBack.Round(time.Millisecond), recoveredAt.Round(time.Millisecond), nowCached)
	t.Logf("load: %v; %d fresh keys outside the loss window all executed once; %d in the window, %d of them executed again",
		load.status, strict, window, lost)
	if load.status["503"] == 0 {
		t.Logf("note: no request got 503 during the failover")
	}
}

// TestKeysCluster: list walks every master, purge deletes on the key's
// master and reaches the proxy, on a 3-master Redis Cluster.
func TestKeysCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	up := newFleetUpstream(t)
	env := []string{"REDIS_MODE=cluster", "REDIS_ADDRS=" + strings.Join(cl.Addrs(), ",")}
	p := startFleetProxy(t, up.URL, env...)
	keys := fleetKeys("keys", 40)
	perMaster := map[string]int{}
	for k, a := range p.sendAll(keys, 8) {
		if !fleetExecuted(a) {
			t.Fatalf("%s: status %d err %v", k, a.status, a.err)
		}
		perMaster[cl.NodeForKey(fleetRedisKey(k)).Addr()]++
	}
	if len(perMaster) != 3 {
		t.Fatalf("records on %d masters, want 3: %v", len(perMaster), perMaster)
	}
	listed := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(keysOK(t, env, "list", "--limit", "100000", "--state", "completed")), "\n") {
		var e struct {
			KeyHash string `json:"key_hash"`
			Status  int    `json:"status"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Status != http.StatusCreated {
			t.Fatalf("list line %q: %v", line, err)
		}
		listed[e.KeyHash] = true
	}
	for _, k := range keys {
		if !listed[fleetKeyHash(k)] {
			t.Errorf("keys list lacks %s (on %s)", k, cl.NodeForKey(fleetRedisKey(k)).Addr())
		}
	}
	if len(listed) != len(keys) {
		t.Errorf("keys list: %d records, want %d", len(listed), len(keys))
	}
	if out := keysOK(t, env, "list", "--limit", "5"); strings.Count(out, "\n") != 5 {
		t.Errorf("keys list --limit 5: %d lines", strings.Count(out, "\n"))
	}
	for _, k := range keys[:3] {
		for range 2 { // a replay, then one from the proxy's replay cache
			if a := p.send(k); !a.replayed {
				t.Fatalf("%s before purge: status %d replayed=%v, want a replay", k, a.status, a.replayed)
			}
		}
		if _, errOut, code := keysRun(t, env, "purge", "--state", "in_flight", fleetKeyHash(k)); code != 1 || !strings.Contains(errOut, "its record is completed") {
			t.Fatalf("%s: purge --state in_flight of a completed key: exit %d, stderr %s", k, code, errOut)
		}
		keysOK(t, env, "purge", "--state", "completed", fleetKeyHash(k))
		// The purge reaches the proxy's cache through Cluster Pub/Sub.
		if a, _ := p.sendUntil(k, time.Second, fleetExecuted); !fleetExecuted(a) {
			t.Errorf("%s 1s after purge: status %d replayed=%v, want executed", k, a.status, a.replayed)
		}
		if n := up.KeyCalls(k); n != 2 {
			t.Errorf("%s executed %d times, want 2", k, n)
		}
	}
}

// clusterScriptHashes are the SHA1s of the three Lua scripts, as EVALSHA names them.
func clusterScriptHashes() []string {
	return []string{
		redis.NewScript(scripts.Claim).Hash(),
		redis.NewScript(scripts.Complete).Hash(),
		redis.NewScript(scripts.Release).Hash(),
	}
}

// clusterNoScriptErrors reads how many NOSCRIPT errors s has answered.
func clusterNoScriptErrors(t *testing.T, s *redistest.Server) int64 {
	info, err := fleetNodeClient(t, s).Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO errorstats on %s: %v", s.Addr(), err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "errorstat_NOSCRIPT:count="); ok {
			var n int64
			_, _ = fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}
