package claim_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// oldClaimLua is scripts/claim.lua as of 632c74b, the version before the
// lock deadline moved into the record: what a replica not yet upgraded
// runs during a rolling upgrade.
const oldClaimLua = `
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'rec', 'tok', 'up')
if cur[1] then
  if cur[5] and cur[5] ~= '' and ARGV[5] ~= '' and cur[5] ~= ARGV[5] then
    return {'otherupstream'}
  end
  if cur[2] ~= ARGV[2] then
    return {'mismatch'}
  end
  if cur[1] == 'c' then
    return {'replay', cur[3], tostring(redis.call('PTTL', KEYS[1]))}
  end
  if cur[4] == ARGV[1] then
    return {'claimed'}
  end
  return {'inflight'}
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local prev = redis.call('GET', KEYS[2])
redis.call('HSET', KEYS[1], 'st', 'i', 'tok', ARGV[1], 'fp', ARGV[2], 'at', now, 'up', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], now, 'PX', ARGV[4])
if prev then
  return {'takeover', string.format('%d', tonumber(now) - tonumber(prev))}
end
return {'claimed'}
`

// oldClaim claims key as a replica of the previous version does: an
// in-flight record that expires with its lock (PEXPIRE), and a ":m" claim
// mark that remembers the claim for the key's TTL.
func oldClaim(t *testing.T, be backend, key claim.Key, f claim.Fingerprint, lock, ttl time.Duration) {
	t.Helper()
	rec := claim.RecordKey("test:", key)
	v, err := redis.NewScript(oldClaimLua).Run(ctx, be.rdb, []string{rec, rec + ":m"},
		"old-replica-token", f[:], lock.Milliseconds(), ttl.Milliseconds(), "").StringSlice()
	if err != nil || len(v) == 0 || v[0] != "claimed" {
		t.Fatalf("old claim.lua: %v %v", v, err)
	}
}

// TestOldVersionClaimAfterMarkDropped: a replica of a version before
// 2026-11-23 claimed a key and died mid-request. Its record expires with its
// lock, and its ":m" claim mark, which versions from 2026-11-23 to 2026-11
// read for one release, is no longer read (README, "Upgrading and rolling
// back": upgrade from those versions through one that reads it). While its
// lock lives the key is in flight, with either ON_UNKNOWN; after it, the
// next request claims the key as a new one (no takeover, not held as
// unknown), and the mark is left as it was, to expire with its TTL.
func TestOldVersionClaimAfterMarkDropped(t *testing.T) {
	for _, be := range backends(t) {
		for _, hold := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/hold=%v", be.name, hold), func(t *testing.T) {
				s := claim.NewStore(be.rdb, "test:", nil)
				key := claim.NewKey(nil, fmt.Sprintf("old-inflight-%v", hold))
				rec := claim.RecordKey("test:", key)
				// A lock long enough that a stalled test goroutine still finds it running.
				terms := claim.Terms{LockTTL: time.Second, TTL: time.Hour, Hold: hold}
				oldClaim(t, be, key, fp("A"), terms.LockTTL, terms.TTL)
				if _, _, err := s.Acquire(ctx, key, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
					t.Fatalf("within the old claim's lock: %v, want ErrInFlight", err)
				}
				mark := be.rdb.Get(ctx, rec+":m").Val()
				be.advance(t, terms.LockTTL+250*time.Millisecond) // past the old lock: its record is gone, its mark is not
				lease, _, err := s.Acquire(ctx, key, fp("A"), terms)
				if err != nil || lease == nil || lease.TakenOver {
					t.Fatalf("after the old claim's lock: lease %v, err %v; want a new claim (the mark is not read)", lease, err)
				}
				if got := be.rdb.Get(ctx, rec+":m").Val(); got != mark || mark == "" {
					t.Errorf("the old mark: %q after the claim, %q before; want it left as it was", got, mark)
				}
			})
		}
	}
}
