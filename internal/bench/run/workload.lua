-- wrk workload of the idemproxy benchmark (internal/bench/run embeds it).
-- Usage: wrk -s workload.lua URL -- MODE UNIQUE_PREFIX PRIMED_PREFIX NPRIMED [EVENT_TEMPLATE]
--   unique: every request carries a fresh Idempotency-Key
--           (UNIQUE_PREFIX-<thread>-<counter>; the driver draws a random prefix per phase)
--   replay: keys cycle over PRIMED_PREFIX-0 .. PRIMED_PREFIX-(NPRIMED-1), which the driver
--           primed before, so every request is a duplicate of a completed one
--   mixed:  every 10th request a primed key, the other 9 fresh keys (90% unique)
--   nokey:  no Idempotency-Key at all (pass-through)
--   unique1k: like unique, with the ~1 KiB event body of EVENT_TEMPLATE (a file the driver
--           writes) whose "id" is the same fresh key (@EVENT_ID@ in the file stands for it)
--   json1k: the same bodies and no Idempotency-Key: the route takes the key from the body
-- done() prints one "BENCH k=v ..." line that the driver parses.

local tid = 0 -- overwritten per thread by setup()
local nthreads = 0

function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

local mode, uprefix, pprefix, nprimed
local counter = 0
local body = '{"amount":1000,"currency":"eur","customer":"cus_bench","description":"benchmark order"}'
local headers = { ["Content-Type"] = "application/json" }
local ehead, etail -- the event body before and after its id (unique1k, json1k)

function init(args)
  mode = args[1] or "unique"
  uprefix = (args[2] or "u") .. "-" .. tostring(tid) .. "-"
  pprefix = (args[3] or "p") .. "-"
  nprimed = tonumber(args[4] or "100")
  if mode == "unique1k" or mode == "json1k" then
    local path = args[5] or error("workload.lua: " .. mode .. " needs EVENT_TEMPLATE")
    local f = assert(io.open(path, "rb"))
    local tpl = f:read("*a")
    f:close()
    local i, j = string.find(tpl, "@EVENT_ID@", 1, true)
    if not i then
      error("workload.lua: no @EVENT_ID@ in " .. path)
    end
    ehead, etail = string.sub(tpl, 1, i - 1), string.sub(tpl, j + 1)
  elseif mode ~= "unique" and mode ~= "replay" and mode ~= "mixed" and mode ~= "nokey" then
    error("workload.lua: unknown mode " .. mode)
  end
end

function request()
  counter = counter + 1
  if mode == "unique" then
    headers["Idempotency-Key"] = uprefix .. counter
  elseif mode == "replay" then
    headers["Idempotency-Key"] = pprefix .. (counter % nprimed)
  elseif mode == "mixed" then
    if counter % 10 == 0 then
      headers["Idempotency-Key"] = pprefix .. (math.floor(counter / 10) % nprimed)
    else
      headers["Idempotency-Key"] = uprefix .. counter
    end
  elseif mode == "unique1k" or mode == "json1k" then
    local id = uprefix .. counter
    if mode == "unique1k" then
      headers["Idempotency-Key"] = id
    end
    return wrk.format("POST", nil, headers, ehead .. id .. etail)
  end
  return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
