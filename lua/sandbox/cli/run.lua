-- cli/run.lua: `sbx run CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]]
-- TEXT`: one sealed turn through the runtime; the guest-visible text of
-- rt:guest_turn on stdout (spec/runtime.md 5.7), the reason on stderr.
local async = require "sandbox.async"
local common = require "sandbox.cli._common"
local core = require "sandbox.core"
local reply_text = require "sandbox.channels._reply_text"

local M = {}

M.help = [==[
usage: sbx run CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]] [--json] [--] TEXT

Runs one sealed turn: TEXT is the guest's message, answered by a fresh
container for channel KEY with the memory and history of that channel's
workspace. Prints the reply on stdout and exits 0. When the turn fails it
prints the guest-visible text ("The sandbox turn failed." or "The sandbox
turn failed or was stopped.") on stdout and, on stderr,
  sbx run: turn failed: <reason>        (spec/operations.md 1)
    fix: <what to do>
The operator log (one line per broker call and per turn) goes to stderr too.
Exit status: 0 ok, 1 the turn failed, 2 usage, 3 configuration (the config,
directories, options), 4 the Docker daemon or the image.

  --channel KEY     channel key, e.g. discord:1234 (^[a-z][a-z0-9_-]*:.+)
  --speaker S       ID[:NAME[:PRINCIPAL]]: the guest; NAME and PRINCIPAL
                    default to ID (PRINCIPAL never reaches the container)
  --timeout MS      turn deadline in ms (1000 to 600000; default: the
                    config's turnTimeoutMs, 120000)
  --log-format F    text (default) or json: the operator log's format
  --json            print {"ok":...,"text":...,"reason":...} with the exact
                    reply text, JSON-escaped (otherwise control characters
                    other than newline and tab are printed as U+FFFD: a
                    reply is model output and must not drive your terminal)
  TEXT              the message; several words are joined with spaces;
                    "-" reads it from stdin

The config's apiKey is mandatory under sbx (there is no host login), and the
time zone the worker sees is $TZ (default UTC). Ctrl-C stops the turn.
Run `sbx doctor CONFIG.lua` first if a turn fails for no visible reason.
]==]

function M.run(args)
  local parsed, speaker = common.parse_turn_args(args, { json = "bool" })
  if not parsed then
    io.stderr:write("sbx run: ", speaker, "\n\n", M.help)
    return 2
  end
  local words = table.move(parsed.positional, 2, #parsed.positional, 1, {})
  local text = table.concat(words, " ")
  if #words == 1 and words[1] == "-" then text = (io.read("a") or ""):gsub("\n$", "") end
  if text == "" then
    io.stderr:write("sbx run: TEXT is required (the guest's message)\n\n", M.help)
    return 2
  end
  local channel = parsed.flags.channel
  local rt, cfg = common.open("run", parsed)
  if not rt then return cfg end
  local path = parsed.positional[1]
  local status = async.run(function()
    local sig = core.on_signal(core.SIGINT, function()
      if rt:stop(channel) then io.stderr:write("\nsbx run: stopping the turn\n") end
    end)
    local term = core.on_signal(core.SIGTERM, function() rt:stop(channel) end)
    local reply, settled, res = rt:guest_turn(channel, speaker, text)
    sig:stop()
    term:stop()
    if parsed.flags.json then
      io.stdout:write(common.json_reply(settled, res, reply), "\n")
    else
      io.stdout:write(reply_text.terminal(reply), "\n")
    end
    local code = common.report_turn("run", res, settled, cfg, path)
    pcall(rt.dispose, rt)
    return code
  end)
  return status
end

return M
