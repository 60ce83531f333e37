-- channels/_reply_text.lua: the reply surface (shared/spec/hardening.md 6).
-- A reply is model output, so guest-influenced: it must not ping a whole
-- server or write to the operator's terminal.
--
--   reply_text.neutral_mentions(text) -> text with a zero-width space after
--       the `@` of @everyone / @here and after the `<` of every <@…>, <@!…>,
--       <@&…> and <#…> mention token, so the chat client shows them as text
--       (mentions = "neutral", the default; the runtime applies it to every
--       reply it returns)
--   reply_text.ALLOWED_MENTIONS() -> {parse = []} (a JSON object with an empty
--       array): what the chat adapter passes to Discord with a neutral reply
--   reply_text.terminal(text) -> text with every C0 control character except
--       \n and \t, DEL and every C1 control (U+0080-U+009F) replaced by
--       U+FFFD: what `sbx run` and `sbx chat` print (on a terminal and on a
--       pipe alike; --json prints the exact text JSON-escaped instead)
-- Both take valid UTF-8 (the reply decoder refused anything else).
local json = require "sandbox.json"

local M = {}

M.ZWSP = "\226\128\139"           -- U+200B
M.REPLACEMENT = "\239\191\189"    -- U+FFFD

function M.neutral_mentions(text)
  text = text:gsub("@everyone", "@" .. M.ZWSP .. "everyone")
  text = text:gsub("@here", "@" .. M.ZWSP .. "here")
  text = text:gsub("<([@#])", "<" .. M.ZWSP .. "%1")
  return text
end

function M.ALLOWED_MENTIONS()
  return json.object({ "parse" }, { parse = json.array {} })
end

function M.terminal(text)
  text = text:gsub("[%z\1-\8\11-\31\127]", M.REPLACEMENT)
  text = text:gsub("\194[\128-\159]", M.REPLACEMENT)
  return text
end

return M
