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
-- ARGV[8]  's'         write records as strings (RECORD_FORMAT=string); else as hashes.
--                      A record of the other form is read all the same and rewritten
--                      whole in this one.
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

local S = ARGV[8] == 's'

-- The fast paths, first and without a function or a table (see claim.lua):
-- our own claim, in flight, as every first request completes it. What the
-- general path below (behind the record codec) does with it, without
-- building the record in tables: it keeps tok, fp, up, at and ld, and gets
-- the state, ct, tr and rec.
local e, hh -- what the fast paths read, handed on to the general path
if S then
  e = redis.pcall('GET', KEYS[1])
  if type(e) == 'string' and string.sub(e, 1, 3) == 'R2\1' and string.sub(e, 11, 11) == 'i' then
    local _, b, c, d, f, g, h, i = string.byte(e, 3, 10)
    local ldEnd = 11 + b + c + d + f + g
    local ld = i and g > 0 and tonumber(string.sub(e, ldEnd - g + 1, ldEnd))
    -- (An answer over 64 KiB goes to the general path's setString.)
    if ld and h == 0 and i == 0 and #e == ldEnd and #ARGV[2] <= 65536 and string.sub(e, 12, 11 + b) == ARGV[1] then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      local ct = string.format('%d', now)
      local head = 'R2' .. string.char(1, b, c, d, f, g, #ct, #ARGV[7]) .. ARGV[6] .. string.sub(e, 12, ldEnd) .. ct ..
        ARGV[7]
      redis.call('SET', KEYS[1], head .. ARGV[2], 'PX', ARGV[3])
      if ld <= now then
        return {'ok', 'late'}
      end
      return {'ok'}
    end
  end
else
  hh = redis.pcall('HMGET', KEYS[1], 'st', 'tok', 'ld')
  local ld = not hh.err and hh[3] and tonumber(hh[3])
  if not hh.err and hh[1] == 'i' and hh[2] == ARGV[1] and (ld or not hh[3]) then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if ARGV[7] and ARGV[7] ~= '' then
      redis.call('HSET', KEYS[1], 'st', ARGV[6], 'rec', ARGV[2], 'ct', string.format('%d', now), 'tr', ARGV[7])
    else
      redis.call('HSET', KEYS[1], 'st', ARGV[6], 'rec', ARGV[2], 'ct', string.format('%d', now))
    end
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    if ld and ld <= now then
      return {'ok', 'late'}
    end
    return {'ok'}
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

-- The record: as a hash, only the fields this script needs, unless it is to
-- be rewritten as a string (all but rec: a record this script rewrites gets
-- its rec from ARGV[2]); as a string, all its fields (dec: not rec).
local kind, cur = false, false
if S then
  if type(e) == 'table' and e.err then
    local h = redis.pcall('HMGET', KEYS[1], 'st', 'tok', 'fp', 'up', 'at', 'ld', 'ct', 'tr')
    if h.err then
      e = h
    else
      e = nil
      if h[1] then
        kind, cur = 'h', {st = nz(h[1]), tok = nz(h[2]), fp = nz(h[3]), up = nz(h[4]), at = nz(h[5]), ld = nz(h[6]),
          ct = nz(h[7]), tr = nz(h[8])}
      end
    end
  elseif e then
    kind, cur, e = 's', dec(e), nil
    if not cur then
      e = notrecord()
    end
  end
elseif hh.err then
  e = nil
  local v = redis.call('GET', KEYS[1])
  if v then
    kind, cur = 's', dec(v)
    if not cur then
      e = notrecord()
    end
  end
elseif hh[1] then
  kind, cur = 'h', {st = nz(hh[1]), tok = nz(hh[2]), ld = nz(hh[3])}
end
if e then
  return e
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tr = ARGV[7] ~= '' and ARGV[7]

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

if not cur then
  put({st = ARGV[6], tok = ARGV[1], fp = ARGV[4], up = ARGV[5] ~= '' and ARGV[5], rec = ARGV[2],
    ct = string.format('%d', now), tr = tr}, ARGV[3])
  return {'ok', 'recreated'}
end
if cur.tok ~= ARGV[1] then
  return {'lost'}
end
if cur.st == 'c' then
  return {'ok'}
end
if cur.st == ARGV[6] then
  return {'ok', 'already'}
end
local late = cur.st == 'u' or (cur.ld and tonumber(cur.ld) <= now)
-- A hash claim stays a hash when the answer is over 64 KiB: setString would
-- refuse it, and a SET would copy the answer in Lua (README "Record format").
if kind == 'h' and (not S or #ARGV[2] > 65536) then
  if tr then
    redis.call('HSET', KEYS[1], 'st', ARGV[6], 'rec', ARGV[2], 'ct', string.format('%d', now), 'tr', tr)
  else
    redis.call('HSET', KEYS[1], 'st', ARGV[6], 'rec', ARGV[2], 'ct', string.format('%d', now))
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  cur.st, cur.rec, cur.ct = ARGV[6], ARGV[2], string.format('%d', now)
  if tr then
    cur.tr = tr
  end
  put(cur, ARGV[3])
end
if late then
  return {'ok', 'late'}
end
return {'ok'}
