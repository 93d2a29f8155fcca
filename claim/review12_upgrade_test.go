package claim_test

import (
	"errors"
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

// TestReview12HoldOldFormatClaimNotReexecuted: rolling upgrade with
// ON_UNKNOWN=hold. A replica of the previous version claimed a key and
// died mid-request (a rolling upgrade is exactly when old replicas are
// stopped; one killed past its grace period leaves its claim in flight).
// Its record expires with its lock, but its ":m" claim mark says, for the
// key's TTL, that a claim was made and never completed. Contract case (c):
// with hold, "a claim is remembered past its lock TTL, for the key's TTL,
// and Part 1's lock-takeover ... re-execution windows are closed". The new
// claim.lua no longer reads the mark (it is not even passed as a key), so
// the retry claims the key afresh and the request executes a second time.
func TestReview12HoldOldFormatClaimNotReexecuted(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "old-inflight")
			// A lock long enough that a stalled test goroutine still finds it running.
			terms := holdTerms
			terms.LockTTL = time.Second
			oldClaim(t, be, key, fp("A"), terms.LockTTL, terms.TTL)
			if _, _, err := s.Acquire(ctx, key, fp("A"), terms); !errors.Is(err, claim.ErrInFlight) {
				t.Fatalf("within the old claim's lock: %v, want ErrInFlight", err)
			}
			be.advance(t, terms.LockTTL+250*time.Millisecond) // past the old lock: its record is gone, its mark is not
			lease, rec, err := s.Acquire(ctx, key, fp("A"), terms)
			var u *claim.UnknownError
			if !errors.As(err, &u) {
				t.Errorf("hold, old replica's abandoned claim: lease %v (taken over %v), record %v, err %v; want ErrUnknown (504), never a second execution",
					lease != nil, lease != nil && lease.TakenOver, rec, err)
			}
		})
	}
}

// TestReview12ExpireOldFormatClaimTakeoverReported: the same rolling
// upgrade with ON_UNKNOWN=expire. The old version reported the takeover of
// an abandoned claim (outcome takeover, idemproxy_takeover_claim_age_seconds)
// from its ":m" mark; the new claim.lua ignores the mark, so the first
// takeovers after an upgrade (the claims the upgrade itself abandoned) are
// reported as fresh executions.
func TestReview12ExpireOldFormatClaimTakeoverReported(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			s := claim.NewStore(be.rdb, "test:", nil)
			key := claim.NewKey(nil, "old-takeover")
			terms := claim.Terms{LockTTL: 100 * time.Millisecond, TTL: time.Hour}
			oldClaim(t, be, key, fp("A"), terms.LockTTL, terms.TTL)
			be.advance(t, 250*time.Millisecond)
			lease, _, err := s.Acquire(ctx, key, fp("A"), terms)
			if err != nil {
				t.Fatal(err)
			}
			if !lease.TakenOver || lease.TakeoverAge < 200*time.Millisecond {
				t.Errorf("claim after the old replica's lock expired: TakenOver %v age %v, want a takeover of about 250ms", lease.TakenOver, lease.TakeoverAge)
			}
		})
	}
}
