package main

// Tests against a real Redis Sentinel deployment: 1 master, 1 replica and 3
// sentinels, their own redis-server processes on free loopback ports
// (internal/redistest), and the proxy through start(), as in production.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestSentinelFailover runs the proxy with REDIS_MODE=sentinel against three
// sentinels, promotes the replica with SENTINEL FAILOVER while keyed requests
// flow, and checks that the proxy follows the new master without a restart
// and that keys recorded before the failover replay after it.
//
// Guaranteed, and asserted: a key whose answer was recorded before a moment
// at which the replica had caught up with the master (the test waits for the
// replica's offset to reach the master's, mid-load, just before the
// failover) is on the new master: it replays and never executes again. So
// is every key first sent after the proxy dropped its last connection to the
// old master.
//
// Not guaranteed, and counted: Sentinel promotes the replica first and
// tells clients afterwards (+switch-master), and demotes the old master only
// seconds later. Until then the old master still acknowledges the writes of
// clients that have not switched; they are discarded when it becomes a
// replica. A key recorded there in that window executes again on a retry.
// Only a WAIT for a replica after each write (the coming REDIS_WAIT_REPLICAS)
// or min-replicas-to-write on the data nodes can close that window.
func TestSentinelFailover(t *testing.T) {
	t0 := time.Now()
	s := redistest.StartSentinel(t)
	t.Logf("master, replica and 3 sentinels ready in %s", time.Since(t0).Round(time.Millisecond))
	oldMaster, replica := s.Master(), s.Replica()
	up := newFleetUpstream(t)
	up.delay.Store(int64(5 * time.Millisecond))
	p := startFleetProxy(t, up.URL, "REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(s.Addrs(), ","),
		"REDIS_MASTER_NAME="+s.MasterName(), "LOCK_TTL=3s", "UPSTREAM_TIMEOUT=2s")
	ctx := context.Background()

	recorded := fleetKeys("before", 100)
	bodies := map[string]string{}
	for k, a := range p.sendAll(recorded, 8) {
		if !fleetExecuted(a) {
			t.Fatalf("%s before the failover: status %d err %v, want 201 executed", k, a.status, a.err)
		}
		bodies[k] = a.body
		if st, err := fleetNodeClient(t, oldMaster).HGet(ctx, fleetRedisKey(k), "st").Result(); err != nil || st != "c" {
			t.Fatalf("record of %s on master %s: st=%q err=%v", k, oldMaster.Addr(), st, err)
		}
	}

	load := startFleetLoad(p, recorded, bodies, "during", 4)
	time.Sleep(300 * time.Millisecond) // some load before the failover
	// Everything acknowledged before this instant is on the replica once
	// WaitReplicated returns (it reads the master's offset first).
	replicatedAt := time.Now()
	redistest.WaitReplicated(t, oldMaster, replica, 10*time.Second)
	failoverAt := time.Now()
	newMaster := s.Failover(20 * time.Second)
	promoted := time.Since(failoverAt)
	if newMaster != replica {
		t.Fatalf("new master %s, want the replica %s", newMaster.Addr(), replica.Addr())
	}
	// The proxy follows the new master: a fresh key executes and its record
	// is on the new master. Bound: 10 s after the sentinels agree.
	probe := fleetKeys("probe", 1)[0]
	a, tries := p.sendUntil(probe, 10*time.Second, func(a fleetAnswer) bool {
		if !fleetExecuted(a) {
			return false
		}
		st, _ := fleetNodeClient(t, newMaster).HGet(ctx, fleetRedisKey(probe), "st").Result()
		return st == "c"
	})
	if !fleetExecuted(a) {
		load.finish()
		t.Fatalf("the proxy does not write to the new master %s %s after the failover (%d tries): status %d err %v body %q",
			newMaster.Addr(), time.Since(failoverAt), tries, a.status, a.err, a.body)
	}
	followed := time.Since(failoverAt)
	// The proxy has switched once it holds no connection to the old master:
	// go-redis closes them on +switch-master, and every new connection asks
	// the sentinels, which all name the new master by now. From then on no
	// write can reach the old master (Sentinel demotes it only ~15 s later).
	var switchedAt time.Time
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Twice in a row, 20 ms apart, so that a connection being dialled at
		// the first look has shown up by the second.
		n := sentinelForeignConns(t, oldMaster)
		if n == 0 && switchedAt.IsZero() {
			switchedAt = time.Now()
		} else if n == 0 {
			break
		} else {
			switchedAt = time.Time{}
		}
		if time.Now().After(deadline) {
			load.finish()
			t.Fatalf("the proxy still holds %d connections to the old master %s %s after the failover", n, oldMaster.Addr(), time.Since(failoverAt))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // some load after
	load.finish()

	// After the failover: new keys execute once, are recorded on the new
	// master, and replay.
	after := fleetKeys("after", 50)
	afterAnswers := p.sendAll(after, 8)
	for k, a := range afterAnswers {
		st, err := fleetNodeClient(t, newMaster).HGet(ctx, fleetRedisKey(k), "st").Result()
		if !fleetExecuted(a) || err != nil || st != "c" {
			t.Errorf("%s after the failover: status %d err %v; record on new master st=%q err=%v", k, a.status, a.err, st, err)
		}
	}
	for k, a := range p.sendAll(after, 8) {
		if !a.replayed || a.body != afterAnswers[k].body || up.KeyCalls(k) != 1 {
			t.Errorf("%s resent after the failover: status %d replayed=%v executed %d times, want a replay", k, a.status, a.replayed, up.KeyCalls(k))
		}
	}
	// Recorded and replicated before the failover: replay, never re-execute.
	fleetWantReplayed(t, p, up, recorded, bodies)
	for _, b := range load.bad {
		t.Error(b)
	}
	final := load.settle(10 * time.Second)
	var strict, window int
	var again []string
	for k, first := range load.fresh {
		if f := final[k]; f.err != nil || f.status != http.StatusCreated {
			t.Errorf("fresh key %s: final status %d err %v", k, f.status, f.err)
		}
		n := up.KeyCalls(k)
		safe := (fleetExecuted(first) && load.doneAt[k].Before(replicatedAt)) || load.freshAt[k].After(switchedAt)
		switch {
		case safe:
			strict++
			if n != 1 {
				t.Errorf("fresh key %s (sent %s after the failover began, answered %d) executed %d times, want 1",
					k, load.freshAt[k].Sub(failoverAt), first.status, n)
			}
		default:
			window++
			if n > 1 {
				again = append(again, k)
			}
			if n > 2 {
				t.Errorf("window key %s executed %d times", k, n)
			}
		}
	}
	// The cause of each re-execution: the first record went to the old
	// master, which has not been demoted yet, so it still holds it.
	onOld := 0
	if role, _, err := redistest.Role(oldMaster); err == nil && role == "master" {
		for _, k := range again {
			// "c": completed there; "i": claimed there, and the completion
			// reached the new master, which had no claim (the proxy logs it).
			st, _ := fleetNodeClient(t, oldMaster).HGet(ctx, fleetRedisKey(k), "st").Result()
			switch {
			case st == "c":
				onOld++
			case st == "i" && p.log.keyHashes("answer not recorded: the claim was no longer in Redis")[fleetKeyHash(k)]:
				onOld++
			default:
				t.Logf("%s executed again; on the old master st=%q", k, st)
			}
		}
		if role, _, err := redistest.Role(oldMaster); err == nil && role == "master" && onOld != len(again) {
			t.Errorf("%d keys executed again, but only %d have a record on the old master", len(again), onOld)
		}
	}
	t.Logf("replica promoted %s after SENTINEL FAILOVER; proxy wrote to the new master %s after it and dropped its last connection to the old one after %s (no restart)",
		promoted.Round(time.Millisecond), followed.Round(time.Millisecond), switchedAt.Sub(failoverAt).Round(time.Millisecond))
	t.Logf("load: %v; %d fresh keys outside the loss window all executed once; %d keys sent in the window, %d of them executed again "+
		"(%d of those have their first record on the old master, which the failover discards)",
		load.status, strict, window, len(again), onOld)
}

// sentinelForeignConns counts the client connections of s that are neither the
// test's (named), a sentinel's (named sentinel-...), a replication link, nor
// the one asking: in these tests, the proxy's.
func sentinelForeignConns(t *testing.T, s *redistest.Server) int {
	// The test's pooled connection may have been killed by the failover
	// (Sentinel closes client connections when it reconfigures a node), and
	// these clients do not retry: ask again, a bounded number of times.
	var list string
	var err error
	for range 3 {
		if list, err = fleetNodeClient(t, s).ClientList(context.Background()).Result(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("CLIENT LIST on %s: %v", s.Addr(), err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		f := map[string]string{}
		for kv := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		// P: the purge watch's Pub/Sub connection, which writes no record;
		// it stays on the old master until Sentinel demotes it (~11 s).
		if f["name"] != "" || strings.ContainsAny(f["flags"], "SMP") || f["cmd"] == "client|list" {
			continue
		}
		n++
	}
	return n
}
