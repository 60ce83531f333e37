-- pg_cluster.lua: a throwaway PostgreSQL cluster for the adapter's specs
-- (issue 24 item 4): initdb into a private temporary directory, a server
-- that listens only on a Unix socket in that directory (listen_addresses
-- empty: no TCP port), stopped (immediate) and removed by stop(). It runs
-- as the spec user; initdb refuses root, so as root it is not available.
--
--   local pg = require "pg_cluster"
--   local ok, why = pg.available()      -- why names the fix
--   local c = pg.start()                -- {dir, host, port, user, dbname, stop=}
--   c:createdb("name")                  -- a fresh database
--   c:stop()                            -- always, in a teardown
local spec_fs = require "spec_fs"

local M = {}

-- The newest server binaries Debian installed (postgresql-NN), or SBX_PG_BIN.
function M.bindir()
  local env = os.getenv("SBX_PG_BIN")
  if env and env ~= "" then return env end
  local out = spec_fs.sh("ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1")
  return out ~= "" and out or nil
end

function M.available()
  local bin = M.bindir()
  if not bin or not spec_fs.exists(bin .. "/initdb") or not spec_fs.exists(bin .. "/pg_ctl") then
    return false, "PostgreSQL server binaries are not installed (apt-get install postgresql, or make deps)"
  end
  if spec_fs.sh("id -u") == "0" then
    return false, "initdb refuses root: run the specs as the service account (scripts/check.sh does)"
  end
  if not pcall(require, "DBI") or not pcall(require, "dbd.postgresql") then
    return false, "lua-dbi-postgresql is not installed (apt-get install lua-dbi-postgresql, or make deps)"
  end
  return true
end

-- Under CI a missing cluster is a failure, elsewhere the caller's pending.
function M.require(describe_name, pending_fn)
  local ok, why = M.available()
  if ok then return true end
  if os.getenv("CI") == "true" then error("CI=true: " .. why, 0) end
  describe(describe_name, function() pending_fn(why) end)
  return false
end

local Cluster = {}
Cluster.__index = Cluster

-- The server and its tools are not the code under test: under the ASan
-- suite (LD_PRELOAD of the sanitizer runtime) they run without it.
local CLEAN = "env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS "

local function run_or_fail(cmd, what, log)
  local out, code = spec_fs.run(CLEAN .. cmd .. " 2>&1")
  if code ~= 0 then
    local tail = log and spec_fs.sh("tail -n 20 " .. spec_fs.q(log) .. " 2>/dev/null") or ""
    error(what .. " failed (" .. tostring(code) .. "): " .. out .. "\n" .. tail, 0)
  end
  return out
end

function M.start()
  local bin = assert(M.bindir(), "no PostgreSQL binaries")
  -- short: the socket path (<dir>/.s.PGSQL.5432) must fit sun_path
  local dir = spec_fs.tmpdir("pg", nil, spec_fs.short_tmp())
  local c = setmetatable({ dir = dir, bin = bin, host = dir, port = 5432,
    user = spec_fs.sh("id -un"), dbname = "postgres", data = dir .. "/data", log = dir .. "/server.log" }, Cluster)
  local ok, err = pcall(function()
    run_or_fail(string.format("%s/initdb -D %s -U %s -A trust -E UTF8 --no-locale", bin,
      spec_fs.q(c.data), spec_fs.q(c.user)), "initdb")
    run_or_fail(string.format("%s/pg_ctl -D %s -l %s -w -t 60 -o %s start", bin, spec_fs.q(c.data),
      spec_fs.q(c.log), spec_fs.q("-k " .. dir .. " -c listen_addresses='' -c fsync=off")), "pg_ctl start", c.log)
    c.started = true
  end)
  if not ok then
    c:stop()
    error(err, 0)
  end
  return c
end

function Cluster:psql(db, sql)
  return run_or_fail(string.format("%s/psql -X -q -At -v ON_ERROR_STOP=1 -h %s -p %d -U %s -d %s -c %s",
    self.bin, spec_fs.q(self.host), self.port, spec_fs.q(self.user), spec_fs.q(db), spec_fs.q(sql)), "psql")
end

function Cluster:createdb(name)
  assert(name:match("^[a-z_][a-z0-9_]*$"), "a plain database name")
  self:psql("postgres", "CREATE DATABASE " .. name)
  return name
end

-- connect options for sandbox.adapters.postgres.connect
function Cluster:opts(dbname)
  return { host = self.host, port = self.port, user = self.user, dbname = dbname or self.dbname }
end

function Cluster:stop()
  if self.stopped then return end
  self.stopped = true
  if self.started then
    spec_fs.run(CLEAN .. string.format("%s/pg_ctl -D %s -m immediate -w -t 60 stop >/dev/null 2>&1", self.bin, spec_fs.q(self.data)))
  end
  spec_fs.run("rm -rf " .. spec_fs.q(self.dir))
end

return M
