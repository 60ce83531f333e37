-- examples/postgres-rich.conf.lua: a rich-mode (Pi/subscription) runtime
-- whose memory and notes live in PostgreSQL (lua/sandbox/adapters/postgres.lua):
--   memory.promptBlock  the channel's shared notes and the reader's own
--                       private notes; memory.visibility "private" (the
--                       default: the block taints the reader's record)
--   tools               notes_get and notes_put (a read that holds a private
--                       row is tagged privateTo the reader)
-- The worker learns of the two tools from its content module, as
-- examples/rich.conf.lua's tools (examples/rich-content.ts).
--
-- A trusted Lua config; its argument (the Bun bridge's `options`, or
-- `sbx doctor --options JSON`):
--   partyDir   the private state directory (required)
--   database   {host, port, dbname, user, password, statementTimeoutMs}
--              (defaults: $PGHOST or /var/run/postgresql, $PGDATABASE or
--              sbx_notes, $PGUSER or $USER)
--   every other member is a sandbox.rich option and replaces the default below
-- The schema is migrated when the config loads (idempotent). The driver
-- blocks the loop while a query runs: statement_timeout (2 s) bounds each
-- one, PGCONNECT_TIMEOUT the connect (docs/operations.md 10).
local sandbox = require "sandbox"
local postgres = require "sandbox.adapters.postgres"
local rich = sandbox.rich

local o = ... or {}
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
  partyDir = o.partyDir,
  image = "pi-roundtable-sandbox:pi",
  profiles = { default = { model = "claude-sonnet-4-6" } },
  oauthToken = function() return os.getenv("ANTHROPIC_OAUTH_TOKEN") end,
  effort = { judge = function(text, ctx) return #text > 2000 and "high" or ctx.level or "low" end },
  memory = postgres.memory { db = db },                -- visibility = "private"
  tools = postgres.rich_tools { db = db },
  startTimeoutMs = 120000,
  turnTimeoutMs = 300000,
}
for k, v in pairs(o) do
  if k ~= "database" then options[k] = v end
end
if options.driver == nil then options.driver = rich.dockerDriver {} end

return rich(options)
