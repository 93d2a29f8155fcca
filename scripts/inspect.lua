-- inspect.lua: read one record for an operator (idemproxy keys get, list).
-- Writes nothing. One key per call, so it runs on Redis Cluster too.
--
-- KEYS[1]  record key  <prefix>{<hash>}, a hash or a string (see claim.lua)
-- ARGV[1]  "body": reply with the whole rec field; anything else: its first
--          16 bytes only (enough for the status; list must not move bodies)
--
-- Reply, first element the key's type:
--   {"none"}                   no such key
--   {"<type>"}                 a key of another type, or a string that is not a
--                              record (not a record)
--   {"<form>", st, fp, at, ld, ct, up, rec, "<rec length>", "<pttl ms>", tr}
--                              a record; form is "hash" or "string";
--                              absent fields are ''; pttl -1 means no expiry;
--                              tr is the execution's "<trace-id>-<span-id>"

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

local t = redis.call('TYPE', KEYS[1])['ok']
local f, n
if t == 'hash' then
  f = redis.call('HMGET', KEYS[1], 'st', 'fp', 'at', 'ld', 'ct', 'up', 'rec', 'tr')
  n = f[7] and string.len(f[7]) or 0
  if f[7] and ARGV[1] ~= 'body' then
    f[7] = string.sub(f[7], 1, 16)
  end
elseif t == 'string' then
  local v = redis.call('GET', KEYS[1])
  local r, p = dec(v)
  if not r then
    return {t}
  end
  local last = -1 -- to the end
  if ARGV[1] ~= 'body' then
    last = p + 15
  end
  n = #v - p + 1
  f = {r.st, r.fp, r.at, r.ld, r.ct, r.up, string.sub(v, p, last), r.tr}
else
  return {t}
end
for i = 1, 8 do
  if not f[i] then
    f[i] = ''
  end
end
return {t, f[1], f[2], f[3], f[4], f[5], f[6], f[7], tostring(n), tostring(redis.call('PTTL', KEYS[1])), f[8]}
