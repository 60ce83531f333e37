-- examples/rich.conf.lua: a rich-mode (Pi/subscription) runtime
-- (shared/spec/rich-mode.md): one long-lived, sealed Pi container per
-- channel, a real Pi JSONL session continued across turns, the Anthropic
-- Messages API carried by the host broker with the real credential swapped
-- in on the host.
--
-- A trusted Lua config: the Bun bridge loads it with
--   new PiSandboxRuntime({ config: "examples/rich.conf.lua", options: {...} })
-- and the script gets `options` as its argument:
--   partyDir          the private state directory (required)
--   image             the runtime image (default pi-roundtable-sandbox:pi, `make image-pi`)
--   scriptedUpstream  http://127.0.0.1:PORT of a scripted Anthropic upstream
--                     (examples/bun/rich-host.ts starts one); without it the
--                     broker calls https://api.anthropic.com with the token
--                     from ANTHROPIC_OAUTH_TOKEN
--   logDriver         a Docker log driver instead of journald (e.g. "local"
--                     on hosts without systemd-journald)
--
-- Host tools: clock (public), note (the speaker's private note: its result
-- carries privateTo, so only that principal's turns see it; on the
-- claude-bridge model another speaker's next turn is refused, spec/rich-mode.md
-- 14) and draw (an image, which the worker saves as the reply file
-- image.png, 16.5). The worker learns of them from its content module
-- (examples/rich-content.ts, baked into a derived image by rich-host.ts).
local sandbox = require "sandbox"
local rich = sandbox.rich

local o = ... or {}

local fetchImpl
if o.scriptedUpstream then
  -- A trusted offline seam: the broker's request, as it would go to the
  -- Anthropic API, sent to the scripted upstream by the built-in transport.
  local curl = rich.transport()
  fetchImpl = function(req)
    local url = req.url:gsub("^https://api%.anthropic%.com", o.scriptedUpstream)
    return curl { method = req.method, url = url, headers = req.headers, body = req.body, signal = req.signal }
  end
end

return rich {
  partyDir = o.partyDir,
  image = o.image or "pi-roundtable-sandbox:pi",
  -- The profile fixes the upstream model (and the MCP servers it may use).
  profiles = { default = { model = "claude-sonnet-4-6" } },
  -- Called before every model request with the admitting scope's channel
  -- and speaker; the token never enters the container.
  oauthToken = function(scope)
    if o.scriptedUpstream then return "example-host-token-" .. scope.channel end
    return os.getenv("ANTHROPIC_OAUTH_TOKEN")
  end,
  -- The host decides how hard the model may think; the worker may ask for less.
  effort = {
    judge = function(text, ctx)
      if #text > 2000 then return "high" end
      return ctx.level or "low"
    end,
  },
  memory = {
    visibility = "shared",
    promptBlock = function(channel) return "This is the " .. channel .. " channel's table." end,
  },
  tools = {
    names = { "clock", "note", "draw" },
    call = function(name, input, ctx)
      if ctx.signal.aborted then return { ok = false, error = "cancelled" } end
      if name == "note" then
        -- A private result: stored with details.privateTo in the session and
        -- hidden from every other reader.
        return { ok = true, text = ctx.speaker.name .. "'s note: the locker code is 7314",
          privateTo = ctx.speaker.principalId }
      elseif name == "draw" then
        -- A 1x1 PNG; the worker turns a tool image into a reply file.
        return { ok = true, text = "drawn", image = { mimeType = "image/png",
          data = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==" } }
      end
      return { ok = true, text = os.date("!%Y-%m-%dT%H:%M:%SZ") }
    end,
  },
  driver = rich.dockerDriver { log = o.logDriver and { driver = o.logDriver } or nil },
  fetchImpl = fetchImpl,
  startTimeoutMs = 120000,
  turnTimeoutMs = 300000,
}
