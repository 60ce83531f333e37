-- rich_peer.lua: the worker's side of a rich broker socket, for specs (test
-- code: the real worker is worker/pi/, run in spec/rich_worker/ and on real
-- Docker). It speaks spec/rich-mode.md section 10 from the container's side
-- over core.unix_stream, one request per connection.
--
--   local peer = require "rich_peer"
--   peer.request(sock, method, target, body, headers) -> {status, headers, body, raw}
--                    (inside a task; headers = {"Name: value", ...})
--   local w = peer.worker(sock, { ready = '{"capabilities":{}}', turn = function(t) return {ok=true, text="x", files={}} end })
--   w.turns, w.readies, w.results; w:stop()       (a task looping ready/next/result)
--   peer.chunks(sock, bytes, on_chunk) -> handle  (every chunk as it arrives; on_chunk(nil, err) at the end)
local async = require "sandbox.async"
local core = require "sandbox.core"
local engine = require "sandbox.drivers.engine"
local json = require "sandbox.json"
local unix_request = require "unix_request"

local M = {}

function M.bytes(method, target, body, headers)
  local lines = { method .. " " .. target .. " HTTP/1.1", "Host: localhost" }
  for _, h in ipairs(headers or {}) do lines[#lines + 1] = h end
  if body then
    lines[#lines + 1] = "Content-Type: application/json"
    lines[#lines + 1] = "Content-Length: " .. #body
  end
  return table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")
end

function M.raw(sock, bytes, opts)
  return async.await(function(resume)
    local h, err = unix_request(sock, bytes, opts or { timeout_ms = 70000, max_bytes = 80 * 1024 * 1024 }, resume)
    if not h then resume({ ok = false, error = err, data = "" }) end
  end)
end

function M.parse(data)
  local status, headers, body = engine.parse_response(data or "")
  return { status = status, headers = headers or {}, body = body, raw = data }
end

function M.request(sock, method, target, body, headers, opts)
  local r = M.raw(sock, M.bytes(method, target, body, headers), opts)
  local out = M.parse(r.data)
  out.error = not r.ok and r.error or nil
  return out
end

-- Streams every chunk of the answer to on_chunk(data); on_chunk(nil, why)
-- once at the end (why nil at EOF).
function M.chunks(sock, bytes, on_chunk)
  local s
  s = core.unix_stream(sock, function(ev, data)
    if ev == "data" then on_chunk(data) else on_chunk(nil, data) end
  end)
  s:write(bytes)
  return s
end

function M.worker(sock, o)
  local w = { sock = sock, turns = {}, readies = {}, results = {}, stopped = false, polls = 0 }
  function w.stop() w.stopped = true end
  w.task = async.spawn(function()
    while not w.stopped do
      local r = M.request(sock, "POST", "/worker/ready", o.ready or '{"capabilities":{}}')
      w.readies[#w.readies + 1] = r.status
      if w.stopped then break end
      if r.status ~= 200 then async.sleep(50) else
        w.polls = w.polls + 1
        local n = M.request(sock, "GET", "/worker/next")
        if n.status == 200 then
          local t = json.decode(n.body)
          w.turns[#w.turns + 1] = { raw = n.body, turn = t }
          local result = o.turn(t, w)
          local packet = json.encode(json.jsonable({ turnId = t.turnId, result = result }))
          local res = M.request(sock, "POST", "/worker/result", packet)
          w.results[#w.results + 1] = res.status
        elseif not w.stopped then
          async.sleep(50)
        end
      end
    end
  end)
  return w
end

return M
