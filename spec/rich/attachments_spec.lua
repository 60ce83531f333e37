-- rich/attachments_spec.lua: collecting attachments on the host
-- (spec/rich-mode.md 16.4; behaviours 124-127) and the directory-anchored
-- primitive under it (core.dir_open). Downloads go through the trusted
-- fetchImpl seam the page allows for offline specs; the files, links and
-- directories are real.
local async = require "sandbox.async"
local core = require "sandbox.core"
local rich = require "sandbox.rich"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local dirs = {}
teardown(function() spec_fs.rmdirs(dirs) end)

local PNG = "\137PNG\r\n\26\n-the-downloaded-bytes"

-- A fetchImpl serving url -> {status, body, headers}; it counts downloads.
local function server(routes)
  local s = { hits = {} }
  s.fetch = function(req)
    s.hits[#s.hits + 1] = req.url
    local r = routes[req.url] or { status = 404, body = "missing" }
    return { status = r.status or 200, headers = r.headers or {}, body = r.body }
  end
  return s
end

local function collect(message, dir, opts)
  return async.run(function() return rich.collectAttachments(message, dir, opts) end)
end

describe("rich attachments (16.4)", function()
  local root
  before_each(function() root = spec_fs.tmpdir("ratt", dirs) end)

  it("stores <prefix>-<index>-<name> exclusively, records type and size, and names references <id>-ref", function()
    local s = server {
      ["https://cdn.example/a"] = { body = "hello", headers = { ["Content-Type"] = "text/plain" } },
      ["https://cdn.example/b"] = { body = "ref bytes" },
    }
    local out = collect({ id = "m1", attachments = { { name = "../../e\204\129vil\nname.txt", url = "https://cdn.example/a" } },
      reference = { attachments = { { name = ".hidden", url = "https://cdn.example/b", contentType = "application/x-thing" } } } },
      root .. "/attachments", { fetchImpl = s.fetch })
    assert.same({}, out.failures)
    assert.equal("m1-0-___.._évil_name.txt", out.files[1].file)
    assert.equal("text/plain", out.files[1].contentType)
    assert.equal(5, out.files[1].size)
    assert.is_false(out.files[1].fromReference)
    assert.equal("m1-ref-0-_hidden", out.files[2].file)
    assert.equal("application/x-thing", out.files[2].contentType)
    assert.is_true(out.files[2].fromReference)
    assert.equal("hello", spec_fs.read(out.files[1].path))
    assert.equal(root .. "/attachments/m1-0-___.._évil_name.txt", out.files[1].path)
    local st = core.fs_lstat(out.files[1].path)
    assert.equal(tonumber("600", 8), st.mode & tonumber("777", 8))
  end)

  it("B124: a symlink planted at an entry's target name fails only that entry; its target is unchanged", function()
    local dir = root .. "/attachments"
    core.fs_mkdir(dir, tonumber("700", 8))
    spec_fs.write(root .. "/victim", "original")
    assert(os.execute(("ln -s %s %s"):format(spec_fs.q(root .. "/victim"), spec_fs.q(dir .. "/m2-0-a.txt"))))
    spec_fs.write(dir .. "/m2-2-c.txt", "already here")
    local s = server {
      ["https://x/a"] = { body = "ATTACKER" }, ["https://x/b"] = { body = "fine" }, ["https://x/c"] = { body = "over" },
    }
    local out = collect({ id = "m2", attachments = {
      { name = "a.txt", url = "https://x/a" }, { name = "b.txt", url = "https://x/b" }, { name = "c.txt", url = "https://x/c" } } },
      dir, { fetchImpl = s.fetch })
    assert.equal("original", spec_fs.read(root .. "/victim"))
    assert.equal("already here", spec_fs.read(dir .. "/m2-2-c.txt"))
    assert.equal(1, #out.files)
    assert.equal("m2-1-b.txt", out.files[1].file)
    assert.same({ "a.txt", "c.txt" }, { out.failures[1].name, out.failures[2].name })
    assert.equal("the file could not be saved", out.failures[1].reason)
  end)

  it("B125: images are prepared from the bytes just downloaded, at most four, and a failed decode is described", function()
    local routes, atts = {}, {}
    for i = 1, 6 do
      routes["https://img/" .. i] = { body = PNG .. i }
      atts[i] = { name = "p" .. i .. ".png", url = "https://img/" .. i, contentType = i == 1 and "IMAGE/PNG; q=1" or "image/png" }
    end
    local seen = {}
    local out = collect({ id = "m3", attachments = atts }, root .. "/attachments", {
      fetchImpl = server(routes).fetch,
      prepareImage = function(bytes, mime)
        seen[#seen + 1] = { bytes, mime }
        if bytes == PNG .. 2 then error("decoder exploded at /host/secret/path") end
        return { data = bytes, mimeType = mime }
      end,
    })
    assert.equal(6, #out.files)
    assert.equal(4, #out.images)
    assert.same({ PNG .. 1, "image/png" }, seen[1])
    assert.equal(PNG .. 3, out.images[2].data)
    assert.equal(1, #out.failures)
    assert.equal("the image could not be decoded", out.failures[1].reason)
    assert.equal(5, #seen)
  end)

  it("B126: 21 attachments, the first declaring 26 MiB: nine downloads; the size refusal plus eleven too many", function()
    local routes, atts = {}, {}
    for i = 1, 21 do
      routes["https://f/" .. i] = { body = "b" .. i }
      atts[i] = { name = "f" .. i, url = "https://f/" .. i, size = i == 1 and 26 * 1024 * 1024 or nil }
    end
    local s = server(routes)
    local out = collect({ id = "m4", attachments = { table.unpack(atts, 1, 15) },
      reference = { attachments = { table.unpack(atts, 16, 21) } } }, root .. "/attachments", { fetchImpl = s.fetch })
    assert.equal(9, #s.hits)
    assert.equal(9, #out.files)
    assert.equal(12, #out.failures)
    assert.equal("larger than 25 MB (27262976 bytes)", out.failures[1].reason)
    for i = 2, 12 do assert.equal("too many attachments", out.failures[i].reason) end
  end)

  it("downloads over the bounds, bad statuses, a bad id and describeFailure", function()
    local big = string.rep("x", 25 * 1024 * 1024 + 1)
    local twenty = string.rep("y", 20 * 1024 * 1024)
    local s = server {
      ["https://d/big"] = { body = big }, ["https://d/gone"] = { status = 410 },
      ["https://d/t1"] = { body = twenty }, ["https://d/t2"] = { body = twenty }, ["https://d/t3"] = { body = twenty },
    }
    local out = collect({ id = "m5", attachments = {
      { name = "big", url = "https://d/big" }, { name = "gone", url = "https://d/gone" },
      { name = "t1", url = "https://d/t1" }, { name = "t2", url = "https://d/t2" }, { name = "t3", url = "https://d/t3" } } },
      root .. "/attachments", { fetchImpl = s.fetch })
    assert.equal("larger than 25 MB (26214401 bytes)", out.failures[1].reason)
    assert.equal("download failed with HTTP 410", out.failures[2].reason)
    assert.equal("attachments exceed 50 MB in total", out.failures[3].reason)
    assert.equal(2, #out.files)
    local bad = collect({ id = "../x", attachments = { { name = "a", url = "https://d/t1" } } }, root .. "/a2",
      { fetchImpl = s.fetch, describeFailure = function() return nil end })
    assert.equal("Invalid message id", bad.failures[1].reason)
    local thrown = collect({ id = "m6", attachments = { { name = "a", url = "https://d/t1" } } }, root .. "/a3", {
      fetchImpl = function() error({ name = "Error", message = "connect ECONNREFUSED 10.0.0.1:443" }) end,
      describeFailure = function() return "the attachment could not be downloaded" end })
    assert.equal("the attachment could not be downloaded", thrown.failures[1].reason)
  end)

  it("B127: a symlink at the attachments directory is replaced by a real directory; its target stays empty", function()
    local target = root .. "/elsewhere"
    core.fs_mkdir(target, tonumber("700", 8))
    os.execute(("ln -s %s %s"):format(spec_fs.q(target), spec_fs.q(root .. "/attachments")))
    local out = collect({ id = "m7", attachments = { { name = "a", url = "https://e/a" } } }, root .. "/attachments",
      { fetchImpl = server { ["https://e/a"] = { body = "bytes" } }.fetch })
    assert.equal(1, #out.files)
    assert.equal("dir", core.fs_lstat(root .. "/attachments").type)
    assert.same({}, core.fs_readdir(target))
  end)

  it("stops at an aborted signal", function()
    local sig = signal.new()
    sig:abort("stop")
    local s = server { ["https://s/a"] = { body = "x" } }
    local out = collect({ id = "m8", attachments = { { name = "a", url = "https://s/a" } } }, root .. "/attachments",
      { fetchImpl = s.fetch, signal = sig })
    assert.equal(0, #s.hits)
    assert.same({}, out.files)
  end)
end)

describe("core.dir_open (directory-anchored, no-follow)", function()
  it("refuses a symlinked directory, and write_new refuses existing names, links and path components", function()
    local root = spec_fs.tmpdir("rdir", dirs)
    core.fs_mkdir(root .. "/d", tonumber("700", 8))
    os.execute(("ln -s %s %s"):format(spec_fs.q(root .. "/d"), spec_fs.q(root .. "/link")))
    local h0, err0, code0 = core.dir_open(root .. "/link")
    assert.is_nil(h0)
    assert.equal("ENOTDIR", code0, err0)
    local h = assert(core.dir_open(root .. "/d"))
    assert.is_true(h:write_new("a", "one"))
    local _, _, code = h:write_new("a", "two")
    assert.equal("EEXIST", code)
    assert.equal("one", spec_fs.read(root .. "/d/a"))
    for _, bad in ipairs { "x/y", "..", ".", "" } do
      local _, _, c = h:write_new(bad, "z")
      assert.equal("EINVAL", c)
    end
    h:close()
    h:close()
    assert.has_error(function() h:write_new("b", "z") end)
  end)
end)
