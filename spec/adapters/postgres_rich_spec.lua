-- postgres_rich_spec.lua: the PostgreSQL adapter in rich mode (issue 24
-- item 4) over a throwaway cluster (pg_cluster.lua): memory.promptBlock and
-- memory.visibility through examples/postgres-rich.conf.lua's runTurn (the real broker and
-- worker transport, the worker a rich_peer behind the offline fixture
-- driver), and notes_get / notes_put through a rich broker's real socket,
-- where a body forging another speaker reads nothing of hers.
local cluster = require "pg_cluster"
if not cluster.require("the PostgreSQL adapter in rich mode", pending) then return end

local async = require "sandbox.async"
local fixture = require "rich_fixture_driver"
local harness = require "rich_harness"
local json = require "sandbox.json"
local pg = require "sandbox.adapters.postgres"
local spec_fs = require "spec_fs"

local C, db
local dirs, drivers = {}, {}
setup(function()
  C = cluster.start()
  db = pg.connect(C:opts(C:createdb("rich")))
  pg.migrate(db)
  local T = pg.notes_tools { db = db }
  T[2].run({ key = "food", value = "ann likes figs" }, { channel = "discord:party", speaker = { id = "123", principalId = "ann" } })
  T[2].run({ key = "food", value = "bob likes plums" }, { channel = "discord:party", speaker = { id = "456", principalId = "bob" } })
  T[2].run({ key = "rule", value = "no spoilers", visibility = "shared" },
    { channel = "discord:party", speaker = { id = "456", principalId = "bob" } })
end)
teardown(function()
  if db then db:close() end
  if C then C:stop() end
  spec_fs.rmdirs(dirs)
end)
after_each(function()
  for _, d in ipairs(drivers) do d.close() end
  drivers = {}
  async.run(function() async.sleep(60) end)
end)

-- A worker image that declares the privacy capabilities (rich-mode.md 14.1),
-- or, with `old`, one that declares none.
local CAPABLE = '{"capabilities":{"privateTo":true,"readerRecords":true}}'

-- examples/postgres-rich.conf.lua, as the Bun bridge loads it, with the
-- fixture driver for Docker and a memory of the spec's when given.
local function runtime(memory, seen, old)
  local d = fixture.new { ready_body = old and '{"capabilities":{}}' or CAPABLE,
    turn = function(t) seen[#seen + 1] = json.plain(t) return { ok = true, text = "ok", files = json.array() } end }
  drivers[#drivers + 1] = d
  local example = assert(loadfile("examples/postgres-rich.conf.lua"))
  return example {
    database = C:opts("rich"),
    partyDir = spec_fs.tmpdir("pgr", dirs, spec_fs.short_tmp()) .. "/p",
    profiles = { main = { model = "claude-sonnet-4-6" } },
    oauthToken = function() return "tok" end,
    driver = d, logger = harness.logger({}), startTimeoutMs = 5000,
    memory = memory,
  }
end

local function turn(author)
  return { channel = "discord:party", profile = "main", turnId = "t-" .. author.principalId, author = author,
    text = "hello", images = {} }
end

describe("examples/postgres-rich.conf.lua: pg.memory through runTurn", function()
  it("private (the default): the reader's own notes and the shared ones reach that reader's turn only", function()
    local seen = {}
    local rt = runtime(nil, seen)                        -- the example's own memory
    async.run(function()
      local r1 = rt:runTurn(turn { id = "123", name = "Ann", principalId = "ann" }) assert.is_true(r1.ok, r1.error)
      assert.is_true(rt:runTurn(turn { id = "456", name = "Bob", principalId = "bob" }).ok)
      rt:stopBrokers()
    end)
    assert.equal("private", seen[1].memoryVisibility)
    assert.truthy(seen[1].memory:find("ann likes figs", 1, true))
    assert.truthy(seen[1].memory:find("no spoilers", 1, true))
    assert.is_nil(seen[1].memory:find("plums", 1, true))
    assert.truthy(seen[2].memory:find("bob likes plums", 1, true))
    assert.is_nil(seen[2].memory:find("figs", 1, true))
  end)

  it("a private block needs a worker that keeps reader records: an old image fails the turn, no turn reaches it", function()
    local seen = {}
    local rt = runtime(pg.memory { db = db }, seen, true)
    async.run(function()
      local r = rt:runTurn(turn { id = "123", name = "Ann", principalId = "ann" })
      assert.is_false(r.ok)
      assert.matches("lacks privateTo, readerRecords", r.error, 1, true)
      rt:stopBrokers()
    end)
    assert.equal(0, #seen)
  end)

  it("shared declared: only the shared notes, marked shared", function()
    local seen = {}
    local rt = runtime(pg.memory { db = db, visibility = "shared" }, seen)
    async.run(function()
      local r1 = rt:runTurn(turn { id = "123", name = "Ann", principalId = "ann" }) assert.is_true(r1.ok, r1.error)
      rt:stopBrokers()
    end)
    assert.equal("shared", seen[1].memoryVisibility)
    assert.truthy(seen[1].memory:find("no spoilers", 1, true))
    assert.is_nil(seen[1].memory:find("figs", 1, true))
  end)
end)

describe("pg.rich_tools through a rich broker's socket", function()
  local h
  before_each(function() h = harness.new { over = { tools = pg.rich_tools { db = db } } } end)
  after_each(function() h:stop() end)

  it("binds the owner to the turn's speaker, whatever the body says", function()
    async.run(function()
      assert.equal(200, h:post("/worker/ready", CAPABLE).status)
      local release = h:bind { speaker = { id = "456", name = "Bob", principalId = "bob" } }
      local r = h:post("/tools/notes_get", { input = { key = "food", speaker = "ann", principalId = "ann" },
        speaker = { id = "123", principalId = "ann" }, channel = "discord:party" })
      release()
      assert.equal(200, r.status)
      local a = json.decode(r.body)
      assert.equal("bob", a.privateTo)
      assert.equal("bob likes plums", json.decode(a.text).private)
      assert.is_nil(r.body:find("figs", 1, true))
    end)
  end)

  it("refuses injection and oversize in the answer's text, storing nothing", function()
    async.run(function()
      assert.equal(200, h:post("/worker/ready", CAPABLE).status)
      local release = h:bind { speaker = { id = "456", name = "Bob", principalId = "bob" } }
      local r = h:post("/tools/notes_put", { input = { key = "x'; DROP TABLE sbx_notes; --", value = "v" } })
      assert.equal(200, r.status)
      assert.matches("^saved private note", json.decode(r.body).text)
      r = h:post("/tools/notes_put", { input = { key = "k", value = ("v"):rep(4001) } })
      assert.matches("^notes_put refused: value must be", json.decode(r.body).text)
      release()
    end)
    assert.equal("1", C:psql("rich", "SELECT count(*) FROM sbx_notes WHERE owner = 'p:bob' AND key LIKE 'x%'"))
    assert.equal("0", C:psql("rich", "SELECT count(*) FROM sbx_notes WHERE key = 'k'"))
    assert.equal("sbx_notes", C:psql("rich", "SELECT tablename FROM pg_tables WHERE tablename = 'sbx_notes'"))
  end)
end)
