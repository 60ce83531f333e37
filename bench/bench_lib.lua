-- bench/bench_lib.lua: what the Docker benchmarks share: a shell helper, shell
-- quoting, percentiles and the one summary line each series prints.
--   package.path = "bench/?.lua;" .. package.path
--   local B = require "bench_lib"
local M = {}

-- The sandbox account's private bench root (mktemp under /tmp, 0700), after
-- the check that this is not root (the product refuses root workers).
function M.private_root(bench, letters)
  local core = require "sandbox.core"
  assert(core.getuid() ~= 0, "run as the sbx account (runuser -u sbx -- build/sbx lua bench/" .. bench .. ")")
  local root = core.realpath(M.sh("mktemp -d /tmp/sbx-" .. letters .. "-XXXXXX"))
  os.execute("chmod 700 " .. M.q(root))
  return root
end

-- An instant scripted Chat Completions model on loopback: every call answers
-- "done". Returns the core.http_server (server:url(path), server:close()).
function M.instant_model()
  local core = require "sandbox.core"
  return assert(core.http_server {
    on_request = function(req)
      req:reply(200, '{"choices":[{"message":{"role":"assistant","content":"done"}}]}')
    end,
  })
end

-- The command's output (stderr too) without trailing white space, and
-- whether it exited 0.
function M.sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return (out:gsub("%s+$", "")), ok
end

function M.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.pct(sorted, p) return sorted[math.max(1, math.ceil(#sorted * p))] end

-- Sorts ms, prints "<name> p50 ... p95 ... (n=...)" and returns {p50, p95}.
function M.summary(name, ms, width)
  table.sort(ms)
  local r = { p50 = M.pct(ms, 0.5), p95 = M.pct(ms, 0.95) }
  print(string.format("%-" .. (width or 34) .. "s p50 %7.1f ms   p95 %7.1f ms   (n=%d)", name, r.p50, r.p95, #ms))
  return r
end

return M
