-- bench/fetch_bench.lua: the cost of safe fetch's vetting and pinning for a
-- 1 MiB body (target: at most 1.2x), against a plain libcurl transfer of the
-- same loopback resource on the same loop (core.http_post: libcurl multi on
-- libuv, no vetting, no pin, no header or decoding bounds), measured in the
-- same run, interleaved.
--
-- The safe side is fetch.safe_fetch with everything real except the name:
-- admission, one lookup through the trusted resolve seam (a public address
-- as data: no DNS), vetting with the real getifaddrs interface list, the
-- fresh pinned easy handle with CONNECT_TO, OPENSOCKETFUNCTION and
-- PREREQFUNCTION, header and body bounds. The transport seam only sends the
-- vetted address to 127.0.0.1:<fixture port>. Nothing leaves loopback.
--
-- A third series drops the transport seam: the C hop loop's own pinned
-- attempt, sent to the fixture by the trusted testConnectTo option (what
-- production runs, minus the DNS answer).
--
-- Run: build/sbx lua bench/fetch_bench.lua [ROUNDS [BYTES]]
-- (or lua5.4 with LUA_PATH/LUA_CPATH pointing at lua/ and build/lua/).
local async = require "sandbox.async"
local core = require "sandbox.core"
local fetch = require "sandbox.fetch"

local ROUNDS = tonumber(arg and arg[1]) or 200
local BYTES = tonumber(arg and arg[2]) or 1048576

local cmd = string.format("exec env -u LD_PRELOAD node spec/fixtures/fetch_server.mjs --parent %d", core.getpid())
local pipe = assert(io.popen(cmd, "r"))
local line = assert(pipe:read("l"))
local port = tonumber(line:match('"port":(%d+)'))
local pid = tonumber(line:match('"pid":(%d+)'))
local path = "/bench?n=" .. BYTES

local function plain()
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    core.http_post { url = ("http://127.0.0.1:%d%s"):format(port, path), allow_http = true,
      timeout_ms = 10000, max_body = BYTES + 1, on_done = resume }
  end)
  assert(res.ok and #res.body == BYTES, "plain fetch failed")
  return core.hrtime() - t0
end

local safe_opts = {
  maxBytes = BYTES,
  resolve = function() return { { address = "93.184.216.34", family = 4 } } end,
  transport = function(u, address, sig, maxBytes, headers)
    assert(address.address == "93.184.216.34")
    return fetch.pinned_transport(u, { address = "127.0.0.1", family = 4, port = port }, sig, maxBytes, headers)
  end,
}

-- The same call with no transport seam: the C core's own pinned attempt
-- (the production path), sent to the fixture by the trusted testConnectTo.
local direct_opts = {
  maxBytes = BYTES,
  resolve = safe_opts.resolve,
  testConnectTo = { address = "127.0.0.1", port = port },
}

local function safe(opts)
  local t0 = core.hrtime()
  local res = fetch.safe_fetch(("http://bench.example:%d%s"):format(port, path), opts or safe_opts)
  assert(res.status == 200 and #res.data == BYTES, "safe fetch failed")
  return core.hrtime() - t0
end

local function percentile(sorted, p)
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

local function ms(ns) return ns / 1e6 end

async.run(function()
  for _ = 1, 10 do plain(); safe(); safe(direct_opts) end        -- warm-up
  local a, b, c = {}, {}, {}
  for i = 1, ROUNDS do
    if i % 2 == 0 then a[#a + 1] = plain(); b[#b + 1] = safe(); c[#c + 1] = safe(direct_opts)
    else c[#c + 1] = safe(direct_opts); b[#b + 1] = safe(); a[#a + 1] = plain() end
  end
  table.sort(a)
  table.sort(b)
  table.sort(c)
  local pa, pb, pc = percentile(a, 0.5), percentile(b, 0.5), percentile(c, 0.5)
  local qa, qb, qc = percentile(a, 0.95), percentile(b, 0.95), percentile(c, 0.95)
  print(("rounds %d, body %d bytes"):format(ROUNDS, BYTES))
  print(("plain libcurl (core.http_post)   p50 %.3f ms  p95 %.3f ms"):format(ms(pa), ms(qa)))
  print(("safe_fetch (vetted, pinned)      p50 %.3f ms  p95 %.3f ms"):format(ms(pb), ms(qb)))
  print(("ratio                            p50 %.2fx    p95 %.2fx"):format(pb / pa, qb / qa))
  print(("safe_fetch, C transport (no seam) p50 %.3f ms  p95 %.3f ms"):format(ms(pc), ms(qc)))
  print(("ratio                            p50 %.2fx    p95 %.2fx"):format(pc / pa, qc / qa))
end)

os.execute("kill " .. pid .. " >/dev/null 2>&1")
pipe:close()
