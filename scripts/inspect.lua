-- inspect.lua: read one record for an operator (idemproxy keys get, list).
-- Writes nothing. One key per call, so it runs on Redis Cluster too.
--
-- KEYS[1]  record key  <prefix>{<hash>}
-- ARGV[1]  "body": reply with the whole rec field; anything else: its first
--          16 bytes only (enough for the status; list must not move bodies)
--
-- Reply, first element the key's type:
--   {"none"}                   no such key
--   {"<type>"}                 a key of another type (not a record)
--   {"hash", st, fp, at, ld, ct, up, rec, "<rec length>", "<pttl ms>", tr}
--                              absent fields are ''; pttl -1 means no expiry;
--                              tr is the execution's "<trace-id>-<span-id>"
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' then
  return {t}
end
local f = redis.call('HMGET', KEYS[1], 'st', 'fp', 'at', 'ld', 'ct', 'up', 'rec', 'tr')
for i = 1, 8 do
  if not f[i] then
    f[i] = ''
  end
end
local n = string.len(f[7])
if ARGV[1] ~= 'body' then
  f[7] = string.sub(f[7], 1, 16)
end
return {'hash', f[1], f[2], f[3], f[4], f[5], f[6], f[7], tostring(n), tostring(redis.call('PTTL', KEYS[1])), f[8]}
