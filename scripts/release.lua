-- release.lua: free an in-flight claim so that a retry executes again, if the
-- claim is still ours (the upstream never ran, or answered 5xx). A claim a
-- request held as unknown while ours was slow (its lock expired) is freed
-- too: the answer came, and it says nothing happened.
--
-- KEYS[1]  record key  <prefix>{<hash>}
-- ARGV[1]  token       the claimant's token
--
-- Reply: {"ok"}, or {"lost"} when the record is gone, completed or held under
-- another token: nothing is deleted then.
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok')
if (cur[1] ~= 'i' and cur[1] ~= 'u') or cur[2] ~= ARGV[1] then
  return {'lost'}
end
redis.call('DEL', KEYS[1])
return {'ok'}
