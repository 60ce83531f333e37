-- cli/init.lua: the `sbx` command's dispatcher. core/main.c calls main(argv) and
-- exits with its return value. Each subcommand lives in sandbox/cli/<name>.lua
-- and exports help (a string) and run(args) -> exit status. Besides them:
-- `sbx help [COMMAND]`, `sbx --help`, and `sbx version` / `sbx --version`
-- (the release, core.version: the VERSION file through sbx_version()).
local core = require "sandbox.core"

local M = {}

M.COMMANDS = { "broker", "lua", "run", "chat", "doctor", "cleanup", "demo", "fetch", "check-url" }

local SUMMARY = {
  broker = "serve one bound turn's broker on a Unix socket",
  lua = "run a Lua script with the sandbox modules and the event loop",
  run = "run one sealed turn and print the reply",
  chat = "an interactive guest channel in the terminal",
  doctor = "check docker, image, uid and directories; print what to fix",
  cleanup = "list (and with --force remove) stale sandbox containers",
  demo = "run two turns against a built-in scripted model",
  fetch = "safe fetch of one URL (vetted, pinned, bounded) to stdout",
  ["check-url"] = "admit and vet a URL without connecting; print its canonical form",
}

local function usage()
  local lines = { "usage: sbx <command> [options]", "", "commands:" }
  for _, name in ipairs(M.COMMANDS) do
    lines[#lines + 1] = string.format("  %-9s %s", name, SUMMARY[name])
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "`sbx help <command>` (or `sbx <command> --help`) explains each command's flags;"
  lines[#lines + 1] = "`sbx --version` prints the release."
  return table.concat(lines, "\n") .. "\n"
end

M.VERSION_HELP = "usage: sbx version (or sbx --version)\n\nPrints the release, e.g. `sbx 0.1.0`.\n"

-- Levenshtein distance of a and b, bounded by the short names it compares.
local function distance(a, b)
  if #a > 64 or #b > 64 then return math.huge end
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- The closest name of `names` to `given` (at most 2 edits away), or nil.
function M.suggest(given, names)
  local best, best_d = nil, 3
  for _, name in ipairs(names) do
    local d = distance(given, name)
    if d < best_d then best, best_d = name, d end
  end
  return best
end

local function unknown(name)
  local near = M.suggest(name, M.COMMANDS) or (M.suggest(name, { "version" }))
  io.stderr:write("sbx: unknown command '", name, "'",
    near and ("; did you mean '" .. near .. "'?") or "", "\n\n", usage())
  return 2
end

local function command(name) return require("sandbox.cli." .. name:gsub("-", "_")) end

-- The collector (generational) is the host state's, set in C by
-- core/state.c for every state the project makes; nothing here changes it.
function M.main(argv)
  local name = argv[1]
  if name == "--version" or name == "version" then
    io.stdout:write("sbx ", core.version, "\n")
    return 0
  end
  if name == "help" and (argv[2] == "version" or argv[2] == "--version") then
    io.stdout:write(M.VERSION_HELP)
    return 0
  end
  if name == "help" and argv[2] ~= nil then
    if not SUMMARY[argv[2]] then return unknown(argv[2]) end
    io.stdout:write(command(argv[2]).help)
    return 0
  end
  if name == nil or name == "--help" or name == "-h" or name == "help" then
    io.stdout:write(usage())
    return name == nil and 2 or 0
  end
  if not SUMMARY[name] then return unknown(name) end
  local cmd = command(name)
  local args = table.move(argv, 2, #argv, 1, {})
  for _, a in ipairs(args) do
    if a == "--help" or a == "-h" then
      io.stdout:write(cmd.help)
      return 0
    end
    if a == "--" then break end
  end
  return cmd.run(args)
end

return M
