-- broker/_upstream_error.lua: what the operator may learn when an upstream
-- says no (spec/providers.md 4). The broker reads at most 4,096 bytes of a
-- non-2xx body (core.http_post's error_body_max) for the operator log only;
-- this file keeps just the status and the tokens providers/_error_body.lua
-- reads from it (error code, type, param; never free text). The body is
-- then dropped. Known status/token pairs get the fix an operator applies.
--
--   upstream_error.tokens(body, filter) -> {code=, type=, param=}   (each optional)
--   upstream_error.fix(status, tokens, ctx) -> fix text or nil
--     ctx = {route_kind = "model" | "mcp", modelAuth = ..., host = the URL's host}
--   upstream_error.host(url) -> the URL's lowercase host name (or nil)
local error_body = require "sandbox.providers._error_body"

local M = {}

M.AZURE_SUFFIXES = { ".openai.azure.com", ".cognitiveservices.azure.com" }

M.FIX_OUTPUT_FIELD = 'set outputTokensField = "max_completion_tokens"'
M.FIX_OUTPUT_FIELD_BACK = 'set outputTokensField = "max_tokens"'
M.FIX_API_KEY_AUTH = 'set modelAuth = "api-key"'
M.FIX_CREDENTIAL = "check the credential apiKey returns for this channel"
M.FIX_MCP_CREDENTIAL = "check the credential the MCP server's apiKey returns for this channel"
M.FIX_RATE = "the provider is rate limiting or out of quota"
M.FIX_NOT_FOUND = "check modelUrl and model"
M.FIX_MCP_NOT_FOUND = "check the MCP server's url"

-- The tokens of an error body (the wire format's own reader).
M.tokens = error_body.tokens

function M.host(url)
  local h = type(url) == "string" and url:match("^[%a][%w+.-]*://([^/?#:]+)") or nil
  return h and h:lower() or nil
end

local function is_azure(host)
  if type(host) ~= "string" then return false end
  for _, suffix in ipairs(M.AZURE_SUFFIXES) do
    if #host > #suffix and host:sub(-#suffix) == suffix then return true end
  end
  return false
end

function M.fix(status, t, ctx)
  t, ctx = t or {}, ctx or {}
  local mcp = ctx.route_kind == "mcp"
  if not mcp and t.code == "unsupported_parameter" then
    if t.param == "max_tokens" then return M.FIX_OUTPUT_FIELD end
    if t.param == "max_completion_tokens" then return M.FIX_OUTPUT_FIELD_BACK end
  end
  if status == 401 and not mcp and ctx.modelAuth == "bearer" and is_azure(ctx.host) then
    return M.FIX_API_KEY_AUTH
  end
  if status == 401 or status == 403 then return mcp and M.FIX_MCP_CREDENTIAL or M.FIX_CREDENTIAL end
  if status == 429 then return M.FIX_RATE end
  if status == 404 then return mcp and M.FIX_MCP_NOT_FOUND or M.FIX_NOT_FOUND end
  return nil
end

return M
