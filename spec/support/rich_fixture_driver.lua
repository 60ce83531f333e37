-- rich_fixture_driver.lua: an offline container driver for the rich runtime
-- specs (spec/rich-mode.md 5.1 allows a trusted fixture driver). Its
-- "container" is a rich_peer worker task on the spec's run/broker.sock, so
-- the runtime's real broker, socket and worker transport are exercised;
-- only Docker is left out (spec/docker/ runs the real daemon).
--
--   local d = fixture.new{ turn = function(t, d) return result end, ready = true|false, logs = "text" }
--   d.calls   every call {op, arg}; d.workers[name]; d.specs[name]; d.close()
local peer = require "rich_peer"

local M = {}

function M.new(o)
  o = o or {}
  local d = { calls = {}, workers = {}, specs = {}, running = {}, logs_text = o.logs or "line one\nline two\n" }
  local function record(op, arg) d.calls[#d.calls + 1] = { op = op, arg = arg } end

  function d.status(name)
    record("status", name)
    local s = d.running[name]
    if not s then return { state = "missing" } end
    return { state = "running", image = s.image, profile = s.profile }
  end

  function d.ensureRunning(spec)
    record("ensureRunning", spec)
    local cur = d.running[spec.name]
    if cur and cur.image == spec.image and cur.profile == spec.profile then return end
    if d.workers[spec.name] then d.workers[spec.name].stop() end
    d.running[spec.name] = { image = spec.image, profile = spec.profile }
    d.specs[spec.name] = spec
    if o.ready ~= false then
      d.workers[spec.name] = peer.worker(spec.runDir .. "/broker.sock", {
        ready = o.ready_body, turn = function(t, w) return o.turn(t, d, w) end,
      })
    end
  end

  function d.remove(name)
    record("remove", name)
    if d.workers[name] then d.workers[name].stop() end
    d.workers[name], d.running[name] = nil, nil
  end

  if o.logs ~= false then
    function d.logs(name, lines)
      record("logs", { name, lines })
      return d.logs_text
    end
  end

  -- Stops every worker task still looping (a spec's last step: a worker
  -- whose broker is gone keeps retrying its ready).
  function d.close()
    for name, w in pairs(d.workers) do w.stop() d.workers[name] = nil end
  end

  function d.count(op)
    local n = 0
    for _, c in ipairs(d.calls) do if c.op == op then n = n + 1 end end
    return n
  end

  return d
end

return M
