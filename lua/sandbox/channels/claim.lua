-- channels/claim.lua: the guest-channel claim's pure parts (spec/runtime.md 9.1-9.4):
-- the routing decision, the admission predicate, the turn text and the reply
-- splitter. No I/O and no state of its own: the app (app.lua) feeds it the
-- host's message event, the host's admission result and the channel store.
--
--   claim.key(event) -> "<surface>:<channelId>" | nil
--   claim.admit(event, admission) -> speaker | nil          (9.2 items 2-6)
--   claim.decide(event, admission, owns) -> {claim=, priority=200, action=}
--   claim.compose(event) -> the turn text                   (9.3 step 3)
--   claim.split(text [, max]) -> pieces of at most 2,000 characters
--
-- A sandbox channel claims every message, with priority 200 over the core
-- agent claim's 100: an admitted one is answered, anything else is dropped
-- and never falls through to a host agent, even the owner's. Threads are
-- their own channel keys (their channelId) and inherit nothing from the
-- parent.
local json = require "sandbox.json"

local M = {}

M.NAME = "sandbox"
M.PRIORITY = 200
M.CONVERSATION_KIND = "sandbox"
M.DEFAULT_SURFACE = "discord"
M.ADMISSION_FAILURE = "sandbox turn failed"
M.BACKGROUND_REFUSED = "Background host turns are refused in sandbox channels."
M.QUOTE_PREFIX = "Quoted message (untrusted): "
M.ATTACHMENTS_NOTE = "[Attachments are not supported in this sandbox.]"
M.MAX_PIECE_CHARS = 2000

-- Absent: nil, JSON null, false or "" (events may come decoded from JSON).
local function present(v)
  return v ~= nil and v ~= json.null and v ~= false and v ~= ""
end
M.present = present

local function nonempty(s)
  return type(s) == "string" and s ~= ""
end

local function is_id(v)
  return nonempty(v) or math.type(v) == "integer"
end

-- The channel key of the event's channel (a thread's own id for a thread).
function M.key(event)
  if type(event) ~= "table" or not is_id(event.channelId) then return nil end
  local surface = event.surface
  if surface == nil or surface == json.null then surface = M.DEFAULT_SURFACE end
  if not nonempty(surface) then return nil end
  return surface .. ":" .. tostring(event.channelId)
end

-- Posted by a bot, or by an integration (any webhook or app).
local function automated(event)
  local a = event.author
  if type(a) ~= "table" or a.bot == true or a.integration == true then return true end
  return present(event.webhookId) or present(event.applicationId)
end

local function direct(event)
  return not is_id(event.guildId)
end

-- §9.2 items 2-6 (item 1, the channel being sandboxed, is the caller's):
-- returns the turn speaker {id, name, principalId} when the message is
-- admitted, else nil. `admission` is the host's result for this author:
-- {tier=, principalId=} or nil.
function M.admit(event, admission)
  if type(event) ~= "table" or automated(event) or direct(event) then return nil end
  if event.mentionsBot ~= true and event.replyToBot ~= true then return nil end
  if type(admission) ~= "table" or not nonempty(admission.tier) or not nonempty(admission.principalId) then
    return nil
  end
  local a = event.author
  if not is_id(a.id) then return nil end
  local id = tostring(a.id)
  local name = nonempty(a.name) and a.name or id
  return { id = id, name = name, principalId = admission.principalId }
end

local function decision(claimed, action)
  return { claim = claimed, priority = M.PRIORITY, action = action }
end

-- The routing decision. `owns(key)` says whether a key is in sandbox mode.
-- Command events (`type = "command"`) are the commands module's: they are
-- claimed with action "command" (a channel that is off can be turned on).
function M.decide(event, admission, owns)
  local key = M.key(event)
  if type(event) == "table" and event.type == "command" then
    return decision(true, "command")
  end
  if key == nil or not owns(key) then return decision(false, nil) end
  if M.admit(event, admission) then return decision(true, "answer") end
  return decision(true, "drop")
end

-- §9.3 step 3: the quoted prefix, the text, the attachments note.
function M.compose(event)
  local text = type(event.text) == "string" and event.text or ""
  local quoted = event.quoted
  if type(quoted) == "table" then quoted = quoted.text end
  if nonempty(quoted) then
    text = M.QUOTE_PREFIX .. quoted .. "\n\n" .. text
  end
  local att = event.attachments
  if (type(att) == "table" and next(att) ~= nil) or (math.type(att) == "integer" and att > 0) then
    text = text .. "\n" .. M.ATTACHMENTS_NOTE
  end
  return text
end

-- Byte index of the end of the first `n` characters of s (s valid UTF-8).
local function char_end(s, n)
  local pos = utf8.offset(s, n + 1)
  if pos == nil then return #s end
  return pos - 1
end

local function last_find(s, pattern)
  local at, stop
  local init = 1
  while true do
    local a, b = s:find(pattern, init)
    if not a then break end
    at, stop, init = a, b, a + 1
  end
  return at, stop
end

-- The fence line left open at the end of `chunk`, starting from `open`.
local function fence_after(chunk, open)
  for line in (chunk .. "\n"):gmatch("([^\n]*)\n") do
    local f = line:match("^%s*(```[^`%s]*)")
    if f then
      if open then open = nil else open = f end
    end
  end
  return open
end

-- The host splitter's rules: pieces of at most `max` characters, broken on
-- a paragraph boundary, else a line, else a space, else hard; a piece cut
-- inside a fenced code block is closed with ``` and the next piece reopens
-- the fence (with its language tag). Empty text gives no piece.
function M.split(text, max)
  max = max or M.MAX_PIECE_CHARS
  if type(text) ~= "string" or text == "" then return {} end
  if utf8.len(text) <= max then return { text } end
  local pieces, rest, fence = {}, text, nil
  while rest ~= "" do
    local prefix = fence and (fence .. "\n") or ""
    local budget = max - utf8.len(prefix)
    if utf8.len(rest) <= budget then
      pieces[#pieces + 1] = prefix .. rest
      break
    end
    local window = rest:sub(1, char_end(rest, budget - 4))   -- room for "\n```"
    local cut
    local a, b = last_find(window, "\n\n")
    if a and a > 1 then cut = b
    else
      a = last_find(window, "\n")
      if a and a > 1 then cut = a
      else
        a = last_find(window, " ")
        if a and a > 1 then cut = a else cut = #window end
      end
    end
    local chunk = rest:sub(1, cut)
    local open = fence_after(chunk, fence)
    local piece = prefix .. chunk:gsub("%s+$", "")
    if open then piece = piece .. "\n```" end
    if piece ~= prefix then pieces[#pieces + 1] = piece end
    rest = rest:sub(cut + 1)
    if not open then rest = rest:gsub("^\n+", "") end
    fence = open
  end
  return pieces
end

return M
