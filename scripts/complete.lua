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

local S = ARGV[8] == 's'
-- The record: as a hash, only the fields this script needs, unless it is to
-- be rewritten as a string (all but rec: a record this script rewrites gets
-- its rec from ARGV[2]); as a string, all its fields (dec: not rec).
local kind, cur = false, false
local function readHash(fields)
  local h = redis.pcall('HMGET', KEYS[1], unpack(fields))
  if h.err then
    return h
  end
  if h[1] then
    kind, cur = 'h', {}
    for i, f in ipairs(fields) do
      cur[f] = h[i] ~= '' and h[i]
    end
  end
end
local function readString()
  local v = redis.call('GET', KEYS[1])
  if v then
    kind, cur = 's', dec(v)
    if not cur then
      return notrecord()
    end
  end
end
local e
if S then
  e = redis.pcall('GET', KEYS[1])
  if type(e) == 'table' and e.err then
    e = readHash({'st', 'tok', 'fp', 'up', 'at', 'ld', 'ct', 'tr'})
  elseif e then
    kind, cur, e = 's', dec(e), nil
    if not cur then
      e = notrecord()
    end
  end
else
  e = readHash({'st', 'tok', 'ld'})
  if e then
    e = readString()
  end
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
    setString(KEYS[1], r, ttl)
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
if kind == 'h' and not S then
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
