-- rich_docker_fake.lua: the scripted Engine API of rich mode's container
-- lifecycle (spec/fixtures/rich_docker_api.mjs, a real Unix socket served by
-- node) for the specs that drive it: spec/rich/docker_spec.lua (the rich
-- Docker driver) and spec/driver_engine_spec.lua (the contract's long-lived
-- primitives on the Engine API driver).
--
--   local F = rich_docker_fake.start("tag")   -- in setup(); raises when node is missing
--   F.dir, F.sock
--   F:state(t)      the daemon's next state (containers, answers), a fresh log
--   F:requests()    what the daemon was asked since: {method, url, body}, ...
--   F:stop()        in teardown(): the daemon killed, its folder removed
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local spec_fs = require "spec_fs"

local M = {}

local Fake = {}
Fake.__index = Fake

function M.start(tag)
  local node = spec_fs.sh("command -v node 2>/dev/null")
  assert(node ~= "", "node is required for the fake daemon (make deps installs it)")
  local f = setmetatable({ tag = tag, seed = 0, exited = false }, Fake)
  f.dir = spec_fs.tmpdir(tag)
  f.sock = f.dir .. "/docker.sock"
  spec_fs.write(f.dir .. "/state.json", "{}")
  f.proc = core.spawn { file = node, args = { "spec/fixtures/rich_docker_api.mjs", f.sock, f.dir .. "/state.json",
    f.dir .. "/log.jsonl" }, env = {}, on_exit = function() f.exited = true end }
  async.run(function()
    for _ = 1, 200 do
      if core.fs_lstat(f.sock) then return end
      async.sleep(20)
    end
    error("the fake daemon did not start")
  end)
  return f
end

function Fake:stop()
  if self.proc then self.proc:kill(core.SIGKILL) while not self.exited do core.run("once") end end
  if self.dir then spec_fs.rmdir(self.dir, self.tag) end
end

function Fake:state(t)
  self.seed = self.seed + 1
  t.seed = self.seed
  os.remove(self.dir .. "/log.jsonl")
  spec_fs.write(self.dir .. "/state.json", assert(json.encode(json.jsonable(t))))
end

function Fake:requests()
  local out = {}
  local f = io.open(self.dir .. "/log.jsonl")
  if not f then return out end
  for line in f:lines() do out[#out + 1] = json.plain(json.decode(line)) end
  f:close()
  return out
end

return M
