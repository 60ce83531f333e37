-- postgres_spec.lua: the PostgreSQL adapter (lua/sandbox/adapters/postgres.lua,
-- issue 24 item 4) against a real throwaway cluster this spec starts and
-- stops itself (pg_cluster.lua: initdb, a Unix socket in a temp dir, no TCP):
-- the migration and its ledger, notes privacy (private to the reader by
-- default, shared declared, another channel never), a guest's SQL injection
-- through tool arguments, the bounds, rich mode's promptBlock/visibility and
-- the rich tools.call shape. Under CI=true a missing server is a failure.
local cluster = require "pg_cluster"
if not cluster.require("the PostgreSQL adapter", pending) then return end

local pg = require "sandbox.adapters.postgres"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local C
setup(function() C = cluster.start() end)
teardown(function() if C then C:stop() end end)

local n = 0
local function fresh()
  n = n + 1
  local db = pg.connect(C:opts(C:createdb("notes_" .. n)))
  pg.migrate(db)
  return db, "notes_" .. n
end

local function ctx(channel, id, principal)
  return { channel = channel, speaker = { id = id, name = id:upper(), principalId = principal } }
end

local function tools(db)
  local t = pg.notes_tools { db = db }
  return { get = t[1].run, put = t[2].run, list = t }
end

local function got(text) return json.decode(text) end

describe("migrate", function()
  it("applies 001_notes once, records it in the ledger and is idempotent", function()
    local db = pg.connect(C:opts(C:createdb("migr")))
    assert.same({ 1 }, pg.migrate(db))
    assert.same({}, pg.migrate(db))
    assert.same({}, pg.migrate(pg.connect(C:opts("migr"))))   -- a second host
    assert.equal("1|001_notes", C:psql("migr", "SELECT version, name FROM sbx_schema_migrations"))
    assert.equal("sbx_notes", C:psql("migr", "SELECT tablename FROM pg_tables WHERE tablename = 'sbx_notes'"))
    db:close()
  end)

  it("a migration that fails applies nothing and names the fix", function()
    local name = C:createdb("migr_bad")
    C:psql(name, "CREATE TABLE sbx_notes (x int)")                 -- in the way
    local db = pg.connect(C:opts(name))
    local ok, err = pcall(pg.migrate, db)
    assert.is_false(ok)
    assert.equal(errors.PG_MIGRATE, err)
    assert.truthy(errors.fix(err))
    assert.equal("", C:psql(name, "SELECT to_regclass('sbx_schema_migrations')"))  -- rolled back whole
  end)
end)

describe("connect", function()
  it("names the cause when nothing listens, and never the password", function()
    local o = C:opts()
    o.port, o.password = 1, "pw-secret-1234"
    local ok, err = pcall(pg.connect, o)
    assert.is_false(ok)
    assert.matches("^PostgreSQL connection failed: ", err)
    assert.is_nil(err:find("pw-secret-1234", 1, true))
  end)

  it("refuses bad options", function()
    assert.has_error(function() pg.connect { host = C.host, user = C.user } end, errors.PG_OPTIONS .. "dbname is required")
    local o = C:opts() o.port = 0
    assert.has_error(function() pg.connect(o) end, errors.PG_OPTIONS .. "port must be an integer from 1 to 65535")
    o.port, o.statementTimeoutMs = 5432.0, 1.5                        -- a JSON number is fine, a fraction is not
    assert.has_error(function() pg.connect(o) end, errors.PG_OPTIONS .. "statementTimeoutMs must be an integer from 1 to 60000")
    o.statementTimeoutMs = 1000.0
    pg.connect(o):close()
    assert.has_error(function() pg.notes_tools {} end)
    assert.has_error(function() pg.memory { db = fresh(), visibility = "public" } end)
  end)

  it("sets statement_timeout on the connection", function()
    local db = fresh()
    assert.equal("2s", db:exec("SHOW statement_timeout")[1].statement_timeout)
    local short = pg.connect((function() local o = C:opts("notes_" .. n) o.statementTimeoutMs = 50 return o end)())
    local ok, err = pcall(short.exec, short, "SELECT pg_sleep(5)")
    assert.is_false(ok)
    assert.equal(errors.PG_QUERY, err)
  end)
end)

describe("notes_get / notes_put", function()
  it("are two host tools of the sealed shape", function()
    local t = tools(fresh()).list
    assert.equal("notes_get", t[1].name)
    assert.equal("notes_put", t[2].name)
    for _, tool in ipairs(t) do
      assert.is_string(tool.description)
      assert.equal("object", tool.parameters.type)
      assert.is_function(tool.run)
    end
  end)

  it("round-trip a private note (the default)", function()
    local T = tools(fresh())
    local ann = ctx("fake:c1", "ann", "p_ann")
    assert.equal('saved private note "color"', T.put({ key = "color", value = "green" }, ann))
    local r = got(T.get({ key = "color" }, ann))
    assert.equal("green", r.private)
    assert.equal(json.null, r.shared)
    T.put({ key = "color", value = "blue" }, ann)                        -- overwrite
    assert.equal("blue", got(T.get({ key = "color" }, ann)).private)
  end)

  it("keep one speaker's private rows from another, even with a forged speaker in the input", function()
    local db = fresh()
    local T = tools(db)
    local ann, bob = ctx("fake:c1", "ann", "p_ann"), ctx("fake:c1", "bob", "p_bob")
    T.put({ key = "secret", value = "ann-only" }, ann)
    local r = got(T.get({ key = "secret", speaker = "ann", principalId = "p_ann", owner = "p_ann",
      channel = "fake:c1" }, bob))
    assert.equal(json.null, r.private)
    assert.equal(json.null, r.shared)
    -- bob's forged put lands in bob's own row, ann's stays hers
    T.put({ key = "secret", value = "bob-wrote", speaker = "ann", owner = "p_ann" }, bob)
    assert.equal("ann-only", got(T.get({ key = "secret" }, ann)).private)
    assert.equal("bob-wrote", got(T.get({ key = "secret" }, bob)).private)
    -- the owner is the principal when there is one: the same id without it is someone else
    assert.equal(json.null, got(T.get({ key = "secret" }, ctx("fake:c1", "ann"))).private)
    -- and a speaker whose platform id equals ann's principalId is not ann
    assert.equal(json.null, got(T.get({ key = "secret" }, ctx("fake:c1", "p_ann"))).private)
    T.put({ key = "mine", value = "speaker p_ann" }, ctx("fake:c1", "p_ann"))
    assert.equal(json.null, got(T.get({ key = "mine" }, ann)).private)
    local block = pg.memory({ db = db }).promptBlock("fake:c1", "x", "Ann", "p_ann")
    assert.truthy(block:find("ann-only", 1, true))
    assert.is_nil(block:find("speaker p_ann", 1, true))
  end)

  it("share a row declared shared with the channel, and never with another channel", function()
    local T = tools(fresh())
    local ann, bob = ctx("fake:c1", "ann", "p_ann"), ctx("fake:c1", "bob", "p_bob")
    assert.equal('saved shared note "meet"', T.put({ key = "meet", value = "Fri 5pm", visibility = "shared" }, ann))
    assert.equal("Fri 5pm", got(T.get({ key = "meet" }, bob)).shared)
    local other = got(T.get({ key = "meet" }, ctx("fake:c2", "ann", "p_ann")))
    assert.equal(json.null, other.shared)
    assert.equal(json.null, other.private)
    -- private and shared of one key live side by side
    T.put({ key = "meet", value = "mine" }, bob)
    local r = got(T.get({ key = "meet" }, bob))
    assert.same({ "mine", "Fri 5pm" }, { r.private, r.shared })
  end)

  it("treat SQL in tool arguments as data: the table stays intact", function()
    local db, name = fresh()
    local T = tools(db)
    local ann, bob = ctx("fake:c1", "ann", "p_ann"), ctx("fake:c1", "bob", "p_bob")
    T.put({ key = "keep", value = "ann's" }, ann)
    local attacks = {
      "x'; DROP TABLE sbx_notes; --",
      "' OR '1'='1",
      "x\\'; DELETE FROM sbx_notes; --",
      "$1) OR (1=1",
      "x' UNION SELECT 'private', value FROM sbx_notes --",
      "\\\\'; TRUNCATE sbx_notes; --",
      "?; DROP TABLE sbx_schema_migrations",
    }
    for _, a in ipairs(attacks) do
      assert.matches("^saved private note", T.put({ key = a, value = a }, bob))
      assert.equal(a, got(T.get({ key = a }, bob)).private)          -- stored verbatim
      local r = got(T.get({ key = a }, ann))                         -- and never ann's way in
      assert.equal(json.null, r.private)
    end
    assert.equal(json.null, got(T.get({ key = "' OR '1'='1" }, ann)).private)
    assert.equal("ann's", got(T.get({ key = "keep" }, ann)).private)
    assert.equal(tostring(#attacks + 1), C:psql(name, "SELECT count(*) FROM sbx_notes"))
    assert.equal("1", C:psql(name, "SELECT count(*) FROM sbx_schema_migrations"))
  end)

  it("refuse NUL bytes, invalid UTF-8 and control characters in keys with the rule", function()
    local db, name = fresh()
    local T = tools(db)
    local bob = ctx("fake:c1", "bob", "p_bob")
    for _, bad in ipairs { "a\0b", "\0", "\255\254", "line\nbreak" } do
      assert.matches("^notes_put refused: key must be", T.put({ key = bad, value = "v" }, bob))
      assert.matches("^notes_get refused: key must be", T.get({ key = bad }, bob))
    end
    assert.matches("^notes_put refused: value must be", T.put({ key = "k", value = "x\0'; DROP TABLE sbx_notes; --" }, bob))
    assert.matches("^notes_put refused: value must be", T.put({ key = "k", value = "\192\128" }, bob))
    assert.equal("0", C:psql(name, "SELECT count(*) FROM sbx_notes"))
  end)

  it("refuse what is out of bounds with a clear rule", function()
    local db, name = fresh()
    local T = tools(db)
    local bob = ctx("fake:c1", "bob", "p_bob")
    assert.matches("key must be a string of 1 to 128 bytes", T.put({ key = ("k"):rep(129), value = "v" }, bob))
    assert.matches("key must be", T.put({ key = "", value = "v" }, bob))
    assert.matches("key must be", T.put({ key = 42, value = "v" }, bob))
    assert.matches("key must be", T.get({}, bob))
    assert.matches("value must be a string of at most 4000 bytes", T.put({ key = "k", value = ("v"):rep(4001) }, bob))
    assert.matches("value must be", T.put({ key = "k", value = { nested = true } }, bob))
    assert.matches('visibility must be "private"', T.put({ key = "k", value = "v", visibility = "public" }, bob))
    assert.matches("^saved", T.put({ key = ("k"):rep(128), value = ("v"):rep(4000) }, bob))   -- at the limits
    assert.equal("1", C:psql(name, "SELECT count(*) FROM sbx_notes"))
  end)

  it("cap the rows one owner keeps in a channel; an existing key may still be overwritten", function()
    local saved = pg.LIMITS.rowsPerOwner
    pg.LIMITS.rowsPerOwner = 3
    local ok, err = pcall(function()
      local T = tools(fresh())
      local bob = ctx("fake:c1", "bob", "p_bob")
      for i = 1, 3 do assert.matches("^saved", T.put({ key = "k" .. i, value = "v" }, bob)) end
      assert.matches("^notes_put refused: this channel already holds 3 private notes",
        T.put({ key = "k4", value = "v" }, bob))
      assert.matches("^saved", T.put({ key = "k1", value = "new" }, bob))
      assert.matches("^saved", T.put({ key = "k4", value = "v" }, ctx("fake:c1", "ann", "p_ann")))  -- ann's own
    end)
    pg.LIMITS.rowsPerOwner = saved
    assert(ok, err)
  end)

  it("raise (the operator's tool_failed) without a bound speaker", function()
    local T = tools(fresh())
    assert.has_error(function() T.get({ key = "k" }, { channel = "fake:c1" }) end, errors.PG_IDENTITY)
    assert.has_error(function() T.put({ key = "k", value = "v" }, { speaker = { id = "a" } }) end, errors.PG_IDENTITY)
  end)

  it("reconnect once when the server dropped the connection", function()
    local db, name = fresh()
    local T = tools(db)
    local bob = ctx("fake:c1", "bob", "p_bob")
    T.put({ key = "k", value = "v" }, bob)
    C:psql("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" .. name .. "'")
    assert.equal("v", got(T.get({ key = "k" }, bob)).private)
  end)
end)

describe("memory (rich mode)", function()
  it("is private by default: the reader's own notes and the channel's shared ones", function()
    local db = fresh()
    local T = tools(db)
    T.put({ key = "food", value = "ann likes figs" }, ctx("fake:c1", "ann", "p_ann"))
    T.put({ key = "food", value = "bob likes plums" }, ctx("fake:c1", "bob", "p_bob"))
    T.put({ key = "rule", value = "no spoilers", visibility = "shared" }, ctx("fake:c1", "bob", "p_bob"))
    T.put({ key = "other", value = "elsewhere" , visibility = "shared" }, ctx("fake:c2", "bob", "p_bob"))
    local mem = pg.memory { db = db }
    assert.equal("private", mem.visibility)
    local block = mem.promptBlock("fake:c1", "ann", "Ann", "p_ann")
    assert.truthy(block:find("ann likes figs", 1, true))
    assert.truthy(block:find("no spoilers", 1, true))
    assert.is_nil(block:find("plums", 1, true))
    assert.is_nil(block:find("elsewhere", 1, true))
    assert.equal("", mem.promptBlock("fake:c9", "ann", "Ann", "p_ann"))
  end)

  it("declared shared holds the shared notes only, never a private row", function()
    local db = fresh()
    local T = tools(db)
    T.put({ key = "food", value = "ann likes figs" }, ctx("fake:c1", "ann", "p_ann"))
    T.put({ key = "rule", value = "no spoilers", visibility = "shared" }, ctx("fake:c1", "ann", "p_ann"))
    local mem = pg.memory { db = db, visibility = "shared" }
    assert.equal("shared", mem.visibility)
    local block = mem.promptBlock("fake:c1", "ann", "Ann", "p_ann")
    assert.truthy(block:find("no spoilers", 1, true))
    assert.is_nil(block:find("figs", 1, true))
  end)

  it("keeps the block within 100,000 characters", function()
    local db = fresh()
    local T = tools(db)
    local saved = pg.LIMITS.rowsShared
    pg.LIMITS.rowsShared = 100
    for i = 1, 40 do
      T.put({ key = "k" .. i, value = ("x"):rep(4000), visibility = "shared" }, ctx("fake:c1", "ann", "p_ann"))
    end
    pg.LIMITS.rowsShared = saved
    local block = pg.memory({ db = db }).promptBlock("fake:c1", "ann", "Ann", "p_ann")
    assert.is_true(#block <= 100000)
    assert.is_true(#block > 90000)
  end)
end)

describe("rich_tools", function()
  it("tags a read that holds a private row privateTo the reader, and refuses one without a principal", function()
    local db = fresh()
    local R = pg.rich_tools { db = db }
    assert.same({ "notes_get", "notes_put" }, R.names)
    local ann = ctx("fake:c1", "ann", "p_ann")
    assert.is_true(R.call("notes_put", { key = "k", value = "v" }, ann).ok)
    local r = R.call("notes_get", { key = "k" }, ann)
    assert.equal("p_ann", r.privateTo)
    assert.equal("v", json.decode(r.text).private)
    R.call("notes_put", { key = "s", value = "all", visibility = "shared" }, ann)
    assert.is_nil(R.call("notes_get", { key = "s" }, ctx("fake:c1", "bob", "p_bob")).privateTo)
    -- a reader without a principal may keep a private note, but a read of it cannot be tagged
    local zed = ctx("fake:c1", "zed")
    assert.is_true(R.call("notes_put", { key = "z", value = "zed's" }, zed).ok)
    assert.has_error(function() R.call("notes_get", { key = "z" }, zed) end, errors.PG_IDENTITY)
    assert.is_nil(R.call("notes_get", { key = "k" }, ctx("fake:c1", "p_ann")).privateTo)  -- not ann's
  end)
end)
