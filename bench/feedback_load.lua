-- wrk script of bench/feedback_load_bench.py: POST feedback rows, each with its own idempotency key,
-- and write every acknowledgement (key, status, stored id) to one file per wrk thread, so the bench
-- can check each acknowledged write against the database afterwards.
-- Arguments (after --): path, token, phase, folder for the acknowledgement files.

local next_tid = 0

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
end

function init(args)
  path, token, phase, folder = args[1], args[2], args[3], args[4]
  counter = 0
  acks = io.open(string.format("%s/acks-%d.tsv", folder, tid), "w")
  acks:setvbuf("line")
end

-- the body of request n: the bench rebuilds it from the key to check what was stored
function body_of(key)
  local i = tonumber(string.match(key, "(%d+)$"))
  return string.format(
    '{"prompt":"What is %d plus %d? (request %s)","response":"The answer is %d.","score":%s,"runId":"bench-run-%s"}',
    i % 10, math.floor(i / 10) % 10, key, i % 10 + math.floor(i / 10) % 10, tostring((i % 101) / 100), key)
end

function request()
  counter = counter + 1
  local key = string.format("%s-t%d-%d", phase, tid, counter)
  local headers = {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }
  return wrk.format("POST", path, headers, body_of(key))
end

-- the stored id in the answer names the row; the bench reads the row's key back from the database
function response(status, headers, body)
  local id = string.match(body or "", '"id"%s*:%s*"([^"]+)"')
  acks:write(string.format("%d\t%s\n", status, id or ""))
end

function done(summary, latency, requests)
  local out = {
    requests = summary.requests,
    duration_us = summary.duration,
    connect_errors = summary.errors.connect,
    read_errors = summary.errors.read,
    write_errors = summary.errors.write,
    timeouts = summary.errors.timeout,
    non_2xx = summary.errors.status,
    p50_us = latency:percentile(50),
    p99_us = latency:percentile(99),
    mean_us = latency.mean,
  }
  local parts = {}
  for k, v in pairs(out) do
    table.insert(parts, string.format('"%s": %s', k, tostring(v)))
  end
  io.write("WRK_JSON {" .. table.concat(parts, ", ") .. "}\n")
end
