-- bench/scrub_bench.lua: scrub_diagnostic (core/scrub.c) on the inputs of
-- fetch-and-delegation.md behaviour 33 (200,000 × `a.`, 100,000 × `x://`,
-- whole: math.huge; target under 200 ms each), against a baseline measured
-- in the same run: one pass of string.find over the same bytes for a byte
-- that is not there (a linear scan with no work per byte). Best of ROUNDS.
--
-- Run: build/sbx lua bench/scrub_bench.lua [ROUNDS]
local core = require "sandbox.core"

local ROUNDS = tonumber(arg and arg[1]) or 10

local function best(fn)
  local low = math.huge
  for _ = 1, ROUNDS do
    local t0 = core.hrtime()
    fn()
    low = math.min(low, (core.hrtime() - t0) / 1e6)
  end
  return low
end

for _, unit in ipairs { { "a.", 200000 }, { "x://", 100000 } } do
  local input = string.rep(unit[1], unit[2])
  local scrub = best(function() assert(core.scrub_diagnostic(input, math.huge) == input) end)
  local scan = best(function() assert(input:find("\0", 1, true) == nil) end)
  print(("scrub %d x %-5s %8.2f ms (target < 200 ms)  baseline scan %6.3f ms  ratio %.0fx"):format(
    unit[2], "'" .. unit[1] .. "'", scrub, scan, scrub / scan))
end
