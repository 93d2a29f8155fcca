-- claim.lua: check-and-claim an idempotency key in one atomic step.
--
-- KEYS[1]  record key  <prefix>{<hash>}, a hash:
--            st   'i' in flight, 'c' completed, 'u' outcome unknown (ON_UNKNOWN=hold)
--            tok  token of the claim that wrote it (fences complete and release)
--            fp   fingerprint; up: upstream hash; at: claim start (ms, Redis clock)
--            ld   lock deadline (ms, Redis clock) while in flight
--            ct   when it was completed or became unknown (ms)
--            rec  'c': the encoded response; 'u': the status answered (502, 504)
--            tr   'c', only with tracing: '<trace-id>-<span-id>' of the execution (hex)
-- KEYS[2]  claim mark  <prefix>{<hash>}:m, written only by versions before the lock deadline
--                      lived in the record: it outlived their abandoned claims (read, for an
--                      upgrade, when there is no record; never written)
-- ARGV[1]  token       random, unique per claim
-- ARGV[2]  fingerprint sha-256 of what the profile compares (32 raw bytes)
-- ARGV[3]  lock TTL    ms; the claim holds the key this long (judged on Redis TIME)
-- ARGV[4]  key TTL     ms; how long the record lives, in flight included: an abandoned
--                      claim is remembered so that its takeover is reported, or, with
--                      hold, so that it turns unknown instead of executing again
-- ARGV[5]  upstream    short hash of UPSTREAM_ID ('' for none): a record made in front of
--                      one upstream is never replayed in front of another
-- ARGV[6]  '1' hold    an in-flight claim whose lock expired becomes unknown (504)
--
-- Reply, first element a status:
--   {"claimed"}                 key was free; now in flight under ARGV[1]
--   {"takeover", "<age ms>"}    as claimed, but an earlier claim's lock expired without
--                               completing; age is the time since that claim began
--   {"mismatch"}                key is held (in flight, completed, unknown) for another fingerprint
--   {"otherupstream"}           key is held for a request sent to another upstream (records
--                               written before the field existed carry none and match)
--   {"inflight"}                key is in flight for this fingerprint
--   {"replay", "<record>", "<pttl ms>"}
--                               key is completed for this fingerprint
--   {"replay", "<record>", "<pttl ms>", "<tr>"}
--                               ... and its execution was traced (field tr)
--   {"unknown", "<status>"}     the key's outcome is unknown (held for an operator);
--   {"unknown", "504", "held"}  ... and this request found its lock expired and held it
--
-- Records of versions before 'ld' existed expire with their lock (PEXPIRE) and
-- are in flight until then; their abandoned claims are found by the mark.
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'rec', 'tok', 'up', 'ld', 'at', 'tr')
local now = nil -- Redis's clock, read only when a lock is judged or written
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local prev = nil
if cur[1] then
  local expired = cur[1] == 'i' and cur[6] and tonumber(cur[6]) <= clock()
  if expired and cur[4] ~= ARGV[1] and ARGV[6] ~= '1' then
    -- A lock that expired frees the key, whatever the request that held it.
    prev = cur[7]
  else
    if cur[5] and cur[5] ~= '' and ARGV[5] ~= '' and cur[5] ~= ARGV[5] then
      return {'otherupstream'}
    end
    if cur[2] ~= ARGV[2] then
      return {'mismatch'}
    end
    if cur[1] == 'c' then
      local pttl = tostring(redis.call('PTTL', KEYS[1]))
      if cur[8] then
        return {'replay', cur[3], pttl, cur[8]}
      end
      return {'replay', cur[3], pttl}
    end
    if cur[1] == 'u' then
      return {'unknown', cur[3]}
    end
    if cur[4] == ARGV[1] then
      -- Our own claim: the client resent the script after losing the reply.
      return {'claimed'}
    end
    if not expired then
      return {'inflight'}
    end
    -- hold: the claimant died or lost Redis; the request may have run.
    redis.call('HSET', KEYS[1], 'st', 'u', 'rec', '504', 'ct', string.format('%d', now))
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return {'unknown', '504', 'held'}
  end
end

if not cur[1] then
  local mark = redis.call('GET', KEYS[2])
  if mark then
    -- An abandoned claim of an earlier version: its lock expired with its record.
    redis.call('DEL', KEYS[2])
    if ARGV[6] == '1' then
      local snow = string.format('%d', clock())
      redis.call('HSET', KEYS[1], 'st', 'u', 'tok', '', 'fp', ARGV[2], 'up', ARGV[5], 'rec', '504',
        'at', mark, 'ct', snow)
      redis.call('PEXPIRE', KEYS[1], ARGV[4])
      return {'unknown', '504', 'held'}
    end
    prev = mark
  end
end

local snow = string.format('%d', clock())
redis.call('HSET', KEYS[1], 'st', 'i', 'tok', ARGV[1], 'fp', ARGV[2], 'at', snow,
  'ld', string.format('%d', now + tonumber(ARGV[3])), 'up', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if prev then
  return {'takeover', string.format('%d', now - tonumber(prev))}
end
return {'claimed'}
