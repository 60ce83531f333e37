-- bench/stream_bench.lua: rich mode's streaming throughput (issue 15, item
-- 7): MB/s of one upstream body through the broker's streaming path against
-- libcurl alone on the same loopback, in the same run, interleaved.
--
--   baseline  curl (the CLI: libcurl alone) GET http://127.0.0.1:<upstream>/
--             to /dev/null
--   broker    curl --unix-socket broker.sock POST /anthropic/v1/messages to
--             /dev/null, through this process: core.stream_listen ->
--             core.http_stream (the same upstream) -> core.reflect_stream
--             (a 108-byte token's six forms) and core.sse_watch on every
--             chunk -> req:write with backpressure (pause at 16 KiB queued,
--             resume on drain) -> the worker's socket
--   alone     core.http_stream with chunks discarded (the Lua delivery cost
--             on its own), and the filter + watch over the body in memory
--
-- The upstream is bench/stream_upstream.mjs (node), BYTES of Anthropic-shaped
-- SSE text. Three processes on two cores: the figures are ratios of runs
-- measured side by side, never absolute promises.
--
-- Run: build/sbx lua bench/stream_bench.lua [ROUNDS [BYTES]]
local async = require "sandbox.async"
local core = require "sandbox.core"

local ROUNDS = tonumber(arg and arg[1]) or 7
local BYTES = tonumber(arg and arg[2]) or 32 * 1024 * 1024
local TOKEN = "sk-ant-oat01-" .. ("Q"):rep(95)

local pipe = assert(io.popen(("exec env -u LD_PRELOAD node bench/stream_upstream.mjs %d --parent %d")
  :format(BYTES, core.getpid()), "r"))
local line = assert(pipe:read("l"))
local port = tonumber(line:match('"port":(%d+)'))
local upstream_pid = tonumber(line:match('"pid":(%d+)'))
local url = ("http://127.0.0.1:%d/v1/messages"):format(port)

local dir = assert(io.popen("mktemp -d /tmp/sbx-stream-bench.XXXXXX")):read("l")
local sock = dir .. "/broker.sock"
local stats = { pauses = 0 }

local listener = assert(core.stream_listen { path = sock, on_request = function(req)
  req:read_body(function()
    local filter, watch = core.reflect_stream(TOKEN), core.sse_watch()
    local call
    call = assert(core.http_stream { url = url, allow_http = true, timeout_ms = 600000,
      headers = { "Content-Type: application/json", "Accept-Encoding: identity" }, body = "{}",
      on_head = function(status, headers)
        req:start(status, { ["content-type"] = headers["content-type"] })
      end,
      on_chunk = function(chunk)
        watch:push(chunk)
        local out = assert(filter:push(chunk))
        local _, pressured = req:write(out)
        if pressured then stats.pauses = stats.pauses + 1; call:pause() end
      end,
      on_done = function(res)
        assert(res.ok, res.error)
        req:write(assert(filter:finish()))
        req:finish()
      end })
    req:on_drain(function() call:resume() end)
    req:on_close(function(reason) if reason ~= "finished" then call:cancel() end end)
  end)
end })

-- Inside a task: runs curl with args; returns the bytes and seconds it reports.
local function curl(args)
  local res = async.await(function(resume)
    local a = { "-s", "-o", "/dev/null", "-w", "%{size_download} %{time_total}" }
    for _, x in ipairs(args) do a[#a + 1] = x end
    core.spawn { file = "curl", args = a, env = { "PATH=" .. os.getenv("PATH") }, on_exit = resume }
  end)
  assert(res.exit_status == 0, "curl failed: " .. tostring(res.stderr))
  local n, t = res.stdout:match("^(%d+) ([%d.]+)$")
  assert(tonumber(n) == BYTES, "curl read " .. tostring(n) .. " bytes")
  return tonumber(n) / tonumber(t) / 1e6
end

local function baseline() return curl({ url }) end
local function broker()
  return curl({ "--unix-socket", sock, "-X", "POST", "-d", "{}", "http://broker/anthropic/v1/messages" })
end

local function stream_alone()
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    assert(core.http_stream { url = url, allow_http = true, timeout_ms = 600000, body = "{}",
      on_head = function() end, on_chunk = function() end, on_done = resume })
  end)
  assert(res.ok and res.bytes == BYTES)
  return BYTES / ((core.hrtime() - t0) / 1e9) / 1e6
end

local sample = assert(io.open("/dev/null")) and nil
local function filter_alone()
  if not sample then
    local chunks = {}
    async.await(function(resume)
      assert(core.http_stream { url = url, allow_http = true, timeout_ms = 600000, body = "{}",
        on_head = function() end, on_chunk = function(c) chunks[#chunks + 1] = c end, on_done = resume })
    end)
    sample = chunks
  end
  local t0 = core.hrtime()
  local filter, watch = core.reflect_stream(TOKEN), core.sse_watch()
  for _, c in ipairs(sample) do watch:push(c); assert(filter:push(c)) end
  filter:finish()
  return BYTES / ((core.hrtime() - t0) / 1e9) / 1e6
end

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

local series = { baseline = {}, broker = {}, stream = {}, filter = {} }
baseline(); broker()                                   -- warm up
for _ = 1, ROUNDS do
  series.baseline[#series.baseline + 1] = baseline()
  series.broker[#series.broker + 1] = broker()
  series.stream[#series.stream + 1] = stream_alone()
  series.filter[#series.filter + 1] = filter_alone()
end
local b, k = median(series.baseline), median(series.broker)
print(("body %d bytes of SSE, %d rounds, medians"):format(BYTES, ROUNDS))
print(("  libcurl alone (curl CLI, TCP loopback)       %8.1f MB/s"):format(b))
print(("  broker: listener + http_stream + filter      %8.1f MB/s   ratio %.2fx of libcurl"):format(k, k / b))
print(("  http_stream alone (chunks discarded)         %8.1f MB/s"):format(median(series.stream)))
print(("  reflect_stream + sse_watch in memory         %8.1f MB/s"):format(median(series.filter)))
print(("  upstream pauses for backpressure: %d over %d broker runs"):format(stats.pauses, ROUNDS + 1))

listener:stop(true)
os.execute(("kill %d 2>/dev/null"):format(upstream_pid))
pipe:close()
os.remove(sock)
os.execute("rmdir '" .. dir .. "'")
