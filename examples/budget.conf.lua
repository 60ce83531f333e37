-- examples/budget.conf.lua: examples/sandbox.conf.lua with per-channel daily
-- token limits (the `budget` hook; examples/daily_budget.lua keeps the counts
-- in the state directory, so they survive restarts):
--
--   export MODEL_API_KEY=...
--   sbx run examples/budget.conf.lua --channel demo:one --speaker alice:Alice "What time is it?"
local sandbox = require "sandbox"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local daily_budget = dofile(here .. "daily_budget.lua")

local home = os.getenv("HOME")
if not home or home == "" then error("HOME is required", 0) end
local state = home .. "/.local/state/roundtable-sandbox"

return sandbox {
  image = "pi-roundtable-sandbox:local",
  runRoot = home .. "/.local/run/roundtable-sandbox",
  workspaceRoot = home .. "/.local/share/roundtable-sandbox/work",
  stateFile = state .. "/channels.json",
  model = "gpt-4o-mini",
  modelUrl = "https://api.openai.com/v1/chat/completions",
  apiKey = function() return os.getenv("MODEL_API_KEY") end,
  budget = daily_budget.new {
    file = state .. "/budget.json",
    limit = 200000,                             -- tokens per channel per UTC day
  },
}
