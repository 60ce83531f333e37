-- adapters/postgres.lua: a host adapter over PostgreSQL (issue 24 item 4):
-- people's notes and memory kept in a database, never in a workspace file
-- or the image. This is its public face; the parts are in postgres/: the
-- connection (Debian's lua-dbi-postgresql, the `DBI` module over libpq) and
-- migrations (_db.lua; the migration file _migrations.lua, the ledger table
-- sbx_schema_migrations), the guest-input rules and bounds (_rules.lua), the
-- sealed host-tool pair notes_get / notes_put and the same pair in rich
-- mode's tools.call shape (_notes.lua), and rich mode's memory.promptBlock /
-- memory.visibility (_memory.lua).
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

local db = require "sandbox.adapters.postgres._db"
local memory = require "sandbox.adapters.postgres._memory"
local notes = require "sandbox.adapters.postgres._notes"
local rules = require "sandbox.adapters.postgres._rules"

return {
  connect = db.connect,             -- connect{host, port, dbname, user, password, statementTimeoutMs}
  migrate = db.migrate,             -- migrate(db) -> versions applied now
  notes_tools = notes.notes_tools,  -- {db} -> { notes_get, notes_put } host tools
  rich_tools = notes.rich_tools,    -- {db} -> {names, call} for sandbox.rich
  memory = memory.memory,           -- {db, visibility} -> sandbox.rich's memory
  owner = rules.owner,              -- (id, principalId) -> the row owner
  LIMITS = rules.LIMITS,            -- the bounds (one table)
  DB = db.DB,
}
