-- cli/chat.lua: `sbx chat CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]]`:
-- an interactive guest channel in the terminal. Every line is one sealed
-- turn, run one after another (the channel's FIFO, spec/runtime.md 5.1).
-- stdin is read on the event loop (core.read_lines), so the spinner, signals
-- and the turn itself keep running while it waits for input.
local async = require "sandbox.async"
local common = require "sandbox.cli._common"
local core = require "sandbox.core"
local reply_text = require "sandbox.channels._reply_text"

local M = {}

M.help = [==[
usage: sbx chat CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]] [--json]

An interactive guest channel in the terminal: each line you type is the
guest's message and runs one sealed turn (a fresh container) for channel KEY;
the reply is printed when it settles, with a spinner on stderr meanwhile.
Lines typed during a turn wait their turn. Memory and history persist in the
channel's workspace, so a later `sbx chat` or `sbx run` on the same channel
continues the conversation.

  --channel KEY     channel key, e.g. demo:one
  --speaker S       ID[:NAME[:PRINCIPAL]] of the guest you speak as
  --timeout MS      turn deadline in ms (1000 to 600000)
  --log-format F    text (default) or json: the operator log on stderr
  --json            one line {"ok":...,"text":...,"reason":...} per reply,
                    the exact text JSON-escaped (otherwise control
                    characters other than newline and tab are printed as
                    U+FFFD)

In the chat:
  /quit, /exit      leave (end of input leaves too, after queued turns)
  /stop             stop the running turn (same as Ctrl-C during a turn)
  /help             this list
  Ctrl-C            stops the running turn; when idle, leaves
]==]

local SPIN = { "|", "/", "-", "\\" }

function M.run(args)
  local parsed, speaker = common.parse_turn_args(args, { json = "bool" })
  if not parsed then
    io.stderr:write("sbx chat: ", speaker, "\n\n", M.help)
    return 2
  end
  if parsed.positional[2] then
    io.stderr:write("sbx chat: unexpected argument '", parsed.positional[2],
      "' (type messages after it starts)\n\n", M.help)
    return 2
  end
  local channel = parsed.flags.channel
  local rt, cfg = common.open("chat", parsed)
  if not rt then return cfg end
  local path = parsed.positional[1]
  local tty_in, tty_err = common.isatty(0), common.isatty(2)

  return async.run(function()
    local queue, eof, quit, wake = {}, false, false, nil
    local running = false
    -- lines typed while a turn runs wait here (sbx_channel_queue_depth)
    rt.metrics_registry:queue_source(function() return #queue end)
    local function poke()
      local w = wake
      wake = nil
      if w then w() end
    end
    local stop_turn
    local reader, rerr = core.read_lines(function(line)
      if line == nil then
        eof = true
      elseif running and line:match("^%s*/stop%s*$") then
        stop_turn()          -- at once, not after the turn it means to stop
        return
      else
        queue[#queue + 1] = line
      end
      poke()
    end)
    if not reader then
      io.stderr:write("sbx chat: ", rerr, "\n")
      rt:dispose()
      return 1
    end
    function stop_turn()
      if not running then return false end
      io.stderr:write(tty_err and "\r\27[K" or "", "sbx chat: stopping the turn\n")
      rt:stop(channel)
      return true
    end
    local sigint = core.on_signal(core.SIGINT, function()
      if not stop_turn() then
        quit = true
        poke()
      end
    end)
    local sigterm = core.on_signal(core.SIGTERM, function()
      stop_turn()
      quit = true
      poke()
    end)

    io.stderr:write(string.format(
      "sbx chat: channel %s as %s; one line = one sealed turn. /quit leaves, Ctrl-C stops a turn.\n",
      channel, speaker.name))

    local function prompt()
      if tty_in and not quit then io.stderr:write("> ") end
    end

    local function one_turn(text)
      running = true
      local t0 = core.now()
      local frame, spinner = 0, nil
      local function tick()
        frame = frame + 1
        if tty_err then
          io.stderr:write(string.format("\r%s sandbox is working... %.1fs", SPIN[frame % #SPIN + 1],
            (core.now() - t0) / 1000))
        end
        spinner = core.timer(120, tick)
      end
      tick()
      local reply, settled, res = rt:guest_turn(channel, speaker, text)
      spinner:stop()
      running = false
      if tty_err then io.stderr:write("\r\27[K") end
      local secs = (core.now() - t0) / 1000
      if parsed.flags.json then
        io.stdout:write(common.json_reply(settled, res, reply), "\n")
      else
        io.stdout:write("sandbox: ", reply_text.terminal(reply), "\n")
      end
      if not settled or not res.ok then common.report_turn("chat", res, settled, cfg, path) end
      if tty_err then io.stderr:write(string.format("(%.1fs)\n", secs)) end
      io.stdout:flush()
    end

    prompt()
    while not quit do
      if #queue == 0 then
        if eof then break end
        async.await(function(resume) wake = resume end)
      else
        local line = table.remove(queue, 1)
        local cmd = line:match("^%s*(.-)%s*$")
        if cmd == "/quit" or cmd == "/exit" then
          quit = true
        elseif cmd == "/help" then
          io.stderr:write(M.help)
          prompt()
        elseif cmd == "/stop" then
          prompt()
        elseif cmd == "" then
          prompt()
        else
          one_turn(line)
          prompt()
        end
      end
    end
    if tty_in and not eof then io.stderr:write("\n") end
    reader:stop()
    sigint:stop()
    sigterm:stop()
    rt:dispose()
    return 0
  end)
end

return M
