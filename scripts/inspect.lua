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
-- compares them). A string record is 'R1', then st, tok, fp, up, at, ld, ct and
-- tr, each as one length byte and its bytes, then rec to the end. Empty fields
-- read as absent (false), as HMGET reads a missing hash field. rec can be
-- megabytes, and every copy of it in Lua is one more of its size in Lua's heap:
-- dec leaves it where it is and says where it starts; setString appends a
-- large one with APPEND instead of concatenating it.
local F = {'st', 'tok', 'fp', 'up', 'at', 'ld', 'ct', 'tr'}
local function dec(v)
  if string.sub(v, 1, 2) ~= 'R1' then
    return nil
  end
  local r, p = {}, 3
  for i = 1, 8 do
    local n = string.byte(v, p)
    if not n or p + n > #v then
      return nil
    end
    local s = string.sub(v, p + 1, p + n)
    r[F[i]] = s ~= '' and s
    p = p + 1 + n
  end
  return r, p
end
local function enc(r)
  local t = {'R1'}
  for i = 1, 8 do
    local s = r[F[i]] or ''
    if #s > 255 then
      error({err = 'idemproxy: record field ' .. F[i] .. ' is ' .. #s .. ' bytes, more than a string record holds (255)'})
    end
    t[i + 1] = string.char(#s) .. s
  end
  return table.concat(t)
end
local function setString(key, r, ttl)
  local rec = r.rec or ''
  if #rec <= 65536 then
    redis.call('SET', key, enc(r) .. rec, 'PX', ttl)
  else
    redis.call('SET', key, enc(r), 'PX', ttl)
    redis.call('APPEND', key, rec)
  end
end
local function notrecord()
  return redis.error_reply('idemproxy: ' .. KEYS[1] .. ' holds a string that is not a record')
end
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
