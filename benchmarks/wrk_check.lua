-- wrk script for benchmarks/reliability.py and benchmarks/hostile.py: a fixed pace per connection, every
-- response checked. DELAY_MS sets the pause between a connection's requests; done() prints one JSON line of
-- counts. MODE picks the requests:
--   scrape (default): GET /metrics, expecting 200 and a complete page with the step counter;
--   password: GET /metrics as USER_NAME with a new wrong password each time, expecting 401;
--   series: GET /api/series?since=-1, the live page's whole history, expecting 200.
-- wrk runs this file in one Lua state per thread plus one for setup/done: counts live in the thread states
-- (as globals, so that done() can read them through thread:get).
local delay_ms = tonumber(os.getenv("DELAY_MS") or "10")
local mode = os.getenv("MODE") or "scrape"
local user = os.getenv("USER_NAME") or "prometheus"
-- CLOSE=1: every request on a new connection (wrk reconnects after the server closes), else HTTP/1.1 keep-alive.
if os.getenv("CLOSE") == "1" then
   wrk.headers["Connection"] = "close"
end
local threads = {}
local counter = 0
ok, bad = 0, 0

function setup(thread)
   table.insert(threads, thread)
end

function delay()
   return delay_ms
end

-- base64 of a short ASCII string (wrk's Lua has no library for it)
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function base64(text)
   return ((text:gsub(".", function(c)
      local bits, byte = "", c:byte()
      for i = 8, 1, -1 do bits = bits .. (byte % 2 ^ i - byte % 2 ^ (i - 1) > 0 and "1" or "0") end
      return bits
   end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(bits)
      if #bits < 6 then return "" end
      local value = 0
      for i = 1, 6 do value = value + (bits:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
      return alphabet:sub(value + 1, value + 1)
   end) .. ({ "", "==", "=" })[#text % 3 + 1])
end

if mode == "password" then
   function request()
      counter = counter + 1
      local token = base64(user .. ":wrong-" .. tostring(math.random(1, 1000000000)) .. "-" .. counter)
      return wrk.format("GET", "/metrics", { ["Authorization"] = "Basic " .. token })
   end
elseif mode == "series" then
   function request()
      return wrk.format("GET", "/api/series?since=-1")
   end
end

local function expected(status, body)
   if mode == "password" then
      return status == 401
   elseif mode == "series" then
      return status == 200 and body:find('"rows"', 1, true) ~= nil
   end
   return status == 200 and body:sub(-1) == "\n" and body:find("mindspore_train_steps_total", 1, true) ~= nil
end

function response(status, headers, body)
   if expected(status, body) then
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
