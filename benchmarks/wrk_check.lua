-- wrk script for benchmarks/reliability.py: a fixed pace per connection, every response checked.
-- DELAY_MS sets the pause between a connection's requests; done() prints one JSON line of counts.
-- wrk runs this file in one Lua state per thread plus one for setup/done: counts live in the thread states
-- (as globals, so that done() can read them through thread:get).
local delay_ms = tonumber(os.getenv("DELAY_MS") or "10")
-- CLOSE=1: every request on a new connection (wrk reconnects after the server closes), else HTTP/1.1 keep-alive.
if os.getenv("CLOSE") == "1" then
   wrk.headers["Connection"] = "close"
end
local threads = {}
ok, bad = 0, 0

function setup(thread)
   table.insert(threads, thread)
end

function delay()
   return delay_ms
end

function response(status, headers, body)
   if status == 200 and body:sub(-1) == "\n" and body:find("mindspore_train_steps_total", 1, true) then
      ok = ok + 1
   else
      bad = bad + 1
   end
end

function done(summary, latency, requests)
   local good, wrong = 0, 0
   for _, thread in ipairs(threads) do
      good = good + thread:get("ok")
      wrong = wrong + thread:get("bad")
   end
   local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
   io.write(string.format('{"sent": %d, "ok": %d, "bad": %d, "socket_errors": %d, "status_errors": %d, ' ..
                          '"seconds": %.3f, "p90_ms": %.3f, "p99_ms": %.3f}\n', summary.requests, good, wrong,
                          errors, summary.errors.status, summary.duration / 1e6, latency:percentile(90) / 1e3,
                          latency:percentile(99) / 1e3))
end
