-- examples/postgres.conf.lua: a sealed runtime whose guests keep notes in
-- PostgreSQL through two host tools, notes_put and notes_get
-- (lua/sandbox/adapters/postgres.lua). A note is private to the speaker who
-- wrote it (their principalId, else their id, from the bound turn: nothing
-- in the tool input can name another owner) unless it is saved with
-- visibility "shared", which makes it the channel's.
--
--   createdb sbx_notes                       # once, as a role that may CREATE in it
--   export MODEL_API_KEY=... PGCONNECT_TIMEOUT=5
--   sbx run examples/postgres.conf.lua --options '{"database":{"dbname":"sbx_notes"}}' \
--     --channel demo:one --speaker alice:Alice "Remember that my favourite colour is green"
--
-- The script's argument (sbx --options, or the Bun bridge's `options`):
--   database   {host, port, dbname, user, password, statementTimeoutMs}:
--              host is a host name or the server's socket directory
--              (default /var/run/postgresql), user defaults to $USER
--   every other member is a sandbox option and replaces the default below
--
-- The schema is migrated when the config loads (idempotent; the ledger is
-- the table sbx_schema_migrations). The driver blocks the engine's loop
-- while a query runs: each query is bounded by statement_timeout (2 s) and
-- the connect by PGCONNECT_TIMEOUT; keep the database on the same host or
-- network. The connection and its password stay on the host: the guest's
-- container never holds them.
local sandbox = require "sandbox"
local postgres = require "sandbox.adapters.postgres"

local o = ... or {}
local home = os.getenv("HOME")
if not home or home == "" then error("HOME is required", 0) end

local d = o.database or {}
local db = postgres.connect {
  host = d.host or os.getenv("PGHOST") or "/var/run/postgresql",
  port = d.port,
  dbname = d.dbname or os.getenv("PGDATABASE") or "sbx_notes",
  user = d.user or os.getenv("PGUSER") or os.getenv("USER") or "sbx",
  password = d.password or os.getenv("PGPASSWORD"),
  statementTimeoutMs = d.statementTimeoutMs,
}
postgres.migrate(db)

local options = {
  image = "pi-roundtable-sandbox:local",
  runRoot = "/tmp/roundtable-sandbox-run",
  workspaceRoot = home .. "/.local/share/roundtable-sandbox/workspaces",
  stateFile = home .. "/.local/share/roundtable-sandbox/state/channels.json",
  provider = "openai",
  model = "operator-selected-model",
  modelUrl = "https://api.openai.com/v1/chat/completions",
  apiKey = function() return os.getenv("MODEL_API_KEY") end,
  -- the worker names them host_notes_get and host_notes_put
  tools = postgres.notes_tools { db = db },
}
for k, v in pairs(o) do
  if k ~= "database" then options[k] = v end
end

return sandbox(options)
