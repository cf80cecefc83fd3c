-- Replay pre-signed raw HTTP requests (bench/loadgen.py writes them).
-- args: <file prefix> [<per-thread limit, comma separated>]
-- Thread k reads <prefix>.<k>: records "<byte length>\n<raw request>". It sends
-- them in order and wraps around after the last one (or after its limit), and
-- counts the wraps, so a run meant to send only new events can prove it did.
local counter = 0
local threads = {}

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  reqs, n, i, wraps = {}, 0, 0, 0
  local f = assert(io.open(args[1] .. "." .. tid, "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = string.find(data, "\n", pos, true)
    local len = tonumber(string.sub(data, pos, nl - 1))
    n = n + 1
    reqs[n] = string.sub(data, nl + 1, nl + len)
    pos = nl + 1 + len
  end
  if args[2] then
    local k = 0
    for limit in string.gmatch(args[2], "[^,]+") do
      if k == tid and tonumber(limit) > 0 and tonumber(limit) < n then n = tonumber(limit) end
      k = k + 1
    end
  end
end

function request()
  i = i + 1
  if i > n then
    i = 1
    wraps = wraps + 1
  end
  return reqs[i]
end

function done(summary, latency, requests)
  local sent, wrapped = {}, 0
  for _, thread in ipairs(threads) do
    local w = thread:get("wraps")
    local k = thread:get("i")
    wrapped = wrapped + w
    table.insert(sent, w > 0 and thread:get("n") or k)
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"wraps":%d,"sent_per_thread":"%s"}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    wrapped, table.concat(sent, ",")))
end
