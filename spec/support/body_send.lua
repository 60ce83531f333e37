-- body_send.lua: the attacker of spec/support/body_attack.lua, a process of
-- its own so that the measured host holds only what the host built: sends
-- one request whose body is FILE's bytes over a Unix socket and writes the
-- answer's status and body (after an optional GET, e.g. /worker/next).
--
--   lua5.4 spec/support/body_send.lua SOCK HOST PATH FILE OUT [GET_PATH [GO]]
--   -> OUT.head once the head is sent (the body waits for the file GO when
--      given), then OUT.status, OUT.body
package.path = (os.getenv("BODY_HOST_SUPPORT") or "spec/support") .. "/?.lua;" .. package.path
local async = require "sandbox.async"
local peer = require "rich_peer"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"

local SLICE = 16 * 1024 * 1024

local sock, host, path, file, out, pre, go = arg[1], arg[2], arg[3], arg[4], arg[5], arg[6], arg[7]

async.run(function()
  if pre and pre ~= "" and pre ~= "-" then
    peer.raw(sock, ("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n"):format(pre, host), { timeout_ms = 60000 })
  end
  local body = assert(spec_fs.read(file))
  local head = ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"):format(
    path, host, #body)
  -- a stream write takes at most 64 MiB (core/unix_stream.c): the body goes in slices
  local h
  local r = async.await(function(resume)
    h = assert(unix_request(sock, head, { keep_open = true, timeout_ms = 300000, max_bytes = 1024 * 1024 }, resume))
    -- every head first, then every body at once (GO appears): a head that
    -- reached a host busy for seconds with another body would meet its
    -- 10 s head deadline, which is not what is measured
    async.spawn(function()
      spec_fs.write(out .. ".head", "")
      while go and not spec_fs.exists(go) do async.sleep(20) end
      for i = 1, #body, SLICE do assert(h:write(body:sub(i, i + SLICE - 1))) end
      h:shutdown()
    end)
  end)
  local p = peer.parse(r.data)
  spec_fs.write(out .. ".status", tostring(p.status or ""))
  spec_fs.write(out .. ".body", p.body or "")
end)
os.exit(0)
