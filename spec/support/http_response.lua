-- http_response.lua: reading raw HTTP/1.1 responses in specs (test code, not
-- the product): a response split into status, headers and body, with a
-- chunked body de-chunked and told whether its terminal chunk arrived (a
-- destroyed stream is visibly truncated); and the slow client
-- (spec/fixtures/slow_reader.mjs) that stops reading so a server's writes
-- queue up.
--
--   local http_response = require "http_response"
--   local r = http_response.parse(bytes)   -- {status, headers, order, body, complete} | nil
--   local reader = http_response.slow_reader(path, request_bytes)   -- inside a task
--   reader:read()        -- start reading (SIGUSR2)
--   local r = reader:wait()                 -- the parsed response, once the server closed
local core = require "sandbox.core"
local async = require "sandbox.async"

local M = {}

function M.parse(data)
  local head_end = data:find("\r\n\r\n", 1, true)
  if not head_end then return nil end
  local head, body = data:sub(1, head_end - 1), data:sub(head_end + 4)
  local status = tonumber(head:match("^HTTP/1%.1 (%d%d%d)"))
  local headers, order = {}, {}
  for line in head:gmatch("\r\n([^\r\n]*)") do
    local k, v = line:match("^([^:]+): (.*)$")
    headers[k] = v
    order[#order + 1] = k
  end
  local complete = true
  if headers["transfer-encoding"] == "chunked" then
    local out, pos = {}, 1
    complete = false
    while true do
      local size_hex, line_end = body:match("^(%x+)\r\n()", pos)
      if not size_hex then break end
      local size = tonumber(size_hex, 16)
      if size == 0 then complete = body:sub(line_end, line_end + 1) == "\r\n"; break end
      if #body < line_end + size + 1 then break end
      out[#out + 1] = body:sub(line_end, line_end + size - 1)
      pos = line_end + size + 2
    end
    body = table.concat(out)
  end
  return { status = status, headers = headers, order = order, body = body, complete = complete }
end

local Reader = {}
Reader.__index = Reader

function M.slow_reader(path, request)
  local r = setmetatable({}, Reader)
  r.proc = assert(core.spawn { file = "node", env = { "PATH=" .. os.getenv("PATH") },
    max_stdout = 64 * 1024 * 1024,
    args = { "spec/fixtures/slow_reader.mjs", path, core.base64(request) },
    on_exit = function(res) r.exit = res end })
  return r
end

function Reader:read()
  return self.proc:kill(12)                 -- SIGUSR2
end

function Reader:wait(ms)
  local deadline = core.now() + (ms or 10000)
  while not self.exit and core.now() < deadline do async.sleep(10) end
  assert(self.exit, "slow_reader did not finish")
  local out = core.json_decode(self.exit.stdout)
  assert(out, "slow_reader: " .. self.exit.stderr)
  return M.parse(core.base64_decode(out.base64))
end

return M
