-- complete.lua: record the outcome of a claim, if the claim is still ours.
--
-- KEYS[1]  record key  <prefix>{<hash>} (fields: see claim.lua)
-- ARGV[1]  token       the claimant's token
-- ARGV[2]  record      'c': the encoded response (binary-safe); 'u': the status answered
-- ARGV[3]  TTL         ms; how long the record is kept (and replayed)
-- ARGV[4]  fingerprint of the claimed request (as in claim.lua)
-- ARGV[5]  upstream    as in claim.lua
-- ARGV[6]  state       'c' completed, or 'u' outcome unknown (ON_UNKNOWN=hold: the
--                      upstream timed out or broke off after the request was sent)
-- ARGV[7]  trace       '<trace-id>-<span-id>' of the execution, written as field tr;
--                      '' (tracing off, or not sampled): nothing is written
--
-- Reply: {"ok"}; {"lost"} when the record is held under another token (our
-- lock expired and another request took over, or an operator purged the key
-- and another request claimed it: nothing is written);
-- {"ok", "recreated"} when there was no record at all (lost in a failover, or
-- purged, and nobody has claimed the key since): the upstream did execute,
-- so the outcome is recorded anyway, with the claim's fingerprint;
-- {"ok", "late"} when our lock had expired (or the claim was held as unknown)
-- but nobody took the key over: the real answer wins over "unknown".
-- {"ok", "already"} when the record is unknown already under our token (a
-- request found our lock expired and held it, or the client resent the
-- script after losing the reply): not a new unknown outcome.
-- Completing twice with the same token answers "ok" again (the client
-- resent the script after losing the reply). A completed record is never
-- turned into an unknown one.
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok', 'ld')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function trace()
  if ARGV[7] and ARGV[7] ~= '' then
    redis.call('HSET', KEYS[1], 'tr', ARGV[7])
  end
end
if not cur[1] then
  redis.call('HSET', KEYS[1], 'st', ARGV[6], 'tok', ARGV[1], 'fp', ARGV[4], 'up', ARGV[5],
    'rec', ARGV[2], 'ct', string.format('%d', now))
  trace()
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'ok', 'recreated'}
end
if cur[2] ~= ARGV[1] then
  return {'lost'}
end
if cur[1] == 'c' then
  return {'ok'}
end
if cur[1] == ARGV[6] then
  return {'ok', 'already'}
end
redis.call('HSET', KEYS[1], 'st', ARGV[6], 'rec', ARGV[2], 'ct', string.format('%d', now))
trace()
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if cur[1] == 'u' or (cur[3] and tonumber(cur[3]) <= now) then
  return {'ok', 'late'}
end
return {'ok'}
