-- text.lua: counting, trimming, lowercasing (spec/worker.md 3.3) and
-- promptText, the one bounding function (8.1). Sizes are those of the one
-- encoder (sbxw, core/json.c), so what is measured is what is sent.
local sbxw = require "sbxw"

local M = {}

M.MARKER = "\n[Truncated for context size; retrieve specific memory entries with memory_get.]"
-- Bytes the marker adds inside a JSON string literal (its newline costs two):
-- measure(P .. marker) = measure(P) + MARKER_COST.
local MARKER_COST = 81
-- A final answer the provider cut at its output limit (finish_reason
-- "length", providers.md 3) ends with this mark instead: it tells the guest
-- what happened. The memory marker above would tell them something untrue
-- (nothing was cut for context size, and memory_get cannot bring the rest).
M.CUT_MARKER = "\n[The reply was cut short: the model reached its output limit.]"

M.trim = sbxw.trim
M.lower = sbxw.lower
M.len = sbxw.utf8_len

local function checked(value, err)
  if value == nil then error(err or "invalid utf-8", 0) end
  return value
end

-- UTF-8 bytes of the JSON string literal of s, quotes included.
function M.measure(s)
  return checked(sbxw.json_string_size(s))
end

-- measure, or nil when s is not valid UTF-8 (or not a string).
function M.measure_or_nil(s)
  if type(s) ~= "string" then return nil end
  return sbxw.json_string_size(s)
end

-- The first n code points of s (s valid UTF-8).
function M.prefix_chars(s, n)
  local stop = utf8.offset(s, n + 1)
  if stop == nil then return s end
  return s:sub(1, stop - 1)
end

-- promptText(s, budget): s itself when its literal fits budget bytes, else the
-- longest code-point prefix P with measure(P .. marker) <= budget, followed
-- by the marker (P's escaped bytes are then at most budget - 83).
function M.prompt_text(s, budget)
  if M.measure(s) <= budget then return s end
  return checked(sbxw.json_string_prefix(s, budget - MARKER_COST)) .. M.MARKER
end

return M
