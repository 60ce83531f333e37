-- text.lua: counting, trimming, lowercasing (spec/worker.md 3.3) and
-- promptText, the one bounding function (8.1).
local sbxw = require "sbxw"
local codec = require "codec"

local M = {}

local byte, sub = string.byte, string.sub

M.MARKER = "\n[Truncated for context size; retrieve specific memory entries with memory_get.]"
-- Escaped bytes of the marker inside a JSON string (its newline costs two).
local MARKER_COST = 81

M.trim = sbxw.trim
M.lower = sbxw.lower
M.len = sbxw.utf8_len

-- UTF-8 bytes of the JSON string literal of s, quotes included.
function M.measure(s)
  return #codec.encode(s)
end

-- Bytes one raw byte costs inside a JSON string under the encoder's rules
-- (spec/worker.md 3.2): '"' and '\' two, the five short escapes two, every
-- other control six, anything else (UTF-8 continuation bytes included) one.
local function cost(b)
  if b >= 0x20 then
    if b == 0x22 or b == 0x5C then return 2 end
    return 1
  end
  if b == 8 or b == 9 or b == 10 or b == 12 or b == 13 then return 2 end
  return 6
end

-- promptText(s, budget): s itself when its literal fits budget bytes, else the
-- longest code-point prefix P with measure(P .. marker) <= budget, plus the marker.
function M.prompt_text(s, budget)
  if M.measure(s) <= budget then return s end
  local limit = budget - 2 - MARKER_COST
  local n, spent, i = #s, 0, 1
  while i <= n do
    local c = cost(byte(s, i))
    if spent + c > limit then break end
    spent = spent + c
    i = i + 1
  end
  local keep = i - 1
  -- Never split a code point: the byte after the prefix must start one.
  while keep > 0 and keep < n do
    local b = byte(s, keep + 1)
    if b < 0x80 or b >= 0xC0 then break end
    keep = keep - 1
  end
  return sub(s, 1, keep) .. M.MARKER
end

return M
