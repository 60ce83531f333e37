-- cli/_demo_model.lua: the scripted Chat Completions endpoint behind `sbx demo`
-- (and specs that want a real model on loopback). It is not a model: it
-- follows a fixed script that exercises what a sealed turn can do.
--
--   local demo_model = require "sandbox.cli._demo_model"
--   local m = assert(demo_model.start{ key = "k", model = "demo-model" })
--   m.url      -- "http://127.0.0.1:<port>/v1/chat/completions"
--   m.calls    -- one entry per request: {status=, authorized=, phase=, tools=}
--                 (phase "tool_calls", "answer", "unauthorized" or "refused";
--                 tools: the function names it asked for)
--   m:close()
--
-- Contract (over real loopback HTTP, core.http_server):
--   * only POST /v1/chat/completions (exact target): anything else is 404,
--     another method 405;
--   * with `key` set, `Authorization: Bearer <key>` is required, else 401
--     {"error":{"message":"invalid api key"}} (the worker only ever holds the
--     dummy key, so a 200 proves the broker swapped in the host credential);
--   * the body must be a JSON object with a `messages` array, else 400;
--   * otherwise 200 with a non-streaming chat.completion whose
--     choices[1].message is chosen by demo_model.respond(payload):
--       1. tool results after the last user message -> a final answer that
--          quotes the clock result and says the note was saved;
--       2. the system message's "Shared channel notes" hold a note -> a final
--          answer that recalls it (the second turn of the demo);
--       3. otherwise, the first call of a turn -> tool calls: host_clock {}
--          (when offered) and memory_set {scope="channel", key="demo_note",
--          text=note_from(<the guest's message>)} (when offered; "Please
--          remember that X" saves "X"); with neither offered, a plain answer.
-- The endpoint never echoes the Authorization header or the key.
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

M.PATH = "/v1/chat/completions"
M.NOTE_KEY = "demo_note"
M.NOTES_PREFIX = "Shared channel notes (untrusted data): "
M.MAX_NOTE_CHARS = 500

local function str(v) return type(v) == "string" and v or nil end

-- First n UTF-8 characters of s (s is valid UTF-8: the decoder checked it).
local function clip(s, n)
  if utf8.len(s) <= n then return s end
  return s:sub(1, utf8.offset(s, n + 1) - 1) .. "..."
end

-- The guest's own words and display name from the worker's user wrapper
-- {"speaker":{"id","name"},"message":...}; a plain string is taken as is.
local function user_message(content)
  content = str(content) or ""
  local obj = json.decode(content)
  if type(obj) == "table" and str(obj.message) then
    local name = type(obj.speaker) == "table" and str(obj.speaker.name) or nil
    return obj.message, name
  end
  return content, nil
end

-- The channel notes array the worker prints into the system message.
local function channel_notes(system)
  system = str(system)
  if not system then return {} end
  for line in (system .. "\n"):gmatch("([^\n]*)\n") do
    if line:sub(1, #M.NOTES_PREFIX) == M.NOTES_PREFIX then
      local arr = json.decode(line:sub(#M.NOTES_PREFIX + 1))
      if type(arr) == "table" then return arr end
    end
  end
  return {}
end

local function offered(payload)
  local names = {}
  if type(payload.tools) == "table" then
    for _, t in ipairs(payload.tools) do
      if type(t) == "table" and type(t["function"]) == "table" and str(t["function"].name) then
        names[t["function"].name] = true
      end
    end
  end
  return names
end

-- What to remember from a message: "Please remember that X" -> "X".
function M.note_from(text)
  local note = text:gsub("^%s+", ""):gsub("%s+$", "")
  note = note:gsub("^[Pp]lease,?%s+", ""):gsub("^[Rr]emember%s+that%s+", ""):gsub("^[Rr]emember:?%s+", "")
  if note == "" then note = text end
  return clip(note, M.MAX_NOTE_CHARS)
end

local function quoted(s)
  return "\"" .. s:gsub("[%.!]$", "") .. "\""
end

local function tool_call(id, name, args)
  return json.object({ "id", "type", "function" }, {
    id = id, type = "function",
    ["function"] = json.object({ "name", "arguments" }, { name = name, arguments = json.encode(args) }),
  })
end

-- Returns the assistant message (a table) and its finish reason for one
-- request payload (a decoded Chat Completions request).
function M.respond(payload)
  local messages = type(payload) == "table" and payload.messages or nil
  if type(messages) ~= "table" then messages = {} end
  local system, last_user
  for i, m in ipairs(messages) do
    if type(m) == "table" then
      if m.role == "system" and system == nil then system = m.content end
      if m.role == "user" then last_user = i end
    end
  end
  local text, name = user_message(last_user and messages[last_user].content)
  local who = name and (name .. ", ") or ""

  -- 1. Tool results came back: the final answer of the first turn.
  local results = {}
  for i = (last_user or 0) + 1, #messages do
    local m = messages[i]
    if type(m) == "table" and m.role == "tool" then results[#results + 1] = str(m.content) or "" end
  end
  if last_user and #results > 0 then
    local clock, saved
    for _, r in ipairs(results) do
      local obj = json.decode(r)
      if type(obj) == "table" and str(obj.text) then clock = obj.text end
      if r == "Saved." then saved = true end
    end
    local parts = { who .. "got it." }
    if clock then parts[#parts + 1] = "The host clock says " .. clock .. "." end
    if saved then
      parts[#parts + 1] = "I saved a channel note: " .. quoted(M.note_from(text)) .. "."
    else
      parts[#parts + 1] = "I could not save a note this time."
    end
    return json.object({ "role", "content" }, { role = "assistant", content = table.concat(parts, " ") }), "stop"
  end

  -- 2. A note from an earlier turn is in the system message: recall it.
  local notes = channel_notes(system)
  local recalled
  for _, n in ipairs(notes) do
    if type(n) == "table" and n.key == M.NOTE_KEY and str(n.text) then recalled = n.text end
  end
  if recalled then
    return json.object({ "role", "content" }, { role = "assistant",
      content = who .. "this channel's notes say: " .. quoted(clip(recalled, M.MAX_NOTE_CHARS)) ..
        ". (An earlier turn wrote that note, in another container.)" }), "stop"
  end

  -- 3. First call of a turn: ask for the host clock and a channel note.
  local tools = offered(payload)
  local calls = {}
  if tools.host_clock then calls[#calls + 1] = tool_call("call_clock", "host_clock", {}) end
  if tools.memory_set and text ~= "" then
    calls[#calls + 1] = tool_call("call_note", "memory_set", json.object({ "scope", "key", "text" }, {
      scope = "channel", key = M.NOTE_KEY, text = M.note_from(text) }))
  end
  if #calls == 0 then
    return json.object({ "role", "content" }, { role = "assistant",
      content = who .. "I have no tools to use, so I can only say hello." }), "stop"
  end
  return json.object({ "role", "content", "tool_calls" }, {
    role = "assistant", content = json.null, tool_calls = json.array(calls) }), "tool_calls"
end

local function error_body(msg)
  return json.encode({ error = { message = msg } })
end

-- Handles one request; returns status, body, phase and the function names
-- it asked for (for the call log).
function M.handle(opts, req)
  if req.target ~= M.PATH then return 404, error_body("not found"), "refused" end
  if req.method ~= "POST" then return 405, error_body("method not allowed"), "refused" end
  if opts.key and req.headers.authorization ~= "Bearer " .. opts.key then
    return 401, error_body("invalid api key"), "unauthorized"
  end
  local payload = json.decode(req.body)
  if type(payload) ~= "table" or getmetatable(payload) ~= core.json_object_mt
    or getmetatable(payload.messages) ~= core.json_array_mt then
    return 400, error_body("expected a JSON object with a messages array"), "refused"
  end
  local message, finish = M.respond(payload)
  opts.seq = (opts.seq or 0) + 1
  local body = json.encode(json.object(
    { "id", "object", "created", "model", "choices", "usage" }, {
      id = "demo-" .. opts.seq, object = "chat.completion", created = os.time(),
      model = str(payload.model) or opts.model or "demo-model",
      choices = json.array({ json.object({ "index", "message", "finish_reason" },
        { index = 0, message = message, finish_reason = finish }) }),
      usage = json.object({ "prompt_tokens", "completion_tokens", "total_tokens" },
        { prompt_tokens = 0, completion_tokens = 0, total_tokens = 0 }),
    }))
  local asked = {}
  if finish == "tool_calls" then
    for _, c in ipairs(message.tool_calls) do asked[#asked + 1] = c["function"].name end
  end
  return 200, body, finish == "tool_calls" and "tool_calls" or "answer", asked
end

local Model = {}
Model.__index = Model

function Model:close()
  if self.server then
    self.server:close()
    self.server = nil
  end
end

-- Starts the endpoint: opts = {key=, model=, port=}. Returns the model
-- object or nil, error.
function M.start(opts)
  opts = opts or {}
  local self = setmetatable({ calls = {}, opts = { key = opts.key, model = opts.model } }, Model)
  local server, err = core.http_server {
    port = opts.port or 0,
    max_body = 1024 * 1024,
    on_request = function(req)
      local status, body, phase, asked = M.handle(self.opts, req)
      self.calls[#self.calls + 1] = { status = status, phase = phase, tools = asked or {},
        authorized = (self.opts.key ~= nil and status == 200) or nil }
      req:reply(status, body, "application/json")
    end,
  }
  if not server then return nil, err end
  self.server = server
  self.port = server:port()
  self.url = server:url(M.PATH)
  return self
end

return M
