-- channels_spec.lua: the channel store (spec/runtime.md 3.2 steps 4-6, 3.3,
-- 7.1-7.3; "Behaviours the specs must cover" 5, 51-55; spec/broker.md 19).
-- Item numbers are in the `it` names: R<n> for runtime.md, B<n> for
-- broker.md. Real files in a private temp dir; the crash between the temp
-- write and the rename is core.write_file_atomic's test seam.
local spec_fs = require "spec_fs"
local channels = require "sandbox.channels"
local core = require "sandbox.core"

local dirs = {}

local function tmpdir() return spec_fs.tmpdir("ch", dirs) end

local read, write = spec_fs.read, spec_fs.write

local function open_err(opts)
  local ok, err = pcall(channels.open, opts)
  assert.is_false(ok, "opening should fail")
  return err
end

local function mode_of(path)
  return core.fs_stat(path).mode
end

teardown(function() spec_fs.rmdirs(dirs) end)

describe("channel store persistence", function()
  it("R51: enabling persists across a new store instance; disabling persists; enabling `bad` fails", function()
    local path = tmpdir() .. "/state/channels.json"
    local s = channels.open { stateFile = path }
    assert.same({}, s:list())
    s:enable("fake:a")
    s:enable("fake:b")
    assert.is_true(s:has("fake:a"))
    local s2 = channels.open { stateFile = path }
    assert.same({ "fake:a", "fake:b" }, s2:list())
    s2:disable("fake:a")
    assert.same({ "fake:b" }, channels.open({ stateFile = path }):list())
    local ok, err = pcall(s2.enable, s2, "bad")
    assert.is_false(ok)
    assert.equal("invalid sandbox channel", err)
    assert.same({ "fake:b" }, channels.open({ stateFile = path }):list())
  end)

  it("R52: the file is byte-exact compact JSON in insertion order, mode 0600", function()
    local path = tmpdir() .. "/channels.json"
    local s = channels.open { stateFile = path }
    assert.equal("[]", read(path))
    s:enable("discord:123456789")
    s:enable("fake:guests")
    s:enable("discord:123456789")
    assert.equal('["discord:123456789","fake:guests"]', read(path))
    assert.equal(tonumber("600", 8), mode_of(path))
    assert.is_nil(core.fs_lstat(path .. ".tmp"))
  end)

  it("R52: duplicates in the file collapse, first-seen order kept", function()
    local path = tmpdir() .. "/channels.json"
    write(path, '["fake:b", "fake:a", "fake:b", "fake:a"]')
    assert.same({ "fake:b", "fake:a" }, channels.open({ stateFile = path }):list())
  end)

  it("rewrites the file on every enable/disable, even when nothing changed", function()
    local path = tmpdir() .. "/channels.json"
    local s = channels.open { stateFile = path, initialChannels = { "fake:a" } }
    write(path, "tampered")
    s:enable("fake:a")
    assert.equal('["fake:a"]', read(path))
    write(path, "tampered")
    s:disable("fake:zzz")
    assert.equal('["fake:a"]', read(path))
  end)

  it("keeps the list in memory usable after disable and re-enable (order is the new insertion)", function()
    local s = channels.open { stateFile = tmpdir() .. "/c.json", initialChannels = { "fake:a", "fake:b" } }
    s:disable("fake:a")
    s:enable("fake:a")
    assert.same({ "fake:b", "fake:a" }, s:list())
    local copy = s:list()
    copy[1] = "fake:evil"
    assert.is_false(s:has("fake:evil"))
  end)
end)

describe("channel store failures roll back", function()
  it("R53/B19: a directory on <stateFile>.tmp makes enable and disable fail, list unchanged", function()
    local dir = tmpdir()
    local path = dir .. "/channels.json"
    local s = channels.open { stateFile = path, initialChannels = { "fake:a" } }
    assert(core.fs_mkdir(path .. ".tmp"))
    local ok, err = pcall(s.enable, s, "fake:b")
    assert.is_false(ok)
    assert.equal("routing state could not be saved", err)
    assert.same({ "fake:a" }, s:list())
    assert.is_false(s:has("fake:b"))
    ok, err = pcall(s.disable, s, "fake:a")
    assert.is_false(ok)
    assert.equal("routing state could not be saved", err)
    assert.same({ "fake:a" }, s:list())
    assert.is_true(s:has("fake:a"))
    assert.equal('["fake:a"]', read(path))
    assert.equal("dir", core.fs_lstat(path .. ".tmp").type)
  end)

  it("restores a disabled key at its old position when the write fails", function()
    local fail_next = false
    local s = channels.open {
      stateFile = tmpdir() .. "/c.json", initialChannels = { "fake:a", "fake:b", "fake:c" },
      write = function(p, b)
        if fail_next then return nil, "injected", 5 end
        return core.write_file_atomic(p, b)
      end,
    }
    fail_next = true
    assert.has_error(function() s:disable("fake:b") end, "routing state could not be saved")
    assert.same({ "fake:a", "fake:b", "fake:c" }, s:list())
    assert.has_error(function() s:enable("fake:d") end, "routing state could not be saved")
    assert.same({ "fake:a", "fake:b", "fake:c" }, s:list())
    assert.has_error(function() s:enable("fake:a") end, "routing state could not be saved")
    assert.same({ "fake:a", "fake:b", "fake:c" }, s:list())
  end)

  it("a crash between the temp write and the rename leaves the old state intact", function()
    local path = tmpdir() .. "/channels.json"
    local crash = false
    local s = channels.open {
      stateFile = path, initialChannels = { "fake:a" },
      write = function(p, b) return core.write_file_atomic(p, b, { crash_before_rename = crash }) end,
    }
    crash = true
    assert.has_error(function() s:enable("fake:b") end, "routing state could not be saved")
    -- on disk: the old file, plus the fsynced temp file the crash left behind
    assert.equal('["fake:a"]', read(path))
    assert.equal('["fake:a","fake:b"]', read(path .. ".tmp"))
    -- the restarted host reads the old state and the next write replaces the temp
    local s2 = channels.open { stateFile = path, initialChannels = { "fake:zzz" } }
    assert.same({ "fake:a" }, s2:list())
    s2:enable("fake:c")
    assert.equal('["fake:a","fake:c"]', read(path))
    assert.is_nil(core.fs_lstat(path .. ".tmp"))
  end)

  it("a symbolic link squatting on <stateFile>.tmp is never followed", function()
    local dir = tmpdir()
    local path = dir .. "/channels.json"
    write(dir .. "/victim", "keep")
    local s = channels.open { stateFile = path }
    assert(os.execute("ln -s victim '" .. path .. ".tmp'"))
    assert.has_error(function() s:enable("fake:a") end, "routing state could not be saved")
    assert.equal("keep", read(dir .. "/victim"))
    assert.same({}, s:list())
  end)
end)

describe("the write's syscalls", function()
  it("writes the temp file no-follow 0600, fsyncs it, renames it, then fsyncs the directory", function()
    if not os.execute("command -v strace >/dev/null 2>&1") then
      pending("needs strace")
      return
    end
    local dir = tmpdir()
    local script = dir .. "/w.lua"
    write(script, string.format([[
package.path = %q
package.cpath = %q
local s = require("sandbox.channels").open { stateFile = %q }
s:enable("fake:a")
]], package.path, package.cpath, dir .. "/channels.json"))
    local trace = dir .. "/trace"
    local ok = os.execute(string.format("strace -o '%s' -e trace=openat,write,fsync,close,rename lua5.4 '%s' >/dev/null 2>&1",
      trace, script))
    if not ok then
      pending("strace cannot trace here (ptrace not permitted)")
      return
    end
    local lines = {}
    for line in io.lines(trace) do lines[#lines + 1] = line end
    -- the second save (enable) is the last rename in the trace
    local last
    for i, l in ipairs(lines) do
      if l:find('^rename%("' .. dir:gsub("%p", "%%%0") .. '/channels%.json%.tmp"') then last = i end
    end
    assert.truthy(last, "no rename of the temp file")
    local open_at, fd
    for i = last, 1, -1 do
      local f = lines[i]:match('^openat%(AT_FDCWD, "[^"]*/channels%.json%.tmp", (.-)%) = (%d+)$')
      if f then
        open_at, fd = i, lines[i]:match("= (%d+)$")
        assert.truthy(f:find("O_NOFOLLOW", 1, true))
        assert.truthy(f:find("O_CREAT", 1, true))
        assert.truthy(f:find("0600", 1, true))
        break
      end
    end
    assert.truthy(open_at, "no open of the temp file")
    local seq = {}
    for i = open_at + 1, #lines do
      local l = lines[i]
      if l:find("^write%(" .. fd .. ",") then seq[#seq + 1] = "write"
      elseif l:find("^fsync%(" .. fd .. "%)") then seq[#seq + 1] = "fsync"
      elseif l:find("^close%(" .. fd .. "%)") then seq[#seq + 1] = "close"
      elseif l:find("^rename%(") then seq[#seq + 1] = "rename"
      elseif l:find("^openat%(AT_FDCWD, \"" .. dir:gsub("%p", "%%%0") .. "\", [^)]*O_DIRECTORY") then
        seq[#seq + 1] = "open dir"
        fd = l:match("= (%d+)$")
      end
      if #seq == 7 then break end
    end
    assert.same({ "write", "fsync", "close", "rename", "open dir", "fsync", "close" }, seq)
  end)
end)

describe("opening the channel store (3.3)", function()
  local function state_file(content)
    local path = tmpdir() .. "/channels.json"
    write(path, content)
    return path
  end

  for _, case in ipairs {
    { "an object", '{"invalid":"state"}' },
    { "unparseable JSON", '["fake:a"' },
    { "an empty file", "" },
    { "a string", '"fake:a"' },
    { "a number element", '["fake:a",1]' },
    { "a key outside the grammar", '["fake:a","Bad:key"]' },
    { "a key without a surface", '[":x"]' },
    { "a key with a newline", '["fake:a\\nb"]' },
    { "a nested array", '[["fake:a"]]' },
    { "invalid UTF-8", '["fake:\255"]' },
    { "a null element", '[null]' },
  } do
    it("R54/B19: refuses " .. case[1] .. " with `invalid sandbox channel state`", function()
      assert.equal("invalid sandbox channel state", open_err { stateFile = state_file(case[2]) })
    end)
  end

  it("refuses a file over 1 MiB, accepts one of exactly 1 MiB", function()
    local key = '"fake:' .. string.rep("a", 200) .. '"'
    local body = "[" .. key
    while #body < 1048576 - 300 do body = body .. "," .. key end
    local exact = body .. string.rep(" ", 1048576 - #body - 1) .. "]"
    assert.equal(1048576, #exact)
    local s = channels.open { stateFile = state_file(exact) }
    assert.same({ "fake:" .. string.rep("a", 200) }, s:list())
    assert.equal("invalid sandbox channel state", open_err { stateFile = state_file(exact .. " ") })
  end)

  it("R54: refuses a symlinked state file, and a directory in its place", function()
    local dir = tmpdir()
    write(dir .. "/real.json", '["fake:a"]')
    assert(os.execute("ln -s real.json '" .. dir .. "/channels.json'"))
    assert.equal("routing state must be a service-owned regular file", open_err { stateFile = dir .. "/channels.json" })
    local dir2 = tmpdir()
    assert(core.fs_mkdir(dir2 .. "/channels.json"))
    assert.equal("routing state must be a service-owned regular file", open_err { stateFile = dir2 .. "/channels.json" })
  end)

  it("R5: refuses a pre-existing 0755 state directory; creates a missing one 0700", function()
    local dir = tmpdir()
    assert(core.fs_mkdir(dir .. "/open", tonumber("755", 8)))
    os.execute("chmod 755 '" .. dir .. "/open'")
    assert.equal("routing state directory must be private and service-owned",
      open_err { stateFile = dir .. "/open/channels.json" })
    channels.open { stateFile = dir .. "/a/b/channels.json" }
    assert.equal(tonumber("700", 8), mode_of(dir .. "/a"))
    assert.equal(tonumber("700", 8), mode_of(dir .. "/a/b"))
  end)

  it("R55: initialChannels seeds and writes a missing file", function()
    local path = tmpdir() .. "/channels.json"
    local s = channels.open { stateFile = path, initialChannels = { "fake:guests", "discord:1", "fake:guests" } }
    assert.same({ "fake:guests", "discord:1" }, s:list())
    assert.equal('["fake:guests","discord:1"]', read(path))
  end)

  it("R55: an existing file wins over initialChannels, even when it holds []", function()
    local path = state_file("[]")
    assert.same({}, channels.open({ stateFile = path, initialChannels = { "fake:guests" } }):list())
    assert.equal("[]", read(path))
  end)

  it("refuses an invalid initialChannels entry with `invalid sandbox channel state` and writes nothing", function()
    local path = tmpdir() .. "/channels.json"
    assert.equal("invalid sandbox channel state", open_err { stateFile = path, initialChannels = { "fake:a", "nope" } })
    assert.equal("invalid sandbox channel state", open_err { stateFile = path, initialChannels = { "fake:a", 7 } })
    assert.equal("invalid sandbox channel state", open_err { stateFile = path, initialChannels = "fake:a" })
    assert.equal("invalid sandbox channel state", open_err { stateFile = path, initialChannels = { x = "fake:a" } })
    assert.is_nil(core.fs_lstat(path))
  end)

  it("a seed that cannot be written fails opening with `routing state could not be saved`", function()
    local path = tmpdir() .. "/channels.json"
    assert(core.fs_mkdir(path .. ".tmp"))
    assert.equal("routing state could not be saved", open_err { stateFile = path, initialChannels = { "fake:a" } })
  end)

  it("names the file and the fix for an operator (channels.explain)", function()
    local line = channels.explain("invalid sandbox channel state", "/srv/state/channels.json")
    assert.truthy(line:find("/srv/state/channels.json", 1, true))
    assert.truthy(line:find("JSON array of channel keys", 1, true))
  end)
end)

describe("the state path (3.2 steps 4-6)", function()
  it("refuses a relative stateFile and one naming no file", function()
    assert.has_error(function() channels.state_path("state/c.json", "/r", "/w") end, "stateFile must be absolute")
    assert.has_error(function() channels.state_path(nil, "/r", "/w") end, "stateFile must be absolute")
    for _, p in ipairs { "/tmp/x/", "/tmp/x/.", "/tmp/x/.." } do
      assert.has_error(function() channels.state_path(p, "/r", "/w") end, "stateFile must name a file")
    end
  end)

  it("R11: refuses a state path equal to or under either root (canonically)", function()
    local dir = tmpdir()
    local run, work = dir .. "/run", dir .. "/work"
    assert(core.fs_mkdir(run))
    assert(core.fs_mkdir(work))
    assert(os.execute("ln -s work '" .. dir .. "/alias'"))
    for _, p in ipairs { run .. "/c.json", work .. "/sub/c.json", dir .. "/alias/c.json" } do
      assert.has_error(function() channels.state_path(p, run, work) end,
        "routing state must stay outside sandbox mounts")
    end
    assert.has_error(function() channels.state_path(dir .. "/c.json", dir .. "/c.json", work) end,
      "routing state must stay outside sandbox mounts")
    assert.equal(dir .. "/state/c.json", channels.state_path(dir .. "/state/../state/c.json", run, work))
    assert.equal(dir .. "/run2/c.json", channels.state_path(dir .. "/run2/c.json", run, work))
  end)
end)
