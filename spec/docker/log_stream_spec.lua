-- docker/log_stream_spec.lua: Docker's framed log stream read back through
-- the Engine API over the daemon's Unix socket (spec/rich-mode.md 5.4,
-- behaviour 18) with the real daemon, as the non-root service account: the
-- transport is lua/sandbox/drivers/engine.lua's (core.unix_stream, one
-- connection per call, the 15 s per-call deadline of core.limits), the
-- demultiplexing core.docker_demux. The container's PID 1 is
-- spec/fixtures/log_writer.c, built static into a FROM scratch image; the
-- image and every container are removed in teardown.
local async = require "sandbox.async"
local core = require "sandbox.core"
local engine = require "sandbox.drivers.engine"
local json = require "sandbox.json"
local spec_fs = require "spec_fs"

local sh, q = spec_fs.run, spec_fs.q

local TAG = core.random_hex(4)
local IMAGE = "roundtable-rich-c-test-logs:" .. TAG
local NAMES = { framed = "roundtable-rich-c-test-" .. TAG .. "-framed",
                tty = "roundtable-rich-c-test-" .. TAG .. "-tty" }
local MAX_LOGS = 4 * 1024 * 1024

describe("Docker log frames through the Engine API (rich-mode.md 5.4)", function()
  local root, d

  setup(function()
    assert(core.getuid() ~= 0, "run the docker specs as the non-root service account (runuser -u sbx)")
    local _, rc = sh("docker info >/dev/null 2>&1")
    assert(rc == 0, "the Docker daemon does not answer")
    root = spec_fs.tmpdir("sbx-logs")
    local out, brc = sh("cc -static -O2 -o " .. q(root .. "/log_writer") .. " spec/fixtures/log_writer.c 2>&1")
    assert(brc == 0, "cc -static failed: " .. out)
    local f = assert(io.open(root .. "/Dockerfile", "w"))
    f:write("FROM scratch\nCOPY log_writer /log_writer\nUSER 1000:1000\nENTRYPOINT [\"/log_writer\"]\n")
    f:close()
    out, brc = sh("docker build -q -t " .. q(IMAGE) .. " " .. q(root) .. " 2>&1")
    assert(brc == 0, "docker build failed: " .. out)
    d = engine.new {}
  end)

  teardown(function()
    for _, name in pairs(NAMES) do sh("docker rm -f " .. q(name) .. " >/dev/null 2>&1") end
    sh("docker rmi -f " .. q(IMAGE) .. " >/dev/null 2>&1")
    if root then spec_fs.rmdir(root) end
  end)

  -- Inside a task: one Engine API call with the rich driver's deadline.
  local function call(method, target, body)
    return d:http(method, target, { body = body, max = MAX_LOGS,
      timeout_ms = core.limits.DOCKER_CALL_MS })
  end

  -- Creates, starts and waits for a container of IMAGE; returns its log body.
  local function run_and_read(name, tty)
    local body = assert(json.encode { Image = IMAGE, Tty = tty,
      HostConfig = { NetworkMode = "none", LogConfig = { Type = "json-file" },
        Runtime = require("docker_runtime").name } })
    local status, answer = call("POST", "/containers/create?name=" .. name, body)
    assert.are.equal(201, status, answer)
    status = call("POST", "/containers/" .. name .. "/start")
    assert.are.equal(204, status)
    status, answer = call("POST", "/containers/" .. name .. "/wait")
    assert.are.equal(200, status, answer)
    assert.are.equal(0, json.decode(answer).StatusCode)
    status, answer = call("GET", "/containers/" .. name .. "/logs?stdout=1&stderr=1&tail=200")
    assert.are.equal(200, status)
    return answer
  end

  it("joins the stdout and stderr payloads in order, long lines included (item 18)", function()
    async.run(function()
      local raw = run_and_read(NAMES.framed, false)
      local big = ("b"):rep(99999) .. "\n"
      local want = "out one\nout two\nerr three\n" .. big .. "err four\n"
      assert.are_not.equal(want, raw)                     -- it really is framed
      assert.are.equal(string.char(1, 0, 0, 0), raw:sub(1, 4))
      assert.are.equal(want, core.docker_demux(raw))
      local status = call("GET", "/containers/" .. NAMES.framed .. "x/logs?stdout=1&stderr=1&tail=1")
      assert.are.equal(404, status)
    end)
  end)

  it("returns a TTY container's plain log unchanged", function()
    async.run(function()
      local raw = run_and_read(NAMES.tty, true)
      assert.matches("^out one\r\nout two\r\n", raw)
      assert.are.equal(raw, core.docker_demux(raw))
    end)
  end)
end)
