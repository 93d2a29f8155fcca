package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/scripts"
)

// TestHashDuplicateCommands: the hash claim reads Redis's clock and writes
// first (TIME, HSETNX of st), as the string claim does, so a duplicate that
// reaches Redis runs those before the HMGET, and writes nothing: HSETNX on a
// record answers 0.
func TestHashDuplicateCommands(t *testing.T) {
	checkDuplicateCommands(t, "", func(rdb *redis.Client, key, st string, now int64) {
		f := []any{"st", st, "tok", r75other, "fp", r75fp, "up", r75up, "at", fmt.Sprint(now), "ld", fmt.Sprint(now + 60000)}
		if st == "c" {
			f = append(f, "rec", "ANSWER", "ct", fmt.Sprint(now))
		}
		if err := rdb.HSet(ctx, key, f...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.PExpire(ctx, key, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1, "pttl": 1}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1}, map[string]int64{"time": 1, "hsetnx": 1, "hmget": 1})
}

// TestHashClaimOverHashWithoutState: a hash at the key without st is not a
// record, and a claim overwrites it as if the key were free, as it did before
// the claim wrote first: HSETNX sets st, and the claim's other fields follow.
func TestHashClaimOverHashWithoutState(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	cur := redis.NewScript(scripts.Claim)
	key := "hwf:{foreign}"
	if err := rdb.HSet(ctx, key, "x", "y", "tok", "someone-elses-tk").Err(); err != nil {
		t.Fatal(err)
	}
	v, err := cur.Run(ctx, rdb, []string{key}, r75tok, r75fp, 30000, 600000, r75up, "", "", "").Slice()
	if err != nil || len(v) != 1 || v[0] != "claimed" {
		t.Fatalf("claim over a hash without st: %v %v", v, err)
	}
	h := rdb.HGetAll(ctx, key).Val()
	if h["st"] != "i" || h["tok"] != r75tok || h["fp"] != r75fp || h["up"] != r75up || h["at"] == "" || h["ld"] == "" {
		t.Errorf("the claim's record: %v", h)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 600*time.Second {
		t.Errorf("the claim's TTL %v, want the key TTL (10m)", ttl)
	}
}

// TestHashClaimErrorLeavesNothing (review 78): the hash claim writes st
// first, so whatever fails after it must not leave a state without the rest
// of its record: a lock nobody holds, without a TTL, which every later claim
// of the key would answer as another fingerprint's (422) for good. A bad
// lock TTL or a short argument list fail before HSETNX; an HSET the server
// refuses (an ACL without it) takes st back.
func TestHashClaimErrorLeavesNothing(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nohset", "on", ">pw", "~*", "&*", "+@all", "-hset").Err(); err != nil {
		t.Fatal(err)
	}
	nohset := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nohset", Password: "pw"})
	t.Cleanup(func() { _ = nohset.Close() })
	cur := redis.NewScript(scripts.Claim)
	for _, tc := range []struct {
		name string
		rdb  *redis.Client
		args []any
	}{
		{"lock TTL not a number", admin, []any{r75tok, r75fp, "30s", 600000, r75up, "", "", ""}},
		{"four arguments", admin, []any{r75tok, r75fp, 30000, 600000}},
		{"HSET refused (ACL)", nohset, []any{r75tok, r75fp, 30000, 600000, r75up, "", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "hwf:{err " + tc.name + "}"
			if err := cur.Run(ctx, tc.rdb, []string{key}, tc.args...).Err(); err == nil {
				t.Fatal("the bad call succeeded")
			}
			if typ := admin.Type(ctx, key).Val(); typ != "none" {
				t.Errorf("the failed claim left a %s: %v, PTTL %v", typ, admin.HGetAll(ctx, key).Val(), admin.PTTL(ctx, key).Val())
			}
			v, err := cur.Run(ctx, admin, []string{key}, r75tok, r75fp, 30000, 600000, r75up, "", "", "").Slice()
			if err != nil || len(v) != 1 || v[0] != "claimed" {
				t.Errorf("the next good claim: %v %v, want claimed", v, err)
			}
		})
	}
}
