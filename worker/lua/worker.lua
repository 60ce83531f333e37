-- worker.lua: the sealed worker's entry (spec/worker.md). One turn from stdin,
-- the bounded tool loop over the broker socket, one reply object on stdout.
--
--   worker.main()                     the binary's entry: stdin -> stdout + exit status
--   worker.run_turn(bytes, seams)     -> reply {ok, text [, reason]}, exit status, internal error
--     reply.reason is "memory_store" or "history" when the turn went on after
--     moving an invalid store aside (shared/spec/hardening.md 8; the first
--     of the two when both were)
--     seams.workspace  directory (default "/workspace")
--     seams.broker     function(route, body_bytes) -> 200, decoded body
--                        | status, {error="broker refused"} | nil, message
--                      (default: broker_client.request over sbxw.broker_request);
--                      it may yield, so run_turn may run inside a coroutine
--     seams.clock      function() -> epoch seconds (default sbxw.now)
--   worker.encode_reply(reply)        -> the compact {"ok":..,"text":..[,"truncated":..][,"reason":..]} bytes
--
-- Internal error strings (third result) exist for the specs; the reply on
-- any failure is the one generic failed text, plus, for the failures of the
-- worker's own closed list (spec/operations.md 1), their reason:
--   {"ok":false,"text":"The sandbox worker failed.","reason":"model_filtered"}
-- (invalid_turn, memory_store and history when the store could not even be
-- moved aside, context_budget, model_no_text, model_filtered). The host
-- keeps it only when nothing it saw contradicts it. A reply the provider cut
-- at its length limit carries "truncated":true; one of a turn that moved an
-- invalid store aside, "reason":"memory_store" or "history".
--
-- Modules (required by plain name from /app/worker/lua): codec (strict JSON
-- over sbxw), text (trim, lower, promptText), turn (stdin validation),
-- memory (memory.json store), history (history.json), registry (function
-- registry and `tools`), prompt (system and user messages), budget (the
-- 192 KiB fitting), agent (the tool loop), broker_client (the default broker
-- function).
local sbxw = require "sbxw"
local codec = require "codec"
local turn_mod = require "turn"
local memory = require "memory"
local history = require "history"
local registry_mod = require "registry"
local prompt = require "prompt"
local agent = require "agent"
local text = require "text"
local broker_client = require "broker_client"

local M = {}

M.FAILED_TEXT = "The sandbox worker failed."
M.LIMIT_TEXT = "The sandbox turn reached its model-call limit."
-- Prebuilt so that the failure path allocates nothing new.
M.FAILED_BYTES = '{"ok":false,"text":"The sandbox worker failed."}'

-- The internal errors of the worker's own closed list -> their reason.
M.REASONS = {
  ["invalid turn"] = "invalid_turn",
  ["invalid memory store"] = "memory_store",
  ["invalid history"] = "history",
  ["model returned no final text"] = "model_no_text",
  ["model output was filtered"] = "model_filtered",
  ["model context exceeds request budget"] = "context_budget",
  ["tool descriptions exceed context budget"] = "context_budget",
}

-- A failure that names its reason (a history write: its message is the
-- write error's).
local Tagged = { __tostring = function(e) return e.message end }

local function fail(message)
  error(message, 0)
end

local function must(value, err)
  if value == nil then fail(err) end
  return value
end

-- Defaults of the seams main() uses (a host spec running main() in a child
-- process points workspace elsewhere).
M.defaults = { workspace = "/workspace" }

local function run(bytes, seams)
  local workspace = seams.workspace or M.defaults.workspace
  local clock = seams.clock or sbxw.now
  local call = broker_client.caller(seams.broker or broker_client.request)

  local turn = must(turn_mod.parse(bytes, clock()))
  -- 5.1: memory before history; an invalid store is moved aside and the
  -- turn goes on with an empty one (hardening.md 8).
  local store, memory_repaired = memory.open(workspace)
  must(store, memory_repaired)
  local loaded, history_repaired = history.load(workspace, turn.reset)
  must(loaded, history_repaired)
  local repaired = memory_repaired or history_repaired
  local speaker_id = turn.speaker.id

  local function refuse() return nil, "refused" end
  local handlers = {
    refuse = refuse,
    memory = function(name, args) return store:run(name, args, speaker_id) end,
    host = function(name, args)
      local body, err = call("/tools/" .. name, codec.encode(args))
      if body == nil then return nil, err end
      return codec.encode(body)
    end,
    mcp = function(server, tool, args)
      local req = codec.object({ "method", "params" }, {
        method = "tools/call",
        params = codec.object({ "name", "arguments" }, { name = tool, arguments = args }),
      })
      local body, err = call("/mcp/" .. server, codec.encode(req))
      if body == nil then return nil, err end
      return codec.encode(body)
    end,
  }
  local registry = must(registry_mod.build(turn, handlers))

  local speaker_preview = store:preview("speaker", speaker_id)
  local channel_preview = store:preview("channel", speaker_id)
  local wrapper = prompt.wrapper(turn)
  local user_msg = prompt.message("user", text.prompt_text(wrapper, prompt.USER_BUDGET))

  local messages = codec.array { prompt.message("system", prompt.system(turn, speaker_preview, channel_preview)) }
  for _, m in ipairs(loaded) do messages[#messages + 1] = m end
  messages[#messages + 1] = user_msg

  local outcome, final, truncated = agent.run {
    model = turn.model, messages = messages, user_msg = user_msg, registry = registry, call = call,
  }
  if outcome == "limit" then return { ok = false, text = M.LIMIT_TEXT, reason = repaired }, 0 end
  local saved, serr = history.save(workspace, loaded, wrapper, final)
  if not saved then error(setmetatable({ message = serr, reason = "history" }, Tagged), 0) end
  return { ok = true, text = final, truncated = truncated or nil, reason = repaired }, 0
end

function M.run_turn(bytes, seams)
  local ok, reply, status = pcall(run, bytes, seams or {})
  if ok then return reply, status end
  local reason = type(reply) == "table" and reply.reason or M.REASONS[reply]
  return { ok = false, text = M.FAILED_TEXT, reason = reason }, 1, tostring(reply)
end

function M.encode_reply(reply)
  return codec.encode(codec.object({ "ok", "text", "truncated", "reason" }, {
    ok = reply.ok, text = reply.text, truncated = reply.truncated == true or nil,
    reason = reply.reason,
  }))
end

function M.main()
  local out, status = M.FAILED_BYTES, 1
  pcall(function()
    local bytes = sbxw.read_stdin(turn_mod.MAX_BYTES)
    local reply, code = M.run_turn(bytes)
    if code == 0 or reply.reason then out = M.encode_reply(reply) end
    if code == 0 then status = 0 end
  end)
  sbxw.emit(out, status)
end

return M
