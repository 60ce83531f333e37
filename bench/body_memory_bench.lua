-- bench/body_memory_bench.lua: a rich host's peak memory per hostile request
-- body, as a multiple of the body, for each route at its size limit and its
-- worst shapes (issue 21 item 2; recorded in bench/results.md).
--
--   lua5.4 bench/body_memory_bench.lua            (this checkout, at the limits)
--   BENCH_BODY_BEFORE=/path/to/other/tree BENCH_BODY_BEFORE_MIB=8 lua5.4 bench/body_memory_bench.lua
--
-- Each figure is one fresh host process (spec/support/body_host.lua: the
-- route's broker and a bystander channel served throughout) receiving one
-- body from spec/support/body_send.lua; the figure is (VmHWM - VmRSS once listening) / body bytes.
-- A tree given as BENCH_BODY_BEFORE (its lua/ and build/lua/) is measured
-- too, at BENCH_BODY_BEFORE_MIB (default 8) MiB: a tree that decodes whole
-- bodies takes about 64x, so at the limits it would need several GB.
-- The last line sends the six hostile bodies of spec/rich/hostile_bodies_spec.lua
-- at once.
package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath

local A = require "body_attack"
local core = require "sandbox.core"

local MiB = A.MiB
local BEFORE = os.getenv("BENCH_BODY_BEFORE")
local BEFORE_SIZE = tonumber(os.getenv("BENCH_BODY_BEFORE_MIB") or "8") * MiB
local here = core.realpath(".")

local CASES = {
  { "result", "result_unknown", "objects", "an unknown member full of {}" },
  { "result", "result_known", "objects", "result.text full of {}" },
  { "result", "result_known", "mixed", "the worst mix the budget accepts" },
  { "model", "model_metadata", "objects", "metadata full of {} (dropped)" },
  { "model", "model_messages", "objects", "messages full of {}" },
  { "model", "model_messages", "arrays", "messages full of []" },
  { "model", "model_messages", "deep", "messages of 60-deep arrays" },
  { "model", "model_messages", "strings", "messages of 1-char strings" },
  { "model", "model_messages", "names", "objects with 200-byte names" },
  { "model", "model_messages", "mixed", "the worst mix the budget accepts" },
  { "compact", "compact_kept", "objects", "keptMessages full of {}" },
  { "compact", "compact_unknown", "objects", "an unknown member full of {}" },
  { "compact", "compact_kept", "mixed", "the worst mix the budget accepts" },
  { "sealed", "sealed_junk", "objects", "sealed /model, a member full of {}" },
  { "sealed", "sealed_junk", "arrays", "sealed /model, full of []" },
  { "sealed", "sealed_junk", "deep", "sealed /model, 60-deep arrays" },
  { "sealed", "sealed_junk", "strings", "sealed /model, 1-char strings" },
  { "precheck", "precheck_junk", "objects", "precheck call, a member full of {}" },
  { "precheck", "precheck_junk", "arrays", "precheck call, full of []" },
}

local function tmpdir()
  local p = assert(io.popen("mktemp -d /tmp/body-bench-XXXXXX"))
  local d = p:read("l")
  p:close()
  return d
end

local function measure(tree, kind, route, fill, size)
  local dir = tmpdir()
  local body = A.body(route, fill, size, "t1")
  A.write(dir .. "/b.json", body)
  local report, answers = A.run { tree = tree, dir = dir, kinds = { kind, "bystander" },
    attacks = { { i = 1, route = route, file = dir .. "/b.json" } }, support = here .. "/spec/support" }
  os.execute("rm -rf " .. dir)
  local peak = (report.hwm_kb - report.rss0_kb) * 1024
  return peak / #body, peak, #body, answers[1].status, report.bystander
end

local function row(label, tree, c, size)
  local x, peak, n, status, by = measure(tree, c[1], c[2], c[3], size)
  print(("%-7s %-16s %-8s %-34s %6.2f MiB  peak %6.0f MiB  %6.2fx  answer %s  bystander %d ok %d failed"):format(
    label, c[2], c[3], c[4], n / MiB, peak / MiB, x, tostring(status), by.ok, by.failed))
end

print("host peak memory per body (VmHWM over the listening RSS) / body bytes")
for _, c in ipairs(CASES) do
  if BEFORE then row("before", BEFORE, c, math.min(BEFORE_SIZE, A.limit_of(c[2]))) end
  row("after", here, c, A.limit_of(c[2]))
end

-- All at once: the hostile spec's six bodies.
local dir = tmpdir()
local attacks = {
  { i = 1, route = "result_unknown", fill = "objects" }, { i = 2, route = "result_known", fill = "strings" },
  { i = 3, route = "model_metadata", fill = "objects" }, { i = 4, route = "model_messages", fill = "deep" },
  { i = 5, route = "compact_kept", fill = "names" }, { i = 6, route = "model_messages", fill = "mixed" },
}
local total = 0
for n, a in ipairs(attacks) do
  local body = A.body(a.route, a.fill, A.limit_of(a.route), "t" .. a.i)
  a.file = ("%s/b%d.json"):format(dir, n)
  A.write(a.file, body)
  total = total + #body
end
local report = A.run { dir = dir, kinds = { "result", "result", "model", "model", "compact", "model", "bystander" },
  attacks = attacks, support = here .. "/spec/support" }
os.execute("rm -rf " .. dir)
local peak = (report.hwm_kb - report.rss0_kb) * 1024
print(("after   six channels at once: %d MiB of bodies, peak %.0f MiB, %.2fx; bystander %d ok %d failed"):format(
  total // MiB, peak / MiB, peak / total, report.bystander.ok, report.bystander.failed))
