-- adapters/postgres/_db.lua: the adapter's connection (Debian's
-- lua-dbi-postgresql: the `DBI` module over libpq) and its migrations.
-- connect{...} opens a session with statement_timeout and quiet notices;
-- db:exec / db:exec_max run one prepared statement with $n parameters
-- (never a spliced value), read at most `max` rows and raise
-- errors.PG_QUERY on failure; a statement whose connection the server
-- dropped is retried once on a new one. migrate(db) applies
-- _migrations.lua's versions missing from the ledger sbx_schema_migrations,
-- in one transaction under an advisory lock.
local errors = require "sandbox.errors"
local migrations = require "sandbox.adapters.postgres._migrations"

local M = {}

function M.opt_fail(detail) error(errors.PG_OPTIONS .. detail, 0) end
local opt_fail = M.opt_fail

local function load_driver()
  local ok, DBI = pcall(require, "DBI")
  if not ok or not pcall(require, "dbd.postgresql") then error(errors.PG_DRIVER, 0) end
  return DBI
end


local DB = {}
DB.__index = DB

local function int_opt(o, name, lo, hi, default)
  local v = o[name]
  if v == nil then return default end
  v = math.tointeger(v)                  -- 5432.0 from a JSON decoder is 5432
  if v == nil or v < lo or v > hi then
    opt_fail(string.format("%s must be an integer from %d to %d", name, lo, hi))
  end
  return v
end

-- connect{host, port, dbname, user, password, statementTimeoutMs}: host is a
-- host name or the directory of the server's Unix socket.
function M.connect(o)
  if type(o) ~= "table" then opt_fail("connect takes a table") end
  for _, k in ipairs { "host", "dbname", "user" } do
    if type(o[k]) ~= "string" or o[k] == "" then opt_fail(k .. " is required") end
  end
  if o.password ~= nil and type(o.password) ~= "string" then opt_fail("password must be a string") end
  local db = setmetatable({
    o = { host = o.host, port = int_opt(o, "port", 1, 65535, 5432), dbname = o.dbname, user = o.user,
          password = o.password or "" },
    timeout = int_opt(o, "statementTimeoutMs", 1, 60000, 2000),
  }, DB)
  db:_open()
  return db
end

-- One prepared statement: its rows (at most max) and affected count, or nil.
local function run(dbh, max, sql, ...)
  local sth = dbh:prepare(sql)
  if not sth then return nil end
  if not sth:execute(...) then
    sth:close()
    return nil
  end
  local rows = {}
  while #rows < max do
    local row = sth:fetch(true)
    if not row then break end
    rows[#rows + 1] = row
  end
  local affected = sth:affected()
  sth:close()
  return rows, affected
end

local SESSION = "SELECT set_config('statement_timeout', $1::text, false), "
  .. "set_config('client_min_messages', 'warning', false)"

function DB:_open()
  local DBI = load_driver()
  local o = self.o
  local ok, dbh, why = pcall(DBI.Connect, "PostgreSQL", o.dbname, o.user, o.password, o.host, o.port)
  if not ok or not dbh then
    -- libpq's text names the host and the cause, never the password
    error(errors.PG_CONNECT .. tostring(ok and why or dbh):gsub("%s+$", ""), 0)
  end
  dbh:autocommit(true)
  -- not through exec: a session that fails its first statement is not retried
  if not run(dbh, 1, SESSION, tostring(self.timeout)) then
    pcall(dbh.close, dbh)
    error(errors.PG_CONNECT .. "the session's settings were refused", 0)
  end
  self.dbh = dbh
end

-- The connection, reopened once when the server dropped it.
function DB:_live()
  if self.dbh and self.dbh:ping() then return self.dbh end
  if self.dbh then pcall(self.dbh.close, self.dbh) end
  self.dbh = nil
  self:_open()
  return self.dbh
end

-- exec(sql, ...) -> rows (a list of {column = value}, at most `max` of them)
-- and the affected count. Parameters are bound, never spliced. A failure
-- raises errors.PG_QUERY: the server's text may quote a row, so it is kept
-- from the message (the server's own log has it).
function DB:exec(sql, ...)
  return self:exec_max(nil, sql, ...)
end

-- Outside a transaction a statement whose connection the server dropped
-- (a restart, an idle timeout) is retried once on a new connection: every
-- statement of the adapter is a read or an upsert, safe to repeat.
function DB:exec_max(max, sql, ...)
  max = max or 1000
  local rows, affected = run(self.dbh or self:_live(), max, sql, ...)
  if rows then return rows, affected end
  if not self.in_tx and not self.dbh:ping() then
    rows, affected = run(self:_live(), max, sql, ...)
    if rows then return rows, affected end
  end
  error(errors.PG_QUERY, 0)
end

function DB:close()
  if self.dbh then pcall(self.dbh.close, self.dbh) end
  self.dbh = nil
end


local LEDGER = [[CREATE TABLE IF NOT EXISTS sbx_schema_migrations (
  version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())]]
local LOCK_KEY = "7307734223571"   -- pg_advisory_xact_lock's key for this schema

-- migrate(db) -> the list of versions applied now (empty when up to date).
function M.migrate(db)
  local dbh = db:_live()
  dbh:autocommit(false)
  db.in_tx = true
  local ok, applied = pcall(function()
    db:exec("SELECT pg_advisory_xact_lock($1::bigint)", LOCK_KEY)
    db:exec(LEDGER)
    local have = {}
    for _, r in ipairs(db:exec("SELECT version FROM sbx_schema_migrations")) do have[tonumber(r.version)] = true end
    local done = {}
    for _, m in ipairs(migrations) do
      if not have[m.version] then
        for _, s in ipairs(m.statements) do db:exec(s) end
        db:exec("INSERT INTO sbx_schema_migrations(version, name) VALUES ($1::integer, $2::text)",
          tostring(m.version), m.name)
        done[#done + 1] = m.version
      end
    end
    return done
  end)
  if ok then ok = dbh:commit() else dbh:rollback() end
  dbh:autocommit(true)
  db.in_tx = false
  if not ok then error(errors.PG_MIGRATE, 0) end
  return applied
end

-- The db of an adapter part's options, else the option error naming `who`.
function M.db_of(o, who)
  if type(o) ~= "table" or getmetatable(o.db) ~= DB then opt_fail(who .. " needs db = postgres.connect{...}") end
  return o.db
end

M.DB = DB
return M
