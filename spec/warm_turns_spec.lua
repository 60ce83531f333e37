-- warm_turns_spec.lua: warm turns without Docker (spec/warm-turns.md): the
-- `warm` option's rules, the unbound broker (503 `broker not ready`, no hook,
-- no budget, one bind), a child's stdin written after its start
-- (core.spawn stdin_open), and the pool over the built-in CLI driver with a
-- fake docker binary: the next container starts after a turn, its turn
-- arrives on its stdin, it is removed after delivery, idle and dispose
-- remove it, `warm.channels = 0` stays cold. The real daemon's side is
-- spec/docker/warm_spec.lua.
local async = require "sandbox.async"
local broker = require "sandbox.broker"
local broker_config = require "sandbox.broker._config"
local core = require "sandbox.core"
local options = require "sandbox.runtime._options"
local record = require "sandbox.ops.record"
local runtime = require "sandbox.runtime"
local sandbox = require "sandbox"
local H = require "broker_harness"
local spec_fs = require "spec_fs"

local run = async.run
local q = spec_fs.q
local GUEST = { id = "guest", name = "Guest", principalId = "p_guest" }

describe("the warm option (spec/warm-turns.md 2)", function()
  it("defaults to 16 channels and 600000 ms", function()
    assert.same({ channels = 16, idleMs = 600000 }, options.check_warm(nil))
    assert.same({ channels = 0, idleMs = 600000 }, options.check_warm { channels = 0 })
    assert.same({ channels = 1024, idleMs = 86400000 }, options.check_warm { channels = 1024, idleMs = 86400000 })
    assert.same({ channels = 16, idleMs = 1000 }, options.check_warm { idleMs = 1000.0 })
  end)

  it("refuses anything else with `invalid warm settings`", function()
    for _, bad in ipairs {
      { channels = 1025 }, { channels = -1 }, { channels = 1.5 }, { channels = "2" }, { idleMs = 999 },
      { idleMs = 86400001 }, { idleMs = true }, { other = 1 }, { [1] = 2 }, 5, "x", true,
    } do
      assert.has_error(function() options.check_warm(bad) end, "invalid warm settings")
    end
  end)

  it("is checked by sandbox{} and sandbox.runtime{} alike", function()
    assert.has_error(function()
      sandbox { model = "m", modelUrl = "https://api.example.com/v1/chat/completions", warm = { channels = 2000 } }
    end, "invalid warm settings")
  end)
end)

describe("a warm turn's unbound broker (spec/warm-turns.md 1)", function()
  local cfg = broker_config.check {
    model = "m", modelUrl = "https://api.example.com/v1/chat/completions",
    tools = { { name = "probe", description = "d", parameters = {}, run = function() return "ran" end } },
    maxCalls = 1,
  }

  local function probe_call(path)
    return H.send(path, H.raw("/tools/probe", "{}"))
  end

  it("answers 503 `broker not ready` before the bind, calls no hook and spends no budget", function()
    local dir = H.tmpdir()
    local calls, recs = 0, {}
    local hooked = broker_config.check {
      model = "m", modelUrl = "https://api.example.com/v1/chat/completions", maxCalls = 1,
      tools = { { name = "probe", description = "d", parameters = {},
                  run = function() calls = calls + 1; return "ran" end } },
    }
    local rec = record.recorder()
    rec:subscribe(function(r) if r.kind == "call" then recs[#recs + 1] = r end end)
    local b = broker.unbound(hooked, { channel = "fake:a", recorder = rec })
    run(function()
      assert.is_true(b:start(dir .. "/broker.sock"))
      for _ = 1, 3 do
        local r = probe_call(dir .. "/broker.sock")
        assert.equal(503, r.status)
        assert.equal("broker not ready", r.body)
      end
      -- also for a route it does not have: nothing is looked at before the bind
      assert.equal(503, H.send(dir .. "/broker.sock", H.raw("/nope", "{}")).status)
      assert.equal(0, calls)
      assert.equal(1, b:stats().budget)
      b:bind { channel = "fake:a", speaker = GUEST, signal = require("sandbox.signal").new(), recorder = rec }
      local ok = probe_call(dir .. "/broker.sock")
      assert.equal(200, ok.status)
      assert.equal(1, calls)            -- the one call of the budget of 1 was still there
      assert.equal(429, probe_call(dir .. "/broker.sock").status)
      b:stop()
    end)
    assert.equal(6, #recs)
    for i = 1, 4 do
      assert.equal("not_bound", recs[i].reason)
      assert.equal(503, recs[i].status)
      assert.is_false(recs[i].accepted)
    end
    H.rmdir(dir)
  end)

  it("binds exactly once, to its own channel, with a principal", function()
    local dir = H.tmpdir()
    run(function()
      local b = broker.unbound(cfg, { channel = "fake:a" })
      assert.has_error(function() b:bind { channel = "fake:a", speaker = GUEST } end,
        "a warm broker is bound once started")
      assert.is_true(b:start(dir .. "/broker.sock"))
      assert.has_error(function() b:bind { channel = "fake:b", speaker = GUEST } end,
        "a warm broker is bound only to its own channel")
      assert.has_error(function() b:bind { channel = "fake:a", speaker = { id = "g", name = "G", principalId = "" } } end,
        "a broker is never bound without a non-empty principalId")
      b:bind { channel = "fake:a", speaker = GUEST }
      assert.has_error(function() b:bind { channel = "fake:a", speaker = GUEST } end, "broker already bound")
      b:stop()
    end)
    H.rmdir(dir)
  end)

  it("core.broker_listen{unbound} refuses listener:bind() twice", function()
    local dir = H.tmpdir()
    run(function()
      local l = assert(core.broker_listen { path = dir .. "/l.sock", routes = { "/model" }, unbound = true,
        on_call = function(call) call:reply(200, "{}") end })
      l:bind()
      assert.has_error(function() l:bind() end, "broker listener is not unbound")
      l:stop()
      local plain = assert(core.broker_listen { path = dir .. "/p.sock", routes = { "/model" },
        on_call = function(call) call:reply(200, "{}") end })
      assert.has_error(function() plain:bind() end, "broker listener is not unbound")
      plain:stop()
    end)
    H.rmdir(dir)
  end)
end)

describe("core.spawn stdin_open (a warm container's stdin)", function()
  it("keeps the child's stdin open until write_stdin, which works once", function()
    local res = run(function()
      local proc
      local started = core.now()
      local task = async.spawn(function()
        return async.await(function(resume)
          proc = core.spawn { file = "/bin/cat", stdin_open = true, on_exit = resume }
        end)
      end)
      async.sleep(150)
      assert.is_false(task.done)                  -- cat is still waiting on its stdin
      assert.is_true(proc:write_stdin("late turn"))
      assert.is_false(proc:write_stdin("twice"))
      local _, r = async.wait(task)
      r.waited = core.now() - started
      return r
    end)
    assert.equal("late turn", res.stdout)
    assert.equal(0, res.exit_status)
    assert.is_true(res.waited >= 150)
  end)

  it("refuses stdin together with stdin_open, and write_stdin without it", function()
    run(function()
      assert.has_error(function()
        core.spawn { file = "/bin/cat", stdin = "x", stdin_open = true, on_exit = function() end }
      end)
      local r = async.await(function(resume)
        local p = core.spawn { file = "/bin/cat", stdin = "x", on_exit = resume }
        assert.is_false(p:write_stdin("y"))
      end)
      assert.equal("x", r.stdout)
    end)
  end)
end)

---------------------------------------------------------------------------
-- The pool over the CLI driver and a fake docker binary: `run` records its
-- argv's container name and its stdin, then replies with the number of the
-- container (its line in the calls file).
describe("the warm pool over the CLI driver (fake docker)", function()
  local root, bin

  local function service_account()
    assert.is_not.equal(0, core.getuid(), "run the specs as a non-root user")
  end

  before_each(function()
    service_account()
    root = spec_fs.tmpdir("sb-warmpool")
    bin = root .. "/docker"
    spec_fs.write(bin, ([[#!/bin/sh
echo "$1" >> %s/calls
case "$1" in
  run) for a in "$@"; do case "$prev" in --name) name="$a" ;; esac; prev="$a"; done
       echo "$name" >> %s/names
       cat > %s/stdin-"$name"
       printf '{"ok":true,"text":"%%s"}' "$name" ;;
  rm) echo "$3" >> %s/removed; exit 0 ;;
  ps) exit 0 ;;
  *) exit 2 ;;
esac
]]):format(root, root, root, root), "700")
    os.execute("mkdir -m 700 -p " .. q(root .. "/run") .. " " .. q(root .. "/work"))
  end)

  after_each(function()
    spec_fs.rmdir(root, "sb-warmpool")
  end)

  local function rt_with(extra)
    local o = {
      image = "img:1", runRoot = root .. "/run", workspaceRoot = root .. "/work", model = "fake",
      modelUrl = "https://api.example.com/v1/chat/completions", apiKey = function() return "k" end,
      driver = require("sandbox.drivers.cli") { binary = bin }, prompt = "P",
      logger = { info = function() end, warn = function() end, error = function() end },
    }
    for k, v in pairs(extra or {}) do o[k] = v end
    return runtime.new(o)
  end

  local function lines(name)
    local s = spec_fs.read(root .. "/" .. name) or ""
    local out = {}
    for l in s:gmatch("[^\n]+") do out[#out + 1] = l end
    return out
  end

  local function until_true(fn, ms)
    local deadline = core.now() + (ms or 5000)
    while core.now() < deadline and not fn() do async.sleep(20) end
    return fn()
  end

  local function turn_dirs()
    local n = 0
    for _ in (spec_fs.run("ls -A " .. q(root .. "/run")) or ""):gmatch("turn%-%w+") do n = n + 1 end
    return n
  end

  it("starts the channel's next container after a turn; the next turn is written to its stdin, then it goes", function()
    local rt = rt_with()
    local r1, r2
    run(function()
      r1 = rt:run_turn("fake:a", GUEST, "one")
      assert.truthy(until_true(function() return #lines("names") == 2 end))
      assert.equal(1, rt:_containers().warm)
      assert.equal(1, turn_dirs())       -- the waiting container's own turn dir
      -- nothing has reached the waiting container's stdin yet
      async.sleep(100)
      assert.equal("", spec_fs.read(root .. "/stdin-" .. lines("names")[2]) or "")
      r2 = rt:run_turn("fake:a", GUEST, "two")
      assert.truthy(until_true(function() return #lines("names") == 3 end))
      rt:dispose()
    end)
    local names = lines("names")
    assert.equal(names[1], r1.text)
    assert.equal(names[2], r2.text)       -- the turn went to the container started before it
    assert.is_not.equal(names[1], names[2])
    assert.truthy(spec_fs.read(root .. "/stdin-" .. names[2]):find('"text":"two"', 1, true))
    -- every container removed by its exact name: the cold one, the warm one
    -- after delivery, the third at dispose
    local removed = {}
    for _, n in ipairs(lines("removed")) do removed[n] = true end
    for _, n in ipairs(names) do assert.truthy(removed[n], n .. " was not removed") end
    assert.equal(0, turn_dirs())
  end)

  it("stays cold with warm.channels = 0", function()
    local rt = rt_with { warm = { channels = 0 } }
    run(function()
      rt:run_turn("fake:a", GUEST, "one")
      async.sleep(200)
      rt:run_turn("fake:a", GUEST, "two")
      async.sleep(200)
      rt:dispose()
    end)
    assert.same({ "ps", "run", "rm", "run", "rm" }, lines("calls"))
  end)

  it("removes a warm container idle for idleMs and runs the next turn cold", function()
    local rt = rt_with { warm = { channels = 2, idleMs = 1000 } }
    local recs = {}
    rt.recorder:subscribe(function(r) if r.kind == "turn" then recs[#recs + 1] = r end end)
    run(function()
      rt:run_turn("fake:a", GUEST, "one")
      assert.truthy(until_true(function() return #lines("names") == 2 end))
      assert.truthy(until_true(function() return #lines("removed") == 2 end, 4000))
      assert.equal(0, rt:_containers().warm)
      rt:run_turn("fake:a", GUEST, "two")
      rt:dispose()
    end)
    assert.is_nil(recs[2].warm)
    assert.equal(0, turn_dirs())
  end)
end)
