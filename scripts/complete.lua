-- complete.lua: record the response of a claim, if the claim is still ours.
--
-- KEYS[1]  record key  <prefix>{<hash>}
-- KEYS[2]  claim mark  <prefix>{<hash>}:m
-- ARGV[1]  token       the claimant's token
-- ARGV[2]  record      encoded response (binary-safe)
-- ARGV[3]  TTL         ms; how long the completed record is kept and replayed
-- ARGV[4]  fingerprint of the claimed request (as in claim.lua)
-- ARGV[5]  upstream    as in claim.lua
--
-- Reply: {"ok"}; {"lost"} when the record is held under another token (our
-- lock expired and another request took over: nothing is written);
-- {"ok", "recreated"} when there was no record at all (our lock expired, or
-- the claim was lost in a failover, and nobody has claimed the key since):
-- the upstream did execute, so its answer is recorded anyway, with the
-- claim's fingerprint, and a retry replays it instead of executing again.
-- Completing twice with the same token answers "ok" again (the client
-- resent the script after losing the reply); the token stays in the record
-- for that.
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if not cur[1] then
  redis.call('HSET', KEYS[1], 'st', 'c', 'tok', ARGV[1], 'fp', ARGV[4], 'up', ARGV[5], 'rec', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('DEL', KEYS[2])
  return {'ok', 'recreated'}
end
if cur[2] ~= ARGV[1] then
  return {'lost'}
end
if cur[1] == 'c' then
  return {'ok'}
end
redis.call('HSET', KEYS[1], 'st', 'c', 'rec', ARGV[2])
redis.call('HDEL', KEYS[1], 'at')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
return {'ok'}
