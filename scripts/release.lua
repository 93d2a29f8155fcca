-- release.lua: free an in-flight claim so that a retry executes again, if the
-- claim is still ours (the upstream never ran, or answered 5xx). A claim a
-- request held as unknown while ours was slow (its lock expired) is freed
-- too: the answer came, and it says nothing happened.
--
-- KEYS[1]  record key  <prefix>{<hash>}, a hash or a string (see claim.lua)
-- ARGV[1]  token       the claimant's token
--
-- Reply: {"ok"}, or {"lost"} when the record is gone, completed or held under
-- another token: nothing is deleted then.

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

local st, tok
local h = redis.pcall('HMGET', KEYS[1], 'st', 'tok')
if h.err then
  local v = redis.call('GET', KEYS[1]) -- a string record (or not a record: an error)
  local r = dec(v)
  if not r then
    return notrecord()
  end
  st, tok = r.st, r.tok
else
  st, tok = h[1], h[2]
end
if (st ~= 'i' and st ~= 'u') or tok ~= ARGV[1] then
  return {'lost'}
end
redis.call('DEL', KEYS[1])
return {'ok'}
