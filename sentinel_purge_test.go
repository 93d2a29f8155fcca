package main

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

// TestPurgeHeardAfterSentinelSwitchWithoutDemotion (review17e)
//
// Sentinel switches the master while the old one stays up and cannot be
// reconfigured by the sentinels (a partition between them and it; here its
// REPLICAOF is refused to them). The proxy, which still reaches the old
// master, follows the switch for its commands (go-redis drops its pooled
// connections to the old address on +switch-master), but its purge
// subscription stays on the old master: that node still answers PING and
// confirmed the subscription, so the replay cache stays on. The operator's
// `keys purge` deletes the record on the current master and announces it
// there; its extra announcement on the old master fails (here refused, as
// if unreachable), and keys purge then says "a proxy subscribed there drops
// its replay cache when it subscribes again", which never happened: the
// subscription never broke, and the replica kept replaying the purged answer
// from memory (up to the cache's max age, 1 min). Now the watch's probe,
// published where purges are, does not come back: within two probe periods
// the cache is off and a new subscription lands on the new master.
func TestPurgeHeardAfterSentinelSwitchWithoutDemotion(t *testing.T) {
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
	a, logs := startEnv(t, append([]string{"UPSTREAM_URL=" + up.URL, "REDIS_USERNAME=proxy", "REDIS_PASSWORD=pw",
		"LISTEN_ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0"}, sentinelEnv...)...)
	c := newClient(t)
	url := "http://" + a.proxyAddr.String() + "/v1/orders"
	first := cachedAnswer(t, c, a, "switch")
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
				strings.TrimSpace(errOut), r.body, old.Addr(), role, subs["idem:purge"], nm.Addr(), strings.Contains(logs.String(), "purge subscription failed"))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKeysForgetOnEveryNode: with Sentinel, keys forget announces on every
// data node, as purge does (a proxy's subscription may still be on a node
// the master's PUBLISH does not reach). A subscriber on the replica hears
// the master's announcement through replication and, announced on every
// node, the replica's own as well.
func TestKeysForgetOnEveryNode(t *testing.T) {
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
