// Package leastdesign holds the scripts of onehash, the least design of a
// first request with the record kept as a hash (issue 14): the benchmark's
// reference for what idemproxy's own scripts cost Redis. ceilingproxy
// (-design onehash) runs them behind a bare proxy, redisfloor (-script
// onehash) with nothing but Redis: the same text in both, so the two
// figures price one design.
package leastdesign

import "github.com/redis/go-redis/v9"

// ClaimHash and CompleteHash are onehash's two scripts.
//
// ClaimHash: KEYS[1] the record key; ARGV token (16 bytes), fingerprint,
// lock TTL ms. Replies {"claimed"}, {"mismatch"}, {"replay", record} or
// {"inflight"}.
//
// CompleteHash: KEYS[1]; ARGV token, encoded record, record TTL ms. Replies
// "ok", or "lost" when the claim is not this token's.
var (
	ClaimHash    = redis.NewScript(claimHashLua)
	CompleteHash = redis.NewScript(completeHashLua)
)

// claimHashLua is onehash's claim: onewrite's with the record a
// hash, as idemproxy keeps it by default (RECORD_FORMAT=hash). Redis has no
// create-if-absent of a hash with a TTL: the claim is HSETNX of one field,
// c (token and fingerprint), and PEXPIRE NX of the lock TTL (the lock
// expires with the key, on Redis's clock). HSETNX answers for the field,
// not the key, so PEXPIRE's NX tells a key that was free (it had no TTL)
// from a hash that was there with one, which is left as it was and
// refused. (A hash without a TTL at the key is taken for a free key; no
// design here writes one.) A key that is there is then read (HMGET).
// ARGV: token, fingerprint, lock ms.
const claimHashLua = `
if redis.call('HSETNX', KEYS[1], 'c', ARGV[1] .. ARGV[2]) == 1 then
  if redis.call('PEXPIRE', KEYS[1], ARGV[3], 'NX') == 1 then
    return {'claimed'}
  end
  redis.call('HDEL', KEYS[1], 'c')
  return redis.error_reply('onehash: ' .. KEYS[1] .. ' holds a hash that is not its record')
end
local v = redis.call('HMGET', KEYS[1], 'c', 'rec')
if string.sub(v[1], 17) ~= ARGV[2] then
  return {'mismatch'}
end
if v[2] then
  return {'replay', v[2]}
end
if string.sub(v[1], 1, 16) == ARGV[1] then
  return {'claimed'} -- our own claim: the client resent the script after losing the reply
end
return {'inflight'}
`

// completeHashLua is onehash's completion: HGET of the claim,
// its token compared, HSET of the record and PEXPIRE of the record TTL. As
// with onewrite, nothing is written over another claim or an expired one.
// ARGV: token, encoded record, record TTL ms.
const completeHashLua = `
local v = redis.call('HGET', KEYS[1], 'c')
if not v or string.sub(v, 1, 16) ~= ARGV[1] then
  return 'lost'
end
redis.call('HSET', KEYS[1], 'rec', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 'ok'
`
