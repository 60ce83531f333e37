-- drivers/_lasting.lua: the long-lived lifecycle of the driver contract
-- (spec/rich-mode.md 5.1, 5.4): one container per channel that outlives the
-- turns, kept running, asked for its state, removed, its logs read. Written
-- once over a driver's long-lived primitives, so the CLI driver
-- (drivers/cli.lua) and the Engine API driver (drivers/engine.lua) make and
-- keep the same container by the same rules. drivers/contract.lua re-exports
-- these; rich/docker.lua turns them into rich mode's driver table.
--
--   lasting.status(d, name, label) -> {state="missing"|"running"|"stopped", image=?, profile=?}
--                                      profile: the container's label `label`
--   lasting.ensure_running(d, spec, logcfg, label)
--                                      nothing when a running container has
--                                      spec's image and profile; else any
--                                      other is removed, then created and started
--   lasting.remove(d, name)            forced; a missing container is fine
--   lasting.logs(d, name, lines) -> text   the last max(1, floor(lines)) lines;
--                                      "" for a missing container
--
-- The primitives a driver d provides (each yields; each raises the driver's
-- `docker ...` error, errors.RICH_DOCKER, for an answer it does not accept):
--   d:render_lasting(spec, logcfg) -> r   pure: {name=, image=, profile=,
--                                   rendered=} (drivers/_rich.lua's body or argv)
--   d:inspect_container(name) -> nil | {running=, image=, labels=}   nil: missing
--   d:create_lasting(r)             create it (never pulls)
--   d:start_lasting(name)           start it (already running is fine)
--   d:remove_lasting(name)          remove it by force (missing is fine)
--   d:lasting_logs(name, n) -> text the last n lines of stdout and stderr
-- The names reaching these were checked against ^[a-z0-9][a-z0-9_.-]{0,90}$
-- (a name is an argv element and a URL path segment: never an option).
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

local function check_name(name)
  if type(name) ~= "string" or #name > 91 or not name:find("^[a-z0-9][a-z0-9_.%-]*$") then
    error(errors.RICH_SPEC, 0)
  end
end

function M.status(d, name, label)
  check_name(name)
  local v = d:inspect_container(name)
  if v == nil then return { state = "missing" } end
  local out = { state = v.running == true and "running" or "stopped" }
  if type(v.image) == "string" then out.image = v.image end
  local labels = type(v.labels) == "table" and v.labels or {}
  if type(labels[label]) == "string" then out.profile = labels[label] end
  return out
end

function M.remove(d, name)
  check_name(name)
  d:remove_lasting(name)
end

function M.ensure_running(d, spec, logcfg, label)
  check_name(spec.name)
  local r = d:render_lasting(spec, logcfg)
  local st = M.status(d, r.name, label)
  if st.state == "running" and st.image == r.image and st.profile == r.profile then return end
  if st.state ~= "missing" then M.remove(d, r.name) end
  d:create_lasting(r)
  d:start_lasting(r.name)
end

function M.logs(d, name, lines)
  check_name(name)
  local n = math.max(1, math.floor(tonumber(lines) or 1))
  return d:lasting_logs(name, n)
end

-- The first n characters of s (its first n bytes when it is not UTF-8): the
-- part of a daemon's answer an error quotes (5.4: 300).
function M.first_chars(s, n)
  if utf8.len(s) == nil then return s:sub(1, n) end
  local stop = utf8.offset(s, n + 1)
  return stop and s:sub(1, stop - 1) or s
end

-- Inspect's container object (`docker container inspect`'s element, GET
-- /containers/<name>/json) as inspect_container's answer, or nil when it
-- is not one.
function M.facts(v)
  if json.kind(v) ~= "object" then return nil end
  local cfg = json.kind(v.Config) == "object" and v.Config or {}
  return {
    running = json.kind(v.State) == "object" and v.State.Running == true,
    image = type(cfg.Image) == "string" and cfg.Image or nil,
    labels = json.kind(cfg.Labels) == "object" and cfg.Labels or {},
  }
end

return M
