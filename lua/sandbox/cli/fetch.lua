-- cli/fetch.lua: `sbx fetch URL` and `sbx check-url URL`: safe fetch and
-- assert_public_url from the shell (shared/spec/fetch-and-delegation.md
-- 1.1: the CLI gets the same refusals as Lua and the Bun bridge), for an
-- operator checking what a model-supplied URL would do. The body goes to
-- stdout (or --output FILE), the status line and headers to stderr with
-- --head; a refusal prints `<name>: <message>` and exits 1.
local args_lib = require "sandbox.cli._args"
local async = require "sandbox.async"
local core = require "sandbox.core"
local fetch = require "sandbox.fetch"
local signal = require "sandbox.signal"

local M = {}

M.help = [==[
usage: sbx fetch URL [--max-bytes N] [--timeout-ms N] [--idle-timeout-ms N]
                     [--max-redirects N] [--no-follow] [--header 'Name: value']...
                     [--head] [--output FILE]

One credential-free HTTP(S) resource with every hop admitted, vetted (public
addresses only, never this host's own) and pinned, bodies bounded (defaults:
5 MiB, 60 s, idle 30 s, 5 redirects). The body is written to stdout or FILE;
--head prints the final URL, status and headers to stderr. `sbx check-url`
checks a URL without connecting.
Refusals print `<ErrorName>: <message>` (the catalogue of the spec) and exit
1; usage errors exit 2. Ctrl-C aborts the call.
]==]

M.help_check_url = [==[
usage: sbx check-url URL [--timeout-ms N]

Admits and vets URL as safe fetch's first hop would (http/https without
userinfo, every resolved address public and not this host's own), without
connecting, and prints its canonical form (fragment removed). Default
deadline 10 s. Refusals print `<ErrorName>: <message>` and exit 1; usage
errors exit 2.
]==]

local NUMERIC = {
  ["max-bytes"] = "maxBytes", ["timeout-ms"] = "timeoutMs",
  ["idle-timeout-ms"] = "idleTimeoutMs", ["max-redirects"] = "maxRedirects",
}

local function usage(msg, check_only)
  io.stderr:write(check_only and "sbx check-url: " or "sbx fetch: ", msg, "\n\n",
    check_only and M.help_check_url or M.help)
  return 2
end

-- --header may repeat: collect every "Name: value" before the shared parser.
local function take_headers(args)
  local rest, headers = {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    local inline = a:match("^%-%-header=(.*)$")
    if a == "--header" then
      i = i + 1
      inline = args[i]
      if inline == nil then return nil, "flag --header needs a value" end
    end
    if inline ~= nil then
      local name, value = inline:match("^([^:]+):%s*(.*)$")
      if name == nil then return nil, "--header must be 'Name: value'" end
      headers[name] = value
    else
      rest[#rest + 1] = a
    end
    i = i + 1
  end
  return rest, headers
end

local function describe(err)
  if type(err) == "table" and err.message then
    return string.format("%s: %s", err.name or "Error", err.message)
  end
  return tostring(err)
end

-- Runs fn(sig) as the top-level task; SIGINT aborts sig.
local function with_interrupt(fn)
  local sig = signal.new()
  return async.run(function()
    local watch = core.on_signal(core.SIGINT, function() sig:abort("interrupted") end)
    local ok, res = pcall(fn, sig)
    watch:stop()
    if not ok then error(res, 0) end
    return res
  end)
end

-- check_only: `sbx check-url` (cli/check_url.lua).
function M.run(args, check_only)
  local rest, headers = take_headers(args)
  if rest == nil then return usage(headers, check_only) end
  local flags = { ["no-follow"] = "bool", head = "bool", output = "value" }
  for name in pairs(NUMERIC) do flags[name] = "value" end
  local parsed, perr = args_lib.parse(rest, { flags = flags, interleave = true })
  if not parsed then return usage(perr, check_only) end
  local url = parsed.positional[1]
  if url == nil or #parsed.positional > 1 then return usage("exactly one URL is required", check_only) end
  local opts = {}
  for flag, option in pairs(NUMERIC) do
    local v = parsed.flags[flag]
    if v ~= nil then
      opts[option] = math.tointeger(tonumber(v)) or tonumber(v) or v   -- the module judges it
    end
  end
  if check_only then
    for flag in pairs(parsed.flags) do
      if flag ~= "timeout-ms" then return usage("check-url takes only --timeout-ms", true) end
    end
    if next(headers) then return usage("check-url takes only --timeout-ms", true) end
  else
    if parsed.flags["no-follow"] then opts.followRedirects = false end
    if next(headers) then opts.headers = headers end
  end
  local ok, res = pcall(with_interrupt, function(sig)
    opts.signal = sig
    if check_only then return fetch.assert_public_url(url, opts) end
    return fetch.safe_fetch(url, opts)
  end)
  if not ok then
    io.stderr:write(describe(res), "\n")
    return 1
  end
  if check_only then
    io.stdout:write(res, "\n")
    return 0
  end
  if parsed.flags.head then
    io.stderr:write(res.url, "\n", res.status, " ", res.statusText or "", "\n")
    local names = {}
    for k in pairs(res.headers) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do io.stderr:write(k, ": ", res.headers[k], "\n") end
  end
  local out = io.stdout
  if parsed.flags.output then
    local f, ferr = io.open(parsed.flags.output, "wb")
    if not f then
      io.stderr:write("sbx fetch: ", ferr, "\n")
      return 1
    end
    out = f
  end
  out:write(res.data)
  if out ~= io.stdout then out:close() end
  return 0
end

return M
