-- adapters/postgres/_notes.lua: the notes_get / notes_put pair, as sealed
-- host tools (notes_tools) and in rich mode's tools.names / tools.call
-- shape (rich_tools). Identity is the bound turn's only (_rules.identity).
local db_mod = require "sandbox.adapters.postgres._db"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local R = require "sandbox.adapters.postgres._rules"

local M = {}

local text_ok, identity, refused = R.text_ok, R.identity, R.refused
local KEY_RULE, VALUE_RULE, VIS_RULE, VIS = R.KEY_RULE, R.VALUE_RULE, R.VIS_RULE, R.VIS
local db_of = db_mod.db_of


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
  if type(input) ~= "table" or not text_ok(input.key, 1, R.LIMITS.key, true) then
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
  if not text_ok(input.key, 1, R.LIMITS.key, true) then return refused("notes_put", KEY_RULE) end
  if not text_ok(input.value, 0, R.LIMITS.value) then return refused("notes_put", VALUE_RULE) end
  local vis = input.visibility
  if vis == nil or vis == json.null then vis = "private" end
  if not VIS[vis] then return refused("notes_put", VIS_RULE) end
  db:_live()
  local row_owner = vis == "shared" and "" or owner
  local cap = vis == "shared" and R.LIMITS.rowsShared or R.LIMITS.rowsPerOwner
  local _, affected = db:exec(PUT, channel, row_owner, vis, input.key, input.value, owner, tostring(cap))
  if (tonumber(affected) or 0) < 1 then
    return refused("notes_put", string.format("this channel already holds %d %s notes; overwrite one", cap, vis))
  end
  return string.format("saved %s note %q", vis, input.key)
end


local DESCRIPTIONS = {
  notes_get = "Read a note by key: your private note and this channel's shared note of that key.",
  notes_put = 'Save a note by key. Private to you unless visibility is "shared" (everyone in this channel).',
}

local PARAMS = {
  notes_get = { type = "object", additionalProperties = false, required = { "key" },
    properties = { key = { type = "string", minLength = 1, maxLength = R.LIMITS.key } } },
  notes_put = { type = "object", additionalProperties = false, required = { "key", "value" },
    properties = {
      key = { type = "string", minLength = 1, maxLength = R.LIMITS.key },
      value = { type = "string", maxLength = R.LIMITS.value },
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

return M
