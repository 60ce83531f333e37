-- adapters/postgres.lua: a host adapter over PostgreSQL (issue 24 item 4):
-- people's notes and memory kept in a database, never in a workspace file
-- or the image. It owns the connection (Debian's lua-dbi-postgresql, the
-- `DBI` module over libpq), the schema migrations (postgres/_migrations.lua,
-- with the ledger table sbx_schema_migrations), the sealed host-tool pair
-- notes_get / notes_put (and the same pair in rich mode's tools.call shape),
-- and rich mode's memory.promptBlock / memory.visibility.
--
--   local pg = require "sandbox.adapters.postgres"
--   local db = pg.connect { host = "/run/postgresql", dbname = "sbx", user = "sbx" }
--   pg.migrate(db)                              -- idempotent
--   sandbox { ..., tools = pg.notes_tools { db = db } }
--   sandbox.rich { ..., memory = pg.memory { db = db }, tools = pg.rich_tools { db = db } }
--
-- Privacy (the original's rule): a note is private to the admitted reader
-- who wrote it unless `visibility = "shared"` is declared, which makes it
-- the channel's. The owner is ctx.speaker.principalId (else ctx.speaker.id)
-- of the bound turn, in two namespaces that never meet (M.owner); nothing in the tool input names a channel, speaker or
-- owner (a `speaker` member is input data and never read). A read returns
-- the caller's private row and the channel's shared row; never another
-- speaker's private row and never another channel's row.
--
-- Every query is a prepared statement with $n parameters: no value is ever
-- spliced into SQL. Inputs are bounded (key 128 bytes, value 4,000 bytes,
-- UTF-8, no NUL: libpq would cut a value at a NUL), rows per owner per
-- channel are capped, every read has a LIMIT, and every statement runs
-- under the connection's statement_timeout.
--
-- The driver blocks: while a query runs, the engine's loop waits. Each one
-- is bounded by statement_timeout (statementTimeoutMs, default 2,000 ms) and
-- the connect by PGCONNECT_TIMEOUT (libpq's environment; set it, e.g. 5);
-- keep the database near the host (a Unix socket or the same network).
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local migrations = require "sandbox.adapters.postgres._migrations"

local M = {}

M.LIMITS = {
  key = 128,          -- bytes
  value = 4000,       -- bytes
  ident = 256,        -- channel, owner, author (bytes)
  rowsPerOwner = 200, -- private rows of one owner in one channel
  rowsShared = 500,   -- shared rows of one channel
  promptRows = 100,   -- rows of each kind in a prompt block
  promptChars = 100000,
}

local VIS = { private = true, shared = true }

local function opt_fail(detail) error(errors.PG_OPTIONS .. detail, 0) end

local function load_driver()
  local ok, DBI = pcall(require, "DBI")
  if not ok or not pcall(require, "dbd.postgresql") then error(errors.PG_DRIVER, 0) end
  return DBI
end

-- ---- connection -------------------------------------------------------------

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

-- ---- migrations ---------------------------------------------------------------

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

-- ---- validation -----------------------------------------------------------------

-- A guest string: valid UTF-8, no NUL, no control characters in keys.
local function text_ok(s, lo, hi, is_key)
  if type(s) ~= "string" or #s < lo or #s > hi or not json.utf8_valid(s) or s:find("\0", 1, true) then
    return false
  end
  if is_key and s:find("[%c]") then return false end
  return true
end

-- The row owner of a reader: "p:" .. principalId, else "s:" .. speaker id.
-- The two namespaces never meet, so a speaker whose platform id happens to
-- equal someone's principalId is not that principal. nil when neither is
-- a valid identifier.
function M.owner(id, principalId)
  if principalId ~= nil then
    return text_ok(principalId, 1, M.LIMITS.ident) and "p:" .. principalId or nil
  end
  return text_ok(id, 1, M.LIMITS.ident) and "s:" .. id or nil
end

-- The bound identity: the turn's channel and its reader. Raises (the turn's
-- operator sees tool_failed) when the host bound none.
local function identity(ctx)
  local channel, sp = ctx and ctx.channel, ctx and ctx.speaker
  local owner = type(sp) == "table" and M.owner(sp.id, sp.principalId)
  if not text_ok(channel, 1, M.LIMITS.ident) or not owner then error(errors.PG_IDENTITY, 0) end
  return channel, owner
end

local function refused(tool, why) return tool .. " refused: " .. why end

local KEY_RULE = "key must be a string of 1 to 128 bytes of UTF-8 text without control characters"
local VALUE_RULE = "value must be a string of at most 4000 bytes of UTF-8 text without NUL"
local VIS_RULE = 'visibility must be "private" (the default) or "shared"'

-- ---- notes --------------------------------------------------------------------------

local GET = [[SELECT visibility, value FROM sbx_notes
  WHERE channel = $1::text AND key = $2::text AND owner IN ($3::text, '')
  ORDER BY visibility LIMIT 2]]

-- One statement: insert or update, unless the owner's rows are at the cap
-- (an existing key may always be updated).
local PUT = [[INSERT INTO sbx_notes (channel, owner, visibility, key, value, author)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text
  WHERE EXISTS (SELECT 1 FROM sbx_notes WHERE channel = $1::text AND owner = $2::text AND key = $4::text)
     OR (SELECT count(*) FROM sbx_notes WHERE channel = $1::text AND owner = $2::text) < $7::integer
  ON CONFLICT (channel, owner, key)
  DO UPDATE SET value = EXCLUDED.value, author = EXCLUDED.author, updated_at = now()]]

local function check_signal(ctx)
  local sig = ctx and ctx.signal
  if sig and sig.throw_if_aborted then sig:throw_if_aborted() end
end

-- get(db, input, ctx) -> text, private? (whether a private row is in it)
local function get(db, input, ctx)
  check_signal(ctx)
  local channel, owner = identity(ctx)
  if type(input) ~= "table" or not text_ok(input.key, 1, M.LIMITS.key, true) then
    return refused("notes_get", KEY_RULE), false
  end
  db:_live()
  local rows = db:exec_max(2, GET, channel, input.key, owner)
  local found = {}
  for _, r in ipairs(rows) do found[r.visibility] = r.value end
  local out = json.object({ "key", "private", "shared" }, {
    key = input.key, private = found.private or json.null, shared = found.shared or json.null,
  })
  return json.encode(out), found.private ~= nil
end

local function put(db, input, ctx)
  check_signal(ctx)
  local channel, owner = identity(ctx)
  if type(input) ~= "table" then return refused("notes_put", KEY_RULE) end
  if not text_ok(input.key, 1, M.LIMITS.key, true) then return refused("notes_put", KEY_RULE) end
  if not text_ok(input.value, 0, M.LIMITS.value) then return refused("notes_put", VALUE_RULE) end
  local vis = input.visibility
  if vis == nil or vis == json.null then vis = "private" end
  if not VIS[vis] then return refused("notes_put", VIS_RULE) end
  db:_live()
  local row_owner = vis == "shared" and "" or owner
  local cap = vis == "shared" and M.LIMITS.rowsShared or M.LIMITS.rowsPerOwner
  local _, affected = db:exec(PUT, channel, row_owner, vis, input.key, input.value, owner, tostring(cap))
  if (tonumber(affected) or 0) < 1 then
    return refused("notes_put", string.format("this channel already holds %d %s notes; overwrite one", cap, vis))
  end
  return string.format("saved %s note %q", vis, input.key)
end

local function db_of(o, who)
  if type(o) ~= "table" or getmetatable(o.db) ~= DB then opt_fail(who .. " needs db = postgres.connect{...}") end
  return o.db
end

local DESCRIPTIONS = {
  notes_get = "Read a note by key: your private note and this channel's shared note of that key.",
  notes_put = 'Save a note by key. Private to you unless visibility is "shared" (everyone in this channel).',
}

local PARAMS = {
  notes_get = { type = "object", additionalProperties = false, required = { "key" },
    properties = { key = { type = "string", minLength = 1, maxLength = M.LIMITS.key } } },
  notes_put = { type = "object", additionalProperties = false, required = { "key", "value" },
    properties = {
      key = { type = "string", minLength = 1, maxLength = M.LIMITS.key },
      value = { type = "string", maxLength = M.LIMITS.value },
      visibility = { type = "string", enum = { "private", "shared" } },
    } },
}

-- notes_tools{db} -> { notes_get, notes_put }: host tools for sandbox{tools=...}.
function M.notes_tools(o)
  local db = db_of(o, "notes_tools")
  return {
    { name = "notes_get", description = DESCRIPTIONS.notes_get, parameters = PARAMS.notes_get,
      run = function(input, ctx) return (get(db, input, ctx)) end },
    { name = "notes_put", description = DESCRIPTIONS.notes_put, parameters = PARAMS.notes_put,
      run = function(input, ctx) return put(db, input, ctx) end },
  }
end

-- rich_tools{db} -> {names, call}: the same pair for sandbox.rich's tools
-- option (rich-mode.md 12). A read holding a private row is tagged
-- privateTo the reader, which needs a bound principal.
function M.rich_tools(o)
  local db = db_of(o, "rich_tools")
  return {
    names = { "notes_get", "notes_put" },
    call = function(name, input, ctx)
      if name == "notes_put" then return { ok = true, text = put(db, input, ctx) } end
      if name ~= "notes_get" then return { ok = false, error = "unknown tool" } end
      local text, private = get(db, input, ctx)
      if not private then return { ok = true, text = text } end
      local pid = ctx and ctx.speaker and ctx.speaker.principalId
      if type(pid) ~= "string" or pid == "" then error(errors.PG_IDENTITY, 0) end
      return { ok = true, text = text, privateTo = pid }
    end,
  }
end

-- ---- memory (rich mode) ----------------------------------------------------------------

local SHARED_ROWS = [[SELECT key, value FROM sbx_notes WHERE channel = $1::text AND owner = ''
  ORDER BY updated_at DESC, key LIMIT $2::integer]]
local PRIVATE_ROWS = [[SELECT key, value FROM sbx_notes WHERE channel = $1::text AND owner = $2::text
  ORDER BY updated_at DESC, key LIMIT $3::integer]]

-- Appends "- key: value" lines while the block stays within the limit.
local function add_lines(parts, size, title, rows)
  if #rows == 0 then return size end
  local head = title .. "\n"
  if size + #head > M.LIMITS.promptChars then return size end
  parts[#parts + 1] = head
  size = size + #head
  for _, r in ipairs(rows) do
    local line = "- " .. r.key .. ": " .. r.value:gsub("[\r\n]+", " ") .. "\n"
    if size + #line > M.LIMITS.promptChars then break end
    parts[#parts + 1] = line
    size = size + #line
  end
  return size
end

-- memory{db, visibility} -> rich mode's `memory` option. With "private"
-- (the default) the block holds the reader's private notes and the
-- channel's shared ones; with "shared" (the block is declared public to the
-- party) it holds the shared notes only, so nobody's private row can reach
-- a block that taints no reader record.
function M.memory(o)
  local db = db_of(o, "memory")
  local vis = o.visibility == nil and "private" or o.visibility
  if not VIS[vis] then opt_fail(VIS_RULE) end
  return {
    visibility = vis,
    promptBlock = function(channel, id, _name, principalId)
      local owner = M.owner(id, principalId)
      if not text_ok(channel, 1, M.LIMITS.ident) or not owner then
        error(errors.PG_IDENTITY, 0)
      end
      db:_live()
      local n = tostring(M.LIMITS.promptRows)
      local parts, size = {}, 0
      size = add_lines(parts, size, "Notes shared in this channel:",
        db:exec_max(M.LIMITS.promptRows, SHARED_ROWS, channel, n))
      if vis == "private" then
        add_lines(parts, size, "Your private notes:",
          db:exec_max(M.LIMITS.promptRows, PRIVATE_ROWS, channel, owner, n))
      end
      return table.concat(parts)
    end,
  }
end

M.DB = DB
return M
