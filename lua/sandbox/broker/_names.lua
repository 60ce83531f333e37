-- broker/_names.lua: the anchored ASCII name rules of spec/broker.md section 1 and the
-- endpoint URL rule of section 4. Patterns are full matches over bytes.
local errors = require "sandbox.errors"

local M = {}

-- ^[a-z][a-z0-9_]{0,max-1}$
local function matches(s, max)
  return type(s) == "string" and #s >= 1 and #s <= max
    and s:find("^[a-z][a-z0-9_]*$") ~= nil
end

-- Host tool, MCP server and MCP tool names (1-48).
function M.tool_name(s) return matches(s, 48) end

-- Function names in a /model request (1-64).
function M.function_name(s) return matches(s, 64) end

-- Call ids (`id`, `tool_call_id`): a string of 1-128 Unicode code points.
function M.call_id(s)
  if type(s) ~= "string" then return false end
  local n = utf8.len(s)
  return n ~= nil and n >= 1 and n <= 128
end

M.URL_INVALID = errors.URL_INVALID
M.URL_UNSAFE = errors.URL_UNSAFE

local function valid_host(host)
  if host == "" then return false end
  if host:sub(1, 1) == "[" then
    return host:find("^%[[%x:.]+%]$") ~= nil
  end
  -- reg-name / IPv4: letters, digits, '-', '.', '_' only (no percent-escapes)
  return host:find("^[%w%-%._]+$") ~= nil
end

-- Checks an upstream endpoint URL. Returns true, or false and the error of
-- spec/broker.md section 4. The URL is used byte for byte when accepted.
function M.check_endpoint(url, allow_http)
  if type(url) ~= "string" or #url == 0 or #url > 2048 then return false, M.URL_INVALID end
  -- Printable ASCII only: no spaces, controls or non-ASCII (fail closed).
  if url:find("[^\33-\126]") then return false, M.URL_INVALID end
  local scheme, rest = url:match("^([A-Za-z][A-Za-z0-9+.-]*):(.*)$")
  if not scheme then return false, M.URL_INVALID end
  scheme = scheme:lower()
  local authority = rest:match("^//([^/?#]*)")
  if not authority then return false, M.URL_INVALID end
  local hostport = authority:match("@(.*)$") or authority
  local host, port = hostport:match("^(%[.*%]):(%d*)$")
  if not host then
    host, port = hostport:match("^([^:]*):(%d*)$")
    if not host then host, port = hostport, nil end
  end
  if not valid_host(host) then return false, M.URL_INVALID end
  if port and port ~= "" and (#port > 5 or tonumber(port) > 65535) then
    return false, M.URL_INVALID
  end
  if not (scheme == "https" or (scheme == "http" and allow_http == true)) then
    return false, M.URL_UNSAFE
  end
  if authority:find("@", 1, true) or url:find("#", 1, true) then
    return false, M.URL_UNSAFE
  end
  return true
end

return M
