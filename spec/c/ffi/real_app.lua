-- real_app.lua: the real app (sandbox{...}) over a Lua fake driver (no
-- Docker), for spec/c/ffi/ffi_test.c and bench/ffi_bench.*. The embedding
-- passes its decoded options_json as the chunk's argument; `root` is the
-- caller's temp folder.
--
-- The fake driver answers "fake: <text>"; "slow" runs until the turn is
-- aborted. For the text "model" it acts as
-- the worker: it POSTs /model to the turn's broker socket and reports the
-- broker's status and the Authorization header a loopback stand-in for the
-- model provider received (so a host-side apiKey is seen end to end). For
-- "refused" the stand-in answers that call 401 and the driver fails as the
-- worker then does: the turn's reason (upstream_status) and its tokens are
-- what the ABI's runTurn result carries (spec/operations.md 1).
local async = require "sandbox.async"
local core = require "sandbox.core"
-- The specs' raw Unix client (a test transport, not part of the product).
local unix_request = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".")
  .. "/../../support/unix_request.lua")

local opts = ...
local root = assert(opts.root, "options_json.root is required")

local seen = nil
local reject_next = false
local upstream = assert(core.http_server {
  on_request = function(req)
    seen = req.headers.authorization or "none"
    if reject_next then
      reject_next = false
      req:reply(401, '{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}')
      return
    end
    req:reply(200, '{"id":"c1","object":"chat.completion","model":"spec-model","choices":[{"index":0,'
      .. '"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}')
  end,
})

local function post_model(spec)
  local body = '{"messages":[]}'
  local raw = "POST /model HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n"
    .. "Authorization: Bearer sandbox-dummy-key\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
  local res = async.await(function(resume)
    unix_request(spec.runDir .. "/broker.sock", raw, { timeout_ms = 20000 }, resume)
  end)
  if not res.ok then return "error " .. tostring(res.error) end
  return res.data:match("^HTTP/1%.1 (%d%d%d)") or "?"
end

local driver = {}
function driver:run(spec, turn, signal)
  if turn.text == "slow" then
    -- runs until the runtime aborts the turn (stop, dispose, deadline)
    async.await(function(resume)
      if signal.aborted then return resume() end
      signal:on_abort(function() resume() end)
    end)
    error(signal.reason, 0)
  end
  if turn.text == "refused" then
    reject_next = true
    post_model(spec)
    error(require("sandbox.errors").WORKER, 0)
  end
  if turn.text == "model" then
    seen = nil
    local status = post_model(spec)
    return { ok = true, text = "model " .. status .. " auth=" .. tostring(seen or "none") }
  end
  return { ok = true, text = "fake: " .. turn.text }
end

return require("sandbox") {
  image = "pi-roundtable-sandbox:local",
  runRoot = root .. "/run", workspaceRoot = root .. "/ws", stateFile = root .. "/state/channels.json",
  model = "spec-model", modelUrl = upstream:url("/v1/chat/completions"), allowHttp = true,
  driver = driver,
}, function() upstream:close() end
