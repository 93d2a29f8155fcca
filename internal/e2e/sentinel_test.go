package e2e

// Tests against a real Redis Sentinel deployment: 1 master, 1 replica and 3
// sentinels, their own redis-server processes on free loopback ports
// (internal/redistest); the binary, and idemproxy keys.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
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
	t.Parallel()
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
			case st == "i" && p.keyHashes("answer not recorded: the claim was no longer in Redis")[fleetKeyHash(k)]:
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

// TestSentinelPassword: sentinels that require a password. With
// REDIS_SENTINEL_PASSWORD the proxy finds the master through them and
// replays; without it, /readyz is 503 and keyed requests fail closed. The
// seeds are given with blanks after the commas (REDIS_ADDRS is trimmed).
func TestSentinelPassword(t *testing.T) {
	t.Parallel()
	const pw = "sentinel-s3cret"
	s := redistest.StartSentinelWith(t, redistest.SentinelOptions{Password: pw})
	up := newUpstream(t)
	base := []string{"UPSTREAM_URL=" + up.URL,
		"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ", "), "REDIS_MASTER_NAME=" + s.MasterName()}
	c := newClient(t)

	a := startReady(t, append(base, "REDIS_SENTINEL_PASSWORD="+pw)...)
	u := a.url("/v1/orders")
	first := mustPost(t, c, u, "sent-1", `{"n":1}`)
	second := mustPost(t, c, u, "sent-1", `{"n":1}`)
	if first.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" || second.body != first.body {
		t.Errorf("with the sentinel password: got %v then %v replayed=%q, want 201 then its replay", first.status, second.status, second.header.Get("Idempotent-Replayed"))
	}
	if got := up.Calls.Load(); got != 1 {
		t.Errorf("upstream calls: got %v, want 1", got)
	}
	if strings.Contains(a.logs()+a.stderr.String(), pw) {
		t.Errorf("log shows the sentinel password")
	}

	b := startProxy(t, base...)
	status, body, err := get(c, b.adminURL(t, "/readyz"))
	if err != nil || status != http.StatusServiceUnavailable {
		t.Errorf("/readyz without the sentinel password: got %v %v %q, want 503", status, err, body)
	}
	if r := mustPost(t, c, b.url("/v1/orders"), "sent-2", `{"n":2}`); r.status != http.StatusServiceUnavailable {
		t.Errorf("POST without the sentinel password: got %v %q, want 503", r.status, r.body)
	}
	if got := up.Calls.Load(); got != 1 {
		t.Errorf("upstream calls: got %v, want 1", got)
	}
}

// TestPurgeHeardAfterSentinelFailover: after a Sentinel failover the
// proxy's purge subscription stays on the old master (go-redis's
// FailoverClient filters its command pools on +switch-master, not its
// PubSub connections), while `keys purge` deletes and publishes on the new
// master. Until Sentinel reconfigures the old master (seconds later), the
// announcement never reached the proxy, whose replay cache kept replaying
// the purged record: "every replica's replay cache stops replaying a purged
// key within 1 s" did not hold across a failover. keys purge now announces
// on every data node the sentinels name.
func TestPurgeHeardAfterSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	up := newFleetUpstream(t)
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=" + s.MasterName()}
	p := startFleetProxy(t, up.URL, env...)
	p.waitReplayCacheOn(t) // else both replays come from Redis, and the purge is obeyed whatever happens to it
	k := fleetKeys("failover-purge", 1)[0]
	if a := p.send(k); !fleetExecuted(a) {
		t.Fatalf("first send: %d %v", a.status, a.err)
	}
	redistest.WaitReplicated(t, s.Master(), s.Replica(), 5*time.Second)
	var hits float64
	for i := range 2 { // a replay from Redis, then one from the replay cache
		if i == 1 {
			hits = p.metric(t, "idemproxy_replay_cache_hits_total")
		}
		if a := p.send(k); !a.replayed {
			t.Fatalf("before the failover: status %d replayed=%v", a.status, a.replayed)
		}
	}
	if n := p.metric(t, "idemproxy_replay_cache_hits_total") - hits; n != 1 {
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

// TestPurgeHeardAfterSentinelSwitchWithoutDemotion: Sentinel switches the
// master while the old one stays up and cannot be reconfigured by the
// sentinels (a partition between them and it; here its REPLICAOF is refused
// to them). The proxy, which still reaches the old master, follows the switch
// for its commands (go-redis drops its pooled connections to the old address
// on +switch-master), but its purge subscription stays on the old master:
// that node still answers PING and confirmed the subscription, so the replay
// cache stays on. The operator's `keys purge` deletes the record on the
// current master and announces it there; its extra announcement on the old
// master fails (here refused, as if unreachable), and keys purge then says "a
// proxy subscribed there drops its replay cache when it subscribes again",
// which never happened: the subscription never broke, and the replica kept
// replaying the purged answer from memory (up to the cache's max age, 1 min).
// Now the watch's probe, published where purges are, does not come back:
// within two probe periods the cache is off and a new subscription lands on
// the new master.
func TestPurgeHeardAfterSentinelSwitchWithoutDemotion(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t)
	ctx := context.Background()
	old, replica := sn.Master(), sn.Replica()
	for _, n := range []*redistest.Server{old, replica} {
		for _, u := range [][]any{
			{"ACL", "SETUSER", "proxy", "on", ">pw", "~*", "&*", "+@all"},
			{"ACL", "SETUSER", "operator", "on", ">op", "~*", "&*", "+@all"},
		} {
			if err := n.Client().Do(ctx, u...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	sentinelEnv := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(sn.Addrs(), ","), "REDIS_MASTER_NAME=" + sn.MasterName()}
	up := newUpstream(t)
	a := startProxy(t, append([]string{"UPSTREAM_URL=" + up.URL, "REDIS_USERNAME=proxy", "REDIS_PASSWORD=pw"}, sentinelEnv...)...)
	c := newClient(t)
	url := a.url("/v1/orders")
	first := a.cachedAnswer(t, c, "switch")
	redistest.WaitReplicated(t, old, replica, 10*time.Second)
	// The partition: the sentinels cannot demote the old master, nor can the
	// operator's announcement reach it.
	if err := old.Client().Do(ctx, "ACL", "SETUSER", "default", "-slaveof", "-replicaof").Err(); err != nil {
		t.Fatal(err)
	}
	if err := old.Client().Do(ctx, "ACL", "SETUSER", "operator", "-publish").Err(); err != nil {
		t.Fatal(err)
	}
	nm := sn.Failover(20 * time.Second)
	t.Logf("switch %s -> %s", old.Addr(), nm.Addr())
	// The proxy's commands reach the new master.
	base, _ := nm.Client().DBSize(ctx).Result()
	for i := 0; ; i++ {
		if r := post(c, url, "probe-"+strconv.Itoa(i), `{}`); r.status == http.StatusCreated {
			if n, _ := nm.Client().DBSize(ctx).Result(); n > base {
				break
			}
		}
		if i == 100 {
			t.Fatal("the proxy never wrote to the new master")
		}
		time.Sleep(100 * time.Millisecond)
	}

	operator := append([]string{"REDIS_USERNAME=operator", "REDIS_PASSWORD=op"}, sentinelEnv...)
	out, errOut, code := keysRun(t, operator, "purge", strings.TrimSpace(keysOK(t, operator, "hash", "switch")))
	if code != 0 || !strings.Contains(out, `"purged":true`) {
		t.Fatalf("keys purge: exit %d %q %q", code, out, errOut)
	}
	purged := time.Now()
	for {
		r := mustPost(t, c, url, "switch", `{}`)
		if r.body != first.body {
			break
		}
		// The watch notices within two probe periods (20 s) that it no
		// longer hears what is published where purges are.
		if time.Since(purged) > 25*time.Second {
			role, _, _ := redistest.Role(old)
			subs, _ := old.Client().PubSubNumSub(ctx, "idem:purge").Result()
			t.Errorf("25 s after keys purge (exit 0, purged:true; stderr %q) the replica still replays the purged answer %q from its cache: "+
				"its purge subscription is still on the old master %s (ROLE %s, subscribers %v), which the proxy's commands left for %s; "+
				"\"purge subscription failed\" logged: %v",
				strings.TrimSpace(errOut), r.body, old.Addr(), role, subs["idem:purge"], nm.Addr(), strings.Contains(a.logs(), "purge subscription failed"))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKeysWrongMasterNameNamesIt: REDIS_MASTER_NAME with a typo (or the
// chart's default "mymaster" against sentinels that monitor "redis-ha").
// Every sentinel answers, each saying it monitors no such master; keys used
// to report "Redis (REDIS_MODE=sentinel REDIS_ADDRS=...): ... all sentinels
// specified in configuration are unreachable: redis: nil", a message that
// names neither REDIS_MASTER_NAME nor its value, and says the reverse of
// what happened (the sentinels were reached): at 3 a.m. the operator goes
// after the network.
func TestKeysWrongMasterNameNamesIt(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=mymastr"}
	hash := claim.NewKey([]string{""}, "k").String()
	for _, args := range [][]string{{"get", hash}, {"list"}, {"purge", hash}} {
		_, errOut, code := keysRun(t, env, append(args, "--timeout", "5s")...)
		if code != 1 || !strings.Contains(errOut, `REDIS_MASTER_NAME`) || !strings.Contains(errOut, "mymastr") || strings.Contains(errOut, "unreachable") {
			t.Errorf("keys %s with sentinels that monitor %q and REDIS_MASTER_NAME=mymastr: exit %d, stderr %q; want exit 1 and a message naming REDIS_MASTER_NAME=\"mymastr\" (unknown to the sentinels), not \"unreachable\"",
				args[0], s.MasterName(), code, strings.TrimSpace(errOut))
		}
	}
}

// TestProxyWrongMasterNameNamesIt: the proxy's own log says the same as
// keys: not "unreachable", but which REDIS_MASTER_NAME no sentinel knows.
func TestProxyWrongMasterNameNamesIt(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	up := newUpstream(t)
	p := startProxy(t, "UPSTREAM_URL="+up.URL, "ADMIN_ADDR=",
		"REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=mymastr")
	// Logged at start, before the start line, at error level: written at once.
	if out := p.logs(); !strings.Contains(out, `REDIS_MASTER_NAME=\"mymastr\"`) || !strings.Contains(out, "none monitors a master of that name") {
		t.Errorf("proxy log with REDIS_MASTER_NAME=mymastr (sentinels monitor %q): want the name and \"none monitors a master of that name\"; got:\n%s", s.MasterName(), out)
	}
}

// TestKeysSentinel: get and purge through the sentinels.
func TestKeysSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	up := newFleetUpstream(t)
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(s.Addrs(), ","), "REDIS_MASTER_NAME=" + s.MasterName()}
	p := startFleetProxy(t, up.URL, env...)
	k := fleetKeys("sentinel", 1)[0]
	if a := p.send(k); !fleetExecuted(a) {
		t.Fatalf("first send: %d %v", a.status, a.err)
	}
	if out := keysOK(t, env, "get", fleetKeyHash(k)); !strings.Contains(out, `"state":"completed","status":201`) {
		t.Errorf("keys get via sentinel: %s", out)
	}
	if out := keysOK(t, env, "purge", fleetKeyHash(k)); !strings.Contains(out, `"purged":true`) {
		t.Errorf("keys purge via sentinel: %s", out)
	}
	if a := p.send(k); !fleetExecuted(a) || up.KeyCalls(k) != 2 {
		t.Errorf("after purge: status %d replayed=%v calls %d; want executed again", a.status, a.replayed, up.KeyCalls(k))
	}
}

// TestKeysForgetOnEveryNode: with Sentinel, keys forget announces on every
// data node, as purge does (a proxy's subscription may still be on a node
// the master's PUBLISH does not reach). A subscriber on the replica hears
// the master's announcement through replication and, announced on every
// node, the replica's own as well.
func TestKeysForgetOnEveryNode(t *testing.T) {
	t.Parallel()
	sn := redistest.StartSentinel(t)
	ctx := context.Background()
	sub := sn.Replica().Client().Subscribe(ctx, claim.PurgeChannel("idem:"))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(sn.Addrs(), ","), "REDIS_MASTER_NAME=" + sn.MasterName()}
	hash := strings.TrimSpace(keysOK(t, env, "hash", "forget-me"))
	if out := keysOK(t, env, "forget", hash); !strings.Contains(out, `"announced":true`) {
		t.Fatalf("keys forget: %s", out)
	}
	heard := 0
	for heard < 2 {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := sub.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			break
		}
		if m.Payload == hash {
			heard++
		}
	}
	if heard < 2 {
		t.Errorf("the replica's subscriber heard the forget %d time(s), want at least 2 (through replication, and announced on the replica itself)", heard)
	}
}
