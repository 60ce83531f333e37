-- cli/broker.lua: `sbx broker CONFIG.lua --socket PATH --channel KEY
-- --speaker ID[:NAME[:PRINCIPAL]]`: serves exactly one bound turn's broker
-- until SIGINT/SIGTERM or the turn deadline, then stops it with force.
local args_lib = require "sandbox.cli._args"
local common = require "sandbox.cli._common"
local lines = require "sandbox.ops.lines"
local log = require "sandbox.log"
local record = require "sandbox.ops.record"
local async = require "sandbox.async"
local core = require "sandbox.core"

local M = {}

M.help = [==[
usage: sbx broker CONFIG.lua --socket PATH --channel KEY --speaker ID[:NAME[:PRINCIPAL]]

Serves one bound turn's broker on a Unix socket, exactly as a sealed turn
would, so that a worker or `curl --unix-socket PATH -H 'Host: broker' ...`
can be pointed at it. Runs until SIGINT/SIGTERM or the turn deadline.

  --socket PATH     socket to create (at most 100 bytes; its directory must
                    exist and should be private, mode 0700); removed on exit
  --channel KEY     the channel key the turn is bound to (ctx.channel)
  --speaker S       ID[:NAME[:PRINCIPAL]]: the bound speaker; NAME and
                    PRINCIPAL default to ID
  --log-format F    text (default: the config's logFormat) or json; one audit
                    line per request on stderr (spec/operations.md 3)
  --timeout MS      turn deadline in ms (default: the config's turnTimeoutMs,
                    120000)
  --quiet           no status lines on stderr
]==]

function M.run(args)
  local parsed, err = args_lib.parse(args, { interleave = true, flags = {
    socket = "value", channel = "value", speaker = "value", timeout = "value", quiet = "bool",
    ["log-format"] = "value" } })
  if not parsed then
    io.stderr:write("sbx broker: ", err, "\n\n", M.help)
    return 2
  end
  local f = parsed.flags
  if not parsed.positional[1] or not f.socket or not f.channel then
    io.stderr:write("sbx broker: CONFIG.lua, --socket and --channel are required\n\n", M.help)
    return 2
  end
  local speaker, serr = args_lib.speaker(f.speaker)
  if not speaker then
    io.stderr:write("sbx broker: ", serr, "\n")
    return 2
  end
  local cfg, cerr = args_lib.load_config(parsed.positional[1])
  if not cfg then
    io.stderr:write("sbx broker: ", cerr, "\n")
    return 1
  end
  local timeout = tonumber(f.timeout or cfg.options.turnTimeoutMs)
  if not timeout or timeout < 1 or timeout > 600000 then
    io.stderr:write("sbx broker: --timeout must be 1 to 600000 ms\n")
    return 2
  end
  local format, ferr = common.log_format(f["log-format"])
  if ferr then
    io.stderr:write("sbx broker: ", ferr, "\n")
    return 2
  end
  -- the audit trail of every request (spec/operations.md 3), as a turn's
  local o = cfg.options
  local logger = log.new { format = format or o.logFormat, level = o.logLevel, logger = o.logger }
  local recorder = record.recorder()
  recorder:subscribe(lines.reader(logger, { audit = o.audit }))
  local ok, b = pcall(cfg.broker, cfg, { channel = f.channel, speaker = speaker, recorder = recorder })
  if not ok then
    io.stderr:write("sbx broker: ", tostring(b), "\n")
    return 1
  end
  local started, lerr = b:start(f.socket)
  if not started then
    io.stderr:write("sbx broker: cannot listen on ", f.socket, ": ", tostring(lerr),
      " (check that the directory exists, is yours and that no file is at that path)\n")
    return 1
  end
  if not f.quiet then io.stderr:write("sbx broker: listening on ", f.socket, "\n") end
  local reason = async.run(function()
    return async.await(function(resume)
      local watchers = {}
      local function finish(why)
        for _, w in ipairs(watchers) do w:stop() end
        resume(why)
      end
      watchers[1] = core.on_signal(core.SIGINT, function() finish("interrupted") end)
      watchers[2] = core.on_signal(core.SIGTERM, function() finish("terminated") end)
      watchers[3] = core.timer(math.floor(timeout), function() finish("turn deadline") end)
    end)
  end)
  b:end_turn(reason)
  b:stop()
  core.run("nowait")
  if not f.quiet then io.stderr:write("sbx broker: stopped (", reason, ")\n") end
  return 0
end

return M
