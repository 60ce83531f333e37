-- conn_spec.lua: the connection engine (core/conn.c) under both listeners,
-- one suite run against both request policies: the buffered one of the
-- sealed and precheck brokers (core.broker_listen) and the streaming one of
-- rich mode (core.stream_listen). Every case is a connection rule of
-- shared/spec/hardening.md 2, spec/broker.md 3 and spec/rich-mode.md 8 that
-- the two share, on real Unix sockets: the cap, the head deadline, a
-- slowloris head, a stalled body under the policy's timer, a client gone
-- mid-body, the write queue with a client that stops reading, close
-- accounting, the descriptor pool (2 guaranteed connections, the rest
-- pooled, over-share closed at once, idle ones reclaimable) and the EMFILE
-- drain. The policies' own rules stay in listener_spec.lua and
-- listener_stream_spec.lua.
local async = require "sandbox.async"
local core = require "sandbox.core"
local http_response = require "http_response"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"

local REQUEST_HEAD = "POST /model HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n"
  .. "Authorization: Bearer sandbox-dummy-key\r\nContent-Length: %d\r\n\r\n"

-- A request both policies serve: the sealed broker's four headers.
local function request(body)
  body = body or "{}"
  return REQUEST_HEAD:format(#body) .. body
end

-- The two policies behind one face. listen(path, o) takes
--   o.header_timeout_ms, o.timer_ms (the buffered request deadline, the
--   streaming silence timer), o.reply (the 200 body), and fills
--   o.refused (reasons C refused) and o.bodies (bodies a handler received).
-- src is the same listener as Lua source, for child processes.
local POLICIES = {
  {
    name = "the buffered policy (core.broker_listen)",
    listen = function(path, o)
      return core.broker_listen {
        path = path, routes = { "/model" }, max_calls = 1000,
        header_timeout_ms = o.header_timeout_ms, request_timeout_ms = o.timer_ms,
        on_refused = function(r) o.refused[#o.refused + 1] = r.reason end,
        on_call = function(call)
          o.bodies[#o.bodies + 1] = core.json_encode(call:body())
          call:reply(200, o.reply or '{"ok":true}')
        end,
      }
    end,
    stop = function(l) l:stop() end,
    src = [[function(path, refused)
      return assert(core.broker_listen { path = path, routes = { "/model" }, max_calls = 1000,
        on_refused = function(r) refused[#refused + 1] = r.reason end,
        on_call = function(call) call:reply(200, "{}") end })
    end]],
  },
  {
    name = "the streaming policy (core.stream_listen)",
    listen = function(path, o)
      return core.stream_listen {
        path = path, header_timeout_ms = o.header_timeout_ms, idle_ms = o.timer_ms,
        on_refused = function(reason) o.refused[#o.refused + 1] = reason end,
        on_request = function(req)
          req:read_body(function(body)
            if not body then return end
            o.bodies[#o.bodies + 1] = body
            req:respond(200, { ["content-type"] = "application/json" }, o.reply or '{"ok":true}')
          end)
        end,
      }
    end,
    stop = function(l) l:stop(true) end,
    src = [[function(path, refused)
      return assert(core.stream_listen { path = path,
        on_refused = function(reason) refused[#refused + 1] = reason end,
        on_request = function(req)
          req:read_body(function(body)
            if body then req:respond(200, { ["content-type"] = "application/json" }, "{}") end
          end)
        end })
    end]],
  },
}

local function wait_until(pred, ms)
  local t0 = core.now()
  while not pred() do
    if core.now() - t0 > (ms or 20000) then return false end
    async.sleep(5)
  end
  return true
end

-- Requests time out only after 20 s: a bound for a hung case, never a
-- timing assertion (the loop's clock can be seconds stale after a blocking
-- child process under load).
local function start_request(path, bytes, opts)
  local box = { done = false }
  box.handle = assert(unix_request(path, bytes, opts or { timeout_ms = 20000 }, function(res)
    box.done, box.res = true, res
  end))
  return box
end

local roots = {}
local function tmproot() return spec_fs.tmpdir("cn", roots, spec_fs.short_tmp()) end

-- A Lua script in a child process whose soft and hard RLIMIT_NOFILE are
-- `nofile`; LISTEN is the policy's listener constructor. Returns its output.
local function child(nofile, policy, body, dir)
  local script = dir .. "/child.lua"
  spec_fs.write(script, 'package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path\n'
    .. 'package.cpath = "' .. (package.cpath:match("(build[^;]*/%?%.so)") or "build/lua/?.so") .. ';" .. package.cpath\n'
    .. 'local core = require "sandbox.core"\nlocal async = require "sandbox.async"\n'
    .. "local LISTEN = " .. policy.src .. "\n" .. body)
  return spec_fs.sh(string.format("sh -c 'ulimit -S -n %d; ulimit -H -n %d; exec lua5.4 %s %s' 2>&1; echo \"exit=$?\"",
    nofile, nofile, script, dir))
end

for _, policy in ipairs(POLICIES) do
  describe("the connection engine under " .. policy.name, function()
    local dir, path, listener, o

    local function listen(opts)
      o = { refused = {}, bodies = {} }
      for k, v in pairs(opts or {}) do o[k] = v end
      listener = assert(policy.listen(path, o))
      return listener
    end

    local function connections() return listener:stats().connections end

    before_each(function()
      dir = tmproot()
      path = dir .. "/broker.sock"
      listener = nil
      core.run("nowait")             -- the loop's clock, after tmproot's shell
    end)

    after_each(function()
      if listener then policy.stop(listener) end
      for _ = 1, 5 do core.run("nowait") end
      spec_fs.rmdirs(roots)
    end)

    it("serves a request and counts its connection out once it closes", function()
      listen()
      async.run(function()
        local box = start_request(path, request('{"a":1}'))
        assert.is_true(wait_until(function() return box.done end))
        assert.is_true(box.res.ok)
        assert.matches("^HTTP/1%.1 200 OK\r\n", box.res.data)
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.same({ '{"a":1}' }, o.bodies)
    end)

    it("closes the 17th connection at once, writes nothing and reports `connections`", function()
      listen()
      async.run(function()
        local held = {}
        for i = 1, 16 do held[i] = start_request(path, "POST /mo", { keep_open = true, timeout_ms = 20000 }) end
        assert.is_true(wait_until(function() return connections() == 16 end))
        local over = start_request(path, request())
        assert.is_true(wait_until(function() return over.done end))
        assert.are.equal("", over.res.data)
        assert.are.equal(16, connections())
        for _, h in ipairs(held) do h.handle:close() end
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.same({ "connections" }, o.refused)
    end)

    it("closes a connection whose head is not complete by the head deadline, silently, and reports it", function()
      listen { header_timeout_ms = 150 }
      async.run(function()
        local box = start_request(path, "POST /model HTTP/1.1\r\nHost: br", { keep_open = true, timeout_ms = 20000 })
        assert.is_true(wait_until(function() return box.done end))
        assert.is_true(box.res.ok)
        assert.are.equal("", box.res.data)
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.same({ "header_deadline" }, o.refused)
      assert.are.same({}, o.bodies)
    end)

    it("holds a slowloris head to the deadline from accept, however the bytes dribble in", function()
      listen { header_timeout_ms = 300 }
      local sent = 0
      async.run(function()
        local bytes = request()
        local box = start_request(path, "", { keep_open = true, timeout_ms = 20000 })
        -- one byte every 20 ms: the whole head would take far longer than 300 ms
        while not box.done and sent < 100 do
          box.handle:write(bytes:sub(sent + 1, sent + 1))
          sent = sent + 1
          async.sleep(20)
        end
        assert.is_true(wait_until(function() return box.done end))
        assert.are.equal("", box.res.data)
      end)
      assert.is_true(sent < 100)
      assert.are.same({ "header_deadline" }, o.refused)
    end)

    it("cuts a request whose body stalls once the policy's timer fires: nothing written, no body handed on", function()
      listen { timer_ms = 200 }
      async.run(function()
        local box = start_request(path, REQUEST_HEAD:format(10) .. "{\"a\"", { keep_open = true, timeout_ms = 20000 })
        assert.is_true(wait_until(function() return box.done end))
        assert.are.equal("", box.res.data)
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.same({}, o.bodies)
    end)

    it("closes and counts out a connection whose client leaves mid-body", function()
      listen()
      async.run(function()
        local stream = core.unix_stream(path, function() end)
        stream:write(REQUEST_HEAD:format(1000) .. ("x"):rep(100))
        assert.is_true(wait_until(function() return connections() == 1 end))
        async.sleep(50)
        stream:close()
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.same({}, o.bodies)
    end)

    it("queues a reply larger than the socket buffers for a client that stops reading, and delivers it whole", function()
      local big = '"' .. ("r"):rep(900 * 1024) .. '"'
      listen { reply = big }
      async.run(function()
        local reader = http_response.slow_reader(path, request())
        assert.is_true(wait_until(function() return #o.bodies == 1 end))
        async.sleep(100)
        assert.are.equal(1, connections())          -- the reply still queued: the connection stays
        assert.is_true(reader:read())
        local res = reader:wait()
        assert.are.equal(200, res.status)
        assert.are.equal(big, res.body)
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
    end)

    it("takes connections beyond the guaranteed two from the shared descriptor pool and gives them back", function()
      listen()
      local before = core.fd_budget().pool_used
      async.run(function()
        local held = {}
        for i = 1, 6 do held[i] = start_request(path, "POST /mo", { keep_open = true, timeout_ms = 20000 }) end
        assert.is_true(wait_until(function() return connections() == 6 end))
        assert.are.equal(before + 4, core.fd_budget().pool_used)
        -- an idle pooled connection (still in its head) can be reclaimed for a new turn
        assert.are.equal(1, core.broker_reclaim(1))
        assert.is_true(wait_until(function() return connections() == 5 end))
        assert.are.equal(before + 3, core.fd_budget().pool_used)
        for _, h in ipairs(held) do h.handle:close() end
        assert.is_true(wait_until(function() return connections() == 0 end))
      end)
      assert.are.equal(before, core.fd_budget().pool_used)
    end)

    it("closes a connection over the turn's share at once when the pool is empty (hardening.md 2)", function()
      if not spec_fs.service_account(pending) then return end
      local d = tmproot()
      spec_fs.write(d .. "/guests.lua", [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "]] .. (package.cpath:match("(build[^;]*/%?%.so)") or "build/lua/?.so") .. [[;" .. package.cpath
local core = require "sandbox.core"
local async = require "sandbox.async"
local dir = arg[1]
local function flag(name) local f = io.open(dir .. "/" .. name) if f then f:close() return true end end
local function touch(name) local f = io.open(dir .. "/" .. name, "w") f:close() end
local held = {}
async.run(function()
  while not flag("listening") do async.sleep(10) end
  for _ = 1, 16 do held[#held + 1] = core.unix_stream(dir .. "/a.sock", function() end) end
  async.sleep(150)
  touch("a.done")
  while not flag("stop") do async.sleep(10) end
end)
]])
      -- 60 descriptors: the base, the host reserve (24), the listener's turn
      -- (8) and one turn's headroom (8) leave a pool of a few connections
      local out = child(60, policy, [[
local dir = arg[1]
local function flag(name) local f = io.open(dir .. "/" .. name) if f then f:close() return true end end
local function touch(name) local f = io.open(dir .. "/" .. name, "w") f:close() end
core.fd_budget()
assert(core.fd_turn_acquire(), "the listener's turn")
local refused = {}
local l = LISTEN(dir .. "/a.sock", refused)
os.execute("lua5.4 " .. dir .. "/guests.lua " .. dir .. " &")
touch("listening")
async.run(function()
  while not flag("a.done") do async.sleep(10) end
  print("pool", core.fd_budget().pool, "used", core.fd_budget().pool_used, "held", l:stats().connections,
    "refused", #refused, refused[1])
  touch("stop")
  l:stop(true)
  async.sleep(50)
  print("after", core.fd_budget().pool_used)
end)
]], d)
      local pool, used, held, refused, reason = out:match("pool\t(%d+)\tused\t(%d+)\theld\t(%d+)\trefused\t(%d+)\t(%a*)")
      assert.truthy(pool, out)
      pool, used, held, refused = tonumber(pool), tonumber(used), tonumber(held), tonumber(refused)
      assert.is_true(pool > 0 and pool < 14, out)
      assert.are.equal(pool, used, out)
      assert.are.equal(2 + pool, held, out)
      assert.are.equal(16 - held, refused, out)
      assert.are.equal("connections", reason, out)
      assert.matches("after\t0\nexit=0", out, 1, true)
    end)

    it("keeps listening through EMFILE at accept (the reserved-descriptor pattern)", function()
      if not spec_fs.service_account(pending) then return end
      local d = tmproot()
      spec_fs.write(d .. "/client.lua", [[
package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path
package.cpath = "]] .. (package.cpath:match("(build[^;]*/%?%.so)") or "build/lua/?.so") .. [[;" .. package.cpath
local core = require "sandbox.core"
local async = require "sandbox.async"
local unix_request = require "unix_request"
local sock, flag = arg[1], arg[2]
async.run(function()
  while not io.open(flag .. ".full") do async.sleep(10) end
  local ended = 0
  for _ = 1, 3 do
    local done = false
    core.unix_stream(sock, function(ev) if ev ~= "data" then done = true end end)
    for _ = 1, 100 do if done then break end async.sleep(10) end
    if done then ended = ended + 1 end
  end
  local f = io.open(flag .. ".tried", "w") f:write(ended) f:close()
  while not io.open(flag .. ".freed") do async.sleep(10) end
  local r = async.await(function(resume) unix_request(sock, ]] .. string.format("%q", request()) .. [[, { timeout_ms = 20000 }, resume) end)
  f = io.open(flag .. ".answer", "w") f:write(tostring(r.data and r.data:match("^HTTP/1%.1 (%d+)"))) f:close()
end)
]])
      local out = child(64, policy, [[
local dir = arg[1]
local refused = {}
local l = LISTEN(dir .. "/l.sock", refused)
os.execute("lua5.4 " .. dir .. "/client.lua " .. dir .. "/l.sock " .. dir .. "/flag &")
local held = {}
while true do
  local f = io.open("/dev/null", "r")
  if not f then break end
  held[#held + 1] = f
end
local function touch(name) held[#held]:close() held[#held] = nil local f = io.open(name, "w") f:close() end
async.run(function()
  touch(dir .. "/flag.full")                 -- one descriptor to write it, then none again
  held[#held + 1] = io.open("/dev/null", "r")
  for _ = 1, 300 do
    local f = io.open(dir .. "/flag.tried")
    if f then f:close() break end
    async.sleep(10)
  end
  for _, f in ipairs(held) do f:close() end
  held = {}
  local f = io.open(dir .. "/flag.freed", "w") f:close()
  for _ = 1, 300 do
    local a = io.open(dir .. "/flag.answer")
    if a then print("answer", a:read("a")) a:close() break end
    async.sleep(10)
  end
  print("refused", #refused, refused[1])
  l:stop(true)
end)
]], d)
      assert.matches("answer\t200\n", out, 1, true)
      assert.matches("exit=0", out, 1, true)
      assert.are.equal("3", spec_fs.read(d .. "/flag.tried"))      -- each closed, none left hanging
    end)
  end)
end

describe("rich mode's broker listener in the descriptor budget (hardening.md 2)", function()
  local http = require "sandbox.rich.broker._http"
  local errors = require "sandbox.errors"

  after_each(function()
    for _ = 1, 5 do core.run("nowait") end   -- the loop's clock, after a child process
  end)

  it("holds one turn's charge from listen to stop, so its 2 connections are guaranteed", function()
    local dir = tmproot()
    local before = core.fd_budget().turns
    local server = assert(http.listen { path = dir .. "/broker.sock", on_request = function() end })
    assert.are.equal(before + 1, core.fd_budget().turns)
    assert.are.equal(0, server:stats().connections)
    server:stop(true)
    assert.are.equal(before, core.fd_budget().turns)
    server:stop(true)                                   -- once only
    assert.are.equal(before, core.fd_budget().turns)
    for _ = 1, 5 do core.run("nowait") end
    spec_fs.rmdirs(roots)
  end)

  it("refuses to listen with host_descriptors's message when the host cannot carry the charge", function()
    if not spec_fs.service_account(pending) then return end
    local d = tmproot()
    local out = child(40, POLICIES[2], [[
local http = require "sandbox.rich.broker._http"
local s, err = http.listen { path = arg[1] .. "/b.sock", on_request = function() end }
print("listen", s, err, core.fd_budget().turns)
]], d)
    assert.matches("listen\tnil\t" .. errors.HOST_DESCRIPTORS .. "\t0\nexit=0", out, 1, true)
    spec_fs.rmdirs(roots)
  end)
end)
