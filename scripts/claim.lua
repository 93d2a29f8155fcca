-- claim.lua: check-and-claim an idempotency key in one atomic step.
--
-- KEYS[1]  record key  <prefix>{<hash>}      hash: st, tok, fp, at, rec
-- KEYS[2]  claim mark  <prefix>{<hash>}:m    claim start (ms); outlives an abandoned claim
-- ARGV[1]  token       random, unique per claim (fences complete and release)
-- ARGV[2]  fingerprint sha-256 of method, path, query and body (32 raw bytes)
-- ARGV[3]  lock TTL    ms; the in-flight record expires by itself after it (PX)
-- ARGV[4]  mark TTL    ms; how long an abandoned claim is remembered for takeover metrics
-- ARGV[5]  upstream    short hash of UPSTREAM_ID ('' for none): a record made in front of
--                      one upstream is never replayed in front of another
--
-- Reply, first element a status:
--   {"claimed"}                 key was free; now in flight under ARGV[1]
--   {"takeover", "<age ms>"}    as claimed, but an earlier claim expired without
--                               completing; age is the time since that claim
--   {"mismatch"}                key is held (in flight or completed) for another fingerprint
--   {"otherupstream"}           key is held for a request sent to another upstream (records
--                               written before the field existed carry none and match)
--   {"inflight"}                key is in flight for this fingerprint (the proxy answers
--                               409 with Retry-After: 1 whatever the lock's time left)
--   {"replay", "<record>", "<pttl ms>"}
--                               key is completed for this fingerprint: the encoded
--                               record, and how long Redis keeps it still
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
    -- Our own claim: the client resent the script after losing the reply.
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
