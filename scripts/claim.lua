-- claim.lua: check-and-claim an idempotency key in one atomic step.
--
-- KEYS[1]  record key  <prefix>{<hash>}, a hash (RECORD_FORMAT=hash) or a string
--                      (RECORD_FORMAT=string) holding the same fields:
--            st   'i' in flight, 'c' completed, 'u' outcome unknown (ON_UNKNOWN=hold)
--            tok  token of the claim that wrote it (fences complete and release)
--            fp   fingerprint; up: upstream hash; at: claim start (ms, Redis clock)
--            ld   lock deadline (ms, Redis clock) while in flight
--            ct   when it was completed or became unknown (ms)
--            rec  'c': the encoded response; 'u': the status answered (502, 504)
--            tr   'c', only with tracing: '<trace-id>-<span-id>' of the execution (hex)
--          Every script reads both forms, whatever it writes: replicas of either setting
--          share one Redis during a rollout, and a record keeps its form until rewritten.
--          Versions before 2026-11-23 also wrote a claim mark <key>:m beside an
--          in-flight record; it is no longer read (nor declared: a key that is not
--          there is refused while Redis Cluster migrates its slot). See README,
--          "Upgrading and rolling back".
-- ARGV[1]  token       random, unique per claim
-- ARGV[2]  fingerprint sha-256 of what the profile compares (32 raw bytes)
-- ARGV[3]  lock TTL    ms; the claim holds the key this long (judged on Redis TIME)
-- ARGV[4]  key TTL     ms; how long the record lives, in flight included: an abandoned
--                      claim is remembered so that its takeover is reported, or, with
--                      hold, so that it turns unknown instead of executing again
-- ARGV[5]  upstream    short hash of UPSTREAM_ID ('' for none): a record made in front of
--                      one upstream is never replayed in front of another
-- ARGV[6]  '1' hold    an in-flight claim whose lock expired becomes unknown (504)
-- ARGV[7]  's'         write records as strings (RECORD_FORMAT=string); else as hashes
-- ARGV[8]  max replay  bytes; a completed record whose reply would carry more is not sent,
--                      only its size ('' or absent: any size): the caller reads it by a
--                      second call once it has counted that much memory for it
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
--   {"replay", "<string>", "<pttl ms>", "<tr or ''>", "<offset>"}
--                               ... kept as a string record: the whole string, and the
--                               1-based position where the encoded response starts in
--                               it (handed over whole, not copied out inside Redis)
--   {"large", "<bytes>"}        key is completed for this fingerprint, and the replay reply
--                               would carry more than ARGV[8] bytes (nothing else sent)
--   {"unknown", "<status>"}     the key's outcome is unknown (held for an operator);
--   {"unknown", "504", "held"}  ... and this request found its lock expired and held it
--
-- Records of versions before 'ld' existed expire with their lock (PEXPIRE) and
-- are in flight until then.

local S = ARGV[7] == 's'

-- The fast paths, first and without a function or a table: a key with no
-- record, as every first request finds it. Lua's closures and tables are
-- garbage Redis collects on its own time; the general path below, behind the
-- codec, makes them, for every other case. Both read Redis's clock first,
-- and compute what the claim's record needs, before they write: the general
-- path judges locks on the same now. refused, SET NX's answer, is handed on
-- to the general path.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at, ld = string.format('%d', now), string.format('%d', now + tonumber(ARGV[3]))
local refused
if S then
  -- Write first: SET NX is the read for a key with no record, so a first
  -- request costs TIME and one write. It answers false for any key that is
  -- there (a string record, a hash, another type), which the general path
  -- then reads. A Redis that refuses writes (NOREPLICAS, READONLY, OOM,
  -- MISCONF) refuses SET NX before looking at the key; its error stands only
  -- if there is no record to answer from (the general path).
  -- enc({st = 'i', tok, fp, up, at, ld}); the arguments' lengths are the
  -- client's: 16, 32, 16 or 0.
  refused = redis.pcall('SET', KEYS[1], 'R2' .. string.char(1, #ARGV[1], #ARGV[2], #ARGV[5], #at, #ld, 0, 0) ..
    'i' .. ARGV[1] .. ARGV[2] .. ARGV[5] .. at .. ld, 'NX', 'PX', ARGV[4])
  if refused and not refused.err then
    return {'claimed'}
  end
else
  -- Write first here too: HSETNX of st creates the record when the key
  -- has none, and sets st on a hash that has no st (not a record, which a
  -- claim overwrites as if absent, as it always did); it answers 0 for a
  -- record, an error for another type or a Redis that refuses writes, and
  -- the general path then reads the key. TIME and everything the record's
  -- fields need come first, as for strings: a state without the rest of its
  -- record would be a lock nobody holds, without a TTL. So once HSETNX has
  -- written, only HSET and PEXPIRE follow, and an HSET the server refuses
  -- (an ACL) takes the state back; a Redis that replicates scripts verbatim
  -- refuses HSETNX after TIME, before anything is written.
  if #ARGV >= 5 and redis.pcall('HSETNX', KEYS[1], 'st', 'i') == 1 then
    local r = redis.pcall('HSET', KEYS[1], 'tok', ARGV[1], 'fp', ARGV[2], 'at', at, 'ld', ld, 'up', ARGV[5])
    if type(r) == 'table' and r.err then
      redis.call('HDEL', KEYS[1], 'st')
      return r
    end
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return {'claimed'}
  end
end

-- record codec (the same in claim, complete, release and inspect.lua; a test
-- compares them). A string record is 'R2', the lengths of st, tok, fp, up, at,
-- ld, ct and tr in one byte each, those eight fields, then rec to the end.
-- Empty fields read as absent (false), as HMGET reads a missing hash field.
-- rec can be megabytes, and every copy of it in Lua is one more of its size in
-- Lua's heap: dec leaves it where it is and says where it starts; setString
-- writes a large one with SETRANGE instead of concatenating it. Each table
-- and string a script makes is Lua garbage that Redis collects on its own
-- time, so the paths every request takes (claim.lua's SET NX, complete.lua's
-- in-flight record) build their strings directly, without dec or enc.
local function nz(s)
  return s ~= '' and s
end
local function dec(v)
  local a, b, c, d, e, f, g, h = string.byte(v, 3, 10)
  if not h or string.sub(v, 1, 2) ~= 'R2' then
    return nil
  end
  local p2 = 11 + a
  local p3 = p2 + b
  local p4 = p3 + c
  local p5 = p4 + d
  local p6 = p5 + e
  local p7 = p6 + f
  local p8 = p7 + g
  local p9 = p8 + h
  if p9 > #v + 1 then
    return nil
  end
  local sub = string.sub
  return {st = nz(sub(v, 11, p2 - 1)), tok = nz(sub(v, p2, p3 - 1)), fp = nz(sub(v, p3, p4 - 1)),
    up = nz(sub(v, p4, p5 - 1)), at = nz(sub(v, p5, p6 - 1)), ld = nz(sub(v, p6, p7 - 1)),
    ct = nz(sub(v, p7, p8 - 1)), tr = nz(sub(v, p8, p9 - 1))}, p9
end
local function enc(r)
  local st, tok, fp, up = r.st or '', r.tok or '', r.fp or '', r.up or ''
  local at, ld, ct, tr = r.at or '', r.ld or '', r.ct or '', r.tr or ''
  if math.max(#st, #tok, #fp, #up, #at, #ld, #ct, #tr) > 255 then
    error({err = 'idemproxy: a record field is longer than a string record holds (255 bytes)'})
  end
  return 'R2' .. string.char(#st, #tok, #fp, #up, #at, #ld, #ct, #tr) .. st .. tok .. fp .. up .. at .. ld .. ct .. tr
end
-- setString writes head (an encoded record without rec) and rec as key's
-- string for ttl ms. A rec over 64 KiB is not copied in Lua: SETRANGE puts
-- it after the head's place in the key as it is (a small record, or none),
-- then the head before it. Its first write is that SETRANGE: over maxmemory
-- or proto-max-bulk-len Redis refuses it before anything has changed, and
-- the key is never missing (a missing key in a slot that Cluster is moving
-- is refused); a key of another type is refused there too (complete.lua
-- keeps a large record over a hash claim a hash). SETRANGE grows a string
-- that is there greedily (to twice its length, or 1 MiB more), kept for the
-- record's life: BITOP OR of the key onto itself then copies it at its
-- exact length (Redis's time: about 0.7 ms a MiB). A user whose ACL lacks
-- BITOP (@bitmap) keeps the record as SETRANGE left it, with its TTL.
local function setString(key, head, rec, ttl)
  if #rec <= 65536 then
    redis.call('SET', key, head .. rec, 'PX', ttl)
    return
  end
  local form = redis.call('TYPE', key).ok
  redis.call('SETRANGE', key, #head, rec)
  redis.call('SETRANGE', key, 0, head)
  if form == 'string' then
    redis.pcall('BITOP', 'OR', key, key)
  end
  redis.call('PEXPIRE', key, ttl)
end
local function notrecord()
  return redis.error_reply('idemproxy: ' .. KEYS[1] .. ' holds a string that is not a record')
end
-- ('R1' was another layout, of unreleased commits: it reads as not a record.)
-- end of record codec

-- The record's form: 'h' a hash, 's' a string, false none. A hash without st
-- (not a record) is overwritten as if absent, as it always was. A string
-- record's rec stays in raw, from recAt on (see dec); cur.rec holds it only
-- when it is not an answer (an unknown record's status, or empty).
local kind, cur, raw, recAt = false, false, nil, nil
local function readString(v)
  raw = v
  kind, cur, recAt = 's', dec(v)
  if cur and cur.st ~= 'c' then
    cur.rec = nz(string.sub(v, recAt))
  end
  return cur
end
-- readHash reads the hash's fields (HMGET) as the record, its empty fields
-- absent as dec reads them.
local function readHash()
  local h = redis.pcall('HMGET', KEYS[1], 'st', 'fp', 'rec', 'tok', 'up', 'ld', 'at', 'tr', 'ct')
  if h.err then
    return h
  end
  if h[1] then
    kind, cur = 'h', {st = nz(h[1]), fp = nz(h[2]), rec = nz(h[3]), tok = nz(h[4]), up = nz(h[5]), ld = nz(h[6]),
      at = nz(h[7]), tr = nz(h[8]), ct = nz(h[9])}
  end
end
if S then
  -- SET NX found the key there, or was refused.
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'string' then
    if not readString(v) then
      return notrecord()
    end
  else
    -- No string: a hash (WRONGTYPE), another type (the same, and HMGET's
    -- error stands), or nothing, when SET NX was refused.
    local e = readHash()
    if e then
      return e
    end
    if refused and not cur then
      return refused -- refused, and no record to answer from
    end
  end
elseif readHash() then
  local v = redis.call('GET', KEYS[1])
  if not v or not readString(v) then
    return notrecord()
  end
end

-- put writes record r whole, in the form this replica writes, for ttl ms.
local function put(r, ttl)
  if S then
    setString(KEYS[1], enc(r), r.rec or '', ttl)
    return
  end
  if kind == 's' then
    redis.call('DEL', KEYS[1])
  end
  local args = {}
  for _, f in ipairs({'st', 'tok', 'fp', 'up', 'at', 'ld', 'ct', 'rec', 'tr'}) do
    if r[f] then
      args[#args + 1] = f
      args[#args + 1] = r[f]
    end
  end
  redis.call('HSET', KEYS[1], unpack(args))
  redis.call('PEXPIRE', KEYS[1], ttl)
end

local prev = nil
if cur then
  local expired = cur.st == 'i' and cur.ld and tonumber(cur.ld) <= now
  if expired and cur.tok ~= ARGV[1] and ARGV[6] ~= '1' then
    -- A lock that expired frees the key, whatever the request that held it.
    prev = cur.at
  else
    if cur.up and ARGV[5] ~= '' and cur.up ~= ARGV[5] then
      return {'otherupstream'}
    end
    if cur.fp ~= ARGV[2] then
      return {'mismatch'}
    end
    if cur.st == 'c' then
      local size = raw and #raw or #(cur.rec or '')
      if (ARGV[8] or '') ~= '' and size > tonumber(ARGV[8]) then
        return {'large', tostring(size)}
      end
      local pttl = tostring(redis.call('PTTL', KEYS[1]))
      if raw then
        -- The whole string, and where the answer starts: not a copy of it.
        return {'replay', raw, pttl, cur.tr or '', tostring(recAt)}
      end
      if cur.tr then
        return {'replay', cur.rec or '', pttl, cur.tr}
      end
      return {'replay', cur.rec or '', pttl}
    end
    if cur.st == 'u' then
      return {'unknown', cur.rec}
    end
    if cur.tok == ARGV[1] then
      -- Our own claim: the client resent the script after losing the reply.
      return {'claimed'}
    end
    if not expired then
      return {'inflight'}
    end
    -- hold: the claimant died or lost Redis; the request may have run.
    if S or kind == 's' then
      cur.st, cur.rec, cur.ct = 'u', '504', string.format('%d', now)
      put(cur, ARGV[4])
    else
      redis.call('HSET', KEYS[1], 'st', 'u', 'rec', '504', 'ct', string.format('%d', now))
      redis.call('PEXPIRE', KEYS[1], ARGV[4])
    end
    return {'unknown', '504', 'held'}
  end
end

if S or kind == 's' then
  put({st = 'i', tok = ARGV[1], fp = ARGV[2], at = at, ld = ld, up = ARGV[5]}, ARGV[4])
else
  redis.call('HSET', KEYS[1], 'st', 'i', 'tok', ARGV[1], 'fp', ARGV[2], 'at', at, 'ld', ld, 'up', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
if prev then
  return {'takeover', string.format('%d', now - tonumber(prev))}
end
return {'claimed'}
