-- cli_spec.lua: the operator commands through the real `sbx` binary:
-- --help for every command, argument errors, `sbx doctor` on deliberately bad
-- configs (with the fix it names), and `sbx run` / `sbx chat` end to end with
-- a config whose `driver` is a fake (no Docker needed). Runs as a non-root
-- user (the product refuses root); as root those cases are pending.
local core = require "sandbox.core"
local cli = require "sandbox.cli"
local spec_fs = require "spec_fs"

-- The binary of the build whose core module busted loaded.
local BUILD = package.cpath:match("(build[%w%-]*)/lua/%?%.so") or "build"
local BIN = BUILD .. "/sbx"
local IS_ROOT = core.getuid() == 0

local shq, write = spec_fs.q, spec_fs.write

local function slurp(path) return spec_fs.read(path) or "" end

-- Runs `sbx ARGS...` (a list of strings); returns {code, out, err}.
local function sbx(args, stdin)
  local q = {}
  for i, a in ipairs(args) do q[i] = shq(a) end
  local out, err = os.tmpname(), os.tmpname()
  local input = "/dev/null"
  if stdin then
    input = os.tmpname()
    write(input, stdin)
  end
  local cmd = string.format("env -u SBX_DEBUG %s %s <%s >%s 2>%s", BIN, table.concat(q, " "), input, out, err)
  local _, _, code = os.execute(cmd)
  local r = { code = code, out = slurp(out), err = slurp(err) }
  os.remove(out)
  os.remove(err)
  if stdin then os.remove(input) end
  return r
end

local function tmpdir()
  local base = os.getenv("TMPDIR")
  if not base or base == "" or #base > 40 then base = "/tmp" end
  return assert(core.fs_mkdtemp(base .. "/cli-spec-XXXXXX"))
end

-- A config file in dir; `extra` is Lua source inserted into sandbox { ... }.
local function config(dir, extra, prelude)
  local path = dir .. "/sandbox.conf.lua"
  write(path, string.format([[
%s
return require("sandbox") {
  image = "pi-roundtable-sandbox:local",
  runRoot = %q, workspaceRoot = %q, stateFile = %q,
  model = "spec-model", modelUrl = "https://models.example/v1/chat/completions",
  apiKey = function() return "spec-key" end,
  %s
}
]], prelude or "", dir .. "/run", dir .. "/ws", dir .. "/state/channels.json", extra or ""))
  return path
end

-- A fake driver (spec/runtime.md 4.1): echoes the turn, or fails on cue.
local FAKE_DRIVER = [[
local async = require "sandbox.async"
local core = require "sandbox.core"
local driver = {}
function driver:run(spec, turn, signal)
  local text = turn.text
  if text == "raise" then error("driver exploded", 0) end
  if text == "not ok" then return { ok = false, text = "The sandbox turn reached its model-call limit." } end
  if text == "big" then error("body too large", 0) end
  if text == "controls" then
    return { ok = true, text = "\27]0;title\7\27]52;c;AAAA\7 a\tb\nc\r\194\133\127 @everyone" }
  end
  local ms = text == "slow" and 3000 or 50
  local why = async.await(function(resume)
    local t = core.timer(ms, function() resume("done") end)
    signal:on_abort(function() t:stop() resume("aborted") end)
  end)
  if why == "aborted" then error(signal.reason, 0) end
  return { ok = true, text = "echo " .. turn.speaker.name .. ": " .. text .. " (reset=" .. tostring(turn.reset) .. ")" }
end
]]

local function rmtree(dir) core.fs_rmtree(dir) end

local function non_root()
  if IS_ROOT then
    pending("needs a non-root user (the check runner uses the sbx account)")
    return false
  end
  return true
end

describe("sbx --help", function()
  it("lists every command and exits 0", function()
    local r = sbx({ "--help" })
    assert.equal(0, r.code)
    for _, name in ipairs(cli.COMMANDS) do assert.matches("\n  " .. name .. " ", r.out, 1, true) end
  end)

  for _, name in ipairs(cli.COMMANDS) do
    it("`sbx " .. name .. " --help` prints its usage and exits 0", function()
      local r = sbx({ name, "--help" })
      assert.equal(0, r.code)
      assert.matches("^usage: sbx " .. name:gsub("%-", "%%-"), r.out)
      assert.equal("", r.err)
    end)
  end

  it("exits 2 without a command and for an unknown one", function()
    assert.equal(2, sbx({}).code)
    local r = sbx({ "frobnicate" })
    assert.equal(2, r.code)
    assert.matches("unknown command 'frobnicate'", r.err, 1, true)
    assert.not_matches("did you mean", r.err, 1, true)
  end)

  it("suggests the closest command for a near miss", function()
    local r = sbx({ "docter" })
    assert.equal(2, r.code)
    assert.matches("unknown command 'docter'; did you mean 'doctor'?", r.err, 1, true)
  end)

  it("`sbx help version` explains the version command", function()
    local r = sbx({ "help", "version" })
    assert.equal(0, r.code, r.err)
    assert.matches("^usage: sbx version", r.out)
  end)

  it("`sbx --version` answers without a Lua tree, and a copied sbx names itself in the tree error", function()
    local dir = spec_fs.tmpdir("sbx-copy")
    local copy = dir .. "/roundtable-sbx"
    local src = assert(io.open("build/sbx", "rb"))
    local bytes = src:read("a")
    src:close()
    local out = assert(io.open(copy, "wb"))
    out:write(bytes)
    out:close()
    os.execute("chmod 0755 '" .. copy .. "'")
    local p = assert(io.popen("env -u SBX_LUA_DIR '" .. copy .. "' --version 2>&1"))
    local version = p:read("a")
    p:close()
    assert.equal("sbx " .. core.version .. "\n", version)
    p = assert(io.popen("env -u SBX_LUA_DIR '" .. copy .. "' run 2>&1"))
    local err = p:read("a")
    p:close()
    spec_fs.rmdir(dir)
    assert.matches("no Lua tree next to " .. copy, err, 1, true)
  end)
end)

describe("the sbx process", function()
  it("runs Lua's generational collector (set by core/state.c)", function()
    local dir = spec_fs.tmpdir("sbx-gc")
    local script = dir .. "/mode.lua"
    write(script, 'io.stdout:write(collectgarbage("generational")) return 0\n')
    local r = sbx({ "lua", script })
    spec_fs.rmdir(dir)
    assert.equal(0, r.code, r.err)
    assert.equal("generational", r.out)
  end)
end)

-- Only literal addresses: no lookup, no traffic (safe fetch refuses loopback,
-- so nothing here connects anywhere).
describe("sbx fetch and sbx check-url", function()
  it("check-url prints the canonical URL of a public literal without connecting", function()
    local r = sbx({ "check-url", "HTTP://93.184.216.34:80/a/../b?q#frag" })
    assert.equal(0, r.code)
    assert.equal("http://93.184.216.34/b?q\n", r.out)
    assert.equal("", r.err)
  end)

  it("refusals print the catalogue's name and message and exit 1", function()
    local cases = {
      { { "check-url", "http://127.0.0.1/" }, "UnsafeUrlError: URL resolves to a non-public address" },
      { { "check-url", "http://[::ffff:169.254.169.254]/" }, "UnsafeUrlError: URL resolves to a non-public address" },
      { { "check-url", "file:///etc/passwd" }, "UnsafeUrlError: Only credential-free HTTP(S) URLs are allowed" },
      { { "check-url", "http://93.184.216.34/", "--timeout-ms", "0" }, "UnsafeUrlError: Invalid fetch bounds" },
      { { "fetch", "http://10.0.0.1/" }, "UnsafeUrlError: URL resolves to a non-public address" },
      { { "fetch", "http://u:p@93.184.216.34/" }, "UnsafeUrlError: Only credential-free HTTP(S) URLs are allowed" },
      { { "fetch", "http://93.184.216.34:0/" }, "UnsafeUrlError: Port 0 is not allowed" },
      { { "fetch", "http://93.184.216.34/", "--max-bytes", "1.5" }, "UnsafeUrlError: Invalid fetch bounds" },
      { { "fetch", "http://93.184.216.34/", "--max-redirects", "11" }, "UnsafeUrlError: Invalid fetch bounds" },
      { { "fetch", "http://93.184.216.34/", "--header", "Host: evil" }, "UnsafeUrlError: Invalid fetch headers" },
      { { "fetch", "http://0x7f000001/" }, "UnsafeUrlError: URL resolves to a non-public address" },
    }
    for _, c in ipairs(cases) do
      local r = sbx(c[1])
      assert.equal(1, r.code, table.concat(c[1], " "))
      assert.equal(c[2] .. "\n", r.err, table.concat(c[1], " "))
      assert.equal("", r.out)
    end
  end)

  it("usage errors exit 2 with the command's usage", function()
    for _, args in ipairs { { "fetch" }, { "fetch", "a", "b" }, { "fetch", "x", "--header", "nocolon" },
      { "check-url", "x", "--no-follow" }, { "check-url" } } do
      local r = sbx(args)
      assert.equal(2, r.code, table.concat(args, " "))
      assert.matches("usage: sbx " .. args[1], r.err, 1, true)
    end
  end)
end)

describe("sbx run and sbx chat argument errors", function()
  local cases = {
    { { "run" }, "CONFIG.lua is required" },
    { { "run", "c.lua", "--speaker", "a", "hi" }, "--channel KEY is required" },
    { { "run", "c.lua", "--channel", "Bad", "--speaker", "a", "hi" }, "invalid --channel 'Bad'" },
    { { "run", "c.lua", "--channel", "demo:1", "hi" }, "--speaker is required" },
    { { "run", "c.lua", "--channel", "demo:1", "--speaker", ":x", "hi" }, "--speaker needs a non-empty ID" },
    { { "run", "c.lua", "--channel", "demo:1", "--speaker", "a", "--timeout", "5", "hi" }, "--timeout must be 1000 to 600000" },
    { { "run", "c.lua", "--channel", "demo:1", "--speaker", "a" }, "TEXT is required" },
    { { "run", "c.lua", "--bogus", "x" }, "unknown flag --bogus" },
    { { "chat", "c.lua", "--speaker", "a" }, "--channel KEY is required" },
    { { "chat", "c.lua", "--channel", "demo:1", "--speaker", "a", "extra" }, "unexpected argument 'extra'" },
    { { "doctor" }, "exactly one CONFIG.lua is required" },
    { { "doctor", "a.lua", "b.lua" }, "exactly one CONFIG.lua is required" },
    { { "demo", "extra" }, "unexpected argument 'extra'" },
    { { "demo", "--timeout", "10" }, "--timeout must be 1000 to 600000" },
  }
  for _, c in ipairs(cases) do
    it("`sbx " .. table.concat(c[1], " ") .. "` exits 2: " .. c[2], function()
      local r = sbx(c[1])
      assert.equal(2, r.code)
      assert.matches(c[2], r.err, 1, true)
      assert.equal("", r.out)
    end)
  end

  it("a config that does not load is a configuration error (exit 3) naming the file", function()
    local dir = tmpdir()
    local r = sbx({ "run", dir .. "/missing.lua", "--channel", "demo:1", "--speaker", "a", "hi" })
    assert.equal(3, r.code)
    assert.matches("cannot load config", r.err, 1, true)
    write(dir .. "/bad.lua", "return require('sandbox') { model = 'm', modelUrl = 'https://x.example/', apiKey = 'literal' }")
    r = sbx({ "run", dir .. "/bad.lua", "--channel", "demo:1", "--speaker", "a", "hi" })
    assert.equal(3, r.code)
    assert.matches("apiKey must be a function", r.err, 1, true)
    assert.matches("fix: make apiKey a function", r.err, 1, true)
    rmtree(dir)
  end)

  it("`sbx demo` refuses root and says to use the sbx account", function()
    if not IS_ROOT then
      pending("only observable as root")
      return
    end
    local r = sbx({ "demo" })
    assert.equal(1, r.code)
    assert.matches("runuser -u sbx", r.err, 1, true)
  end)
end)

describe("sbx doctor", function()
  local dir
  before_each(function()
    dir = tmpdir()
    core.fs_mkdir(dir .. "/run")
    core.fs_mkdir(dir .. "/ws")
    core.fs_mkdir(dir .. "/state")
  end)
  after_each(function() rmtree(dir) end)

  it("reports a 0755 runRoot with the chmod fix and exits 1", function()
    if not non_root() then return end
    os.execute("chmod 755 " .. shq(dir .. "/run"))
    local r = sbx({ "doctor", config(dir), "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("FAIL  runRoot          sandbox roots must be private directories owned by the service user: "
      .. dir .. "/run has mode 0755 (group/other bits set)", r.out, 1, true)
    assert.matches("\n      fix: chmod 700 " .. dir .. "/run\n", r.out, 1, true)
    assert.matches("ok    workspaceRoot    " .. dir .. "/ws (0700, ", r.out, 1, true)
    assert.matches("1 check(s) failed", r.out, 1, true)
  end)

  it("passes every local check on private directories (exit 0) and creates nothing", function()
    if not non_root() then return end
    rmtree(dir .. "/run")
    local r = sbx({ "doctor", config(dir), "--no-docker" })
    assert.equal(0, r.code, r.out)
    assert.matches("ok    config", r.out, 1, true)
    assert.matches("ok    apiKey", r.out, 1, true)
    assert.matches("ok    user", r.out, 1, true)
    assert.matches("ok    runRoot          " .. dir .. "/run (missing; created 0700 at startup)", r.out, 1, true)
    assert.matches("ok    stateFile        " .. dir .. "/state/channels.json (created at startup, 0 channel(s))", r.out, 1, true)
    assert.matches("ok    roots", r.out, 1, true)
    assert.matches("ok    socket path", r.out, 1, true)
    assert.matches("skip  docker", r.out, 1, true)
    assert.matches("all checks passed", r.out, 1, true)
    assert.is_nil(core.fs_stat(dir .. "/run"))
    -- the hardening checks (hardening.md 1-3)
    assert.matches("ok    seccomp          [^\n]*/worker/seccomp%.json %(allows %d+ system calls", r.out)
    -- the rich and precheck images' own profiles (issue 21 item 3)
    assert.matches("ok    seccomp rich     [^\n]*/worker/pi/seccomp%.json %(allows %d+ system calls", r.out)
    assert.matches("ok    seccomp precheck [^\n]*/worker/precheck/seccomp%.json %(allows %d+ system calls", r.out)
    assert.matches("ok    descriptors      nofile %d+", r.out)
    assert.matches("ok    disk             " .. dir .. "/ws: ", r.out, 1, true)
  end)

  it("--channel shows the channel workspace's size against workspaceQuotaMb", function()
    if not non_root() then return end
    local path = config(dir, "workspaceQuotaMb = 1,")
    local ws = dir .. "/ws/" .. core.sha256_hex("demo:1")
    local r = sbx({ "doctor", path, "--no-docker", "--channel", "demo:1" })
    assert.equal(0, r.code, r.out)
    assert.matches("ok    workspace        " .. ws .. " (not used yet)", r.out, 1, true)
    os.execute("mkdir -p -m 0700 " .. shq(ws) .. " && head -c 2097152 /dev/zero > " .. shq(ws .. "/big"))
    r = sbx({ "doctor", path, "--no-docker", "--channel", "demo:1" })
    assert.equal(1, r.code, r.out)
    assert.matches("FAIL  workspace        sandbox workspace is over its quota: " .. ws
      .. " holds 2.0 MiB, over workspaceQuotaMb (1 MiB)", r.out, 1, true)
    assert.matches("fix: an operator must free space in this channel's workspace " .. ws, r.out, 1, true)
    os.remove(ws .. "/big")
    r = sbx({ "doctor", path, "--no-docker", "--channel", "demo:1" })
    assert.matches("ok    workspace        " .. ws .. " holds 0.0 MiB of workspaceQuotaMb 1", r.out, 1, true)
  end)

  it("reports a missing seccomp profile with the fix", function()
    if not non_root() then return end
    local r = sbx({ "doctor", config(dir, "seccompProfile = " .. string.format("%q", dir .. "/none.json") .. ","), "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("FAIL  seccomp          seccomp profile missing: " .. dir .. "/none.json", r.out, 1, true)
    assert.matches("fix: restore worker/seccomp.json", r.out, 1, true)
  end)

  it("reports group bits on the state directory and workspaceRoot", function()
    if not non_root() then return end
    os.execute("chmod 750 " .. shq(dir .. "/state") .. " " .. shq(dir .. "/ws"))
    local r = sbx({ "doctor", config(dir), "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("fix: chmod 700 " .. dir .. "/state\n", r.out, 1, true)
    assert.matches("fix: chmod 700 " .. dir .. "/ws\n", r.out, 1, true)
    assert.matches("2 check(s) failed", r.out, 1, true)
  end)

  it("reports a runRoot over 76 bytes with the fix", function()
    if not non_root() then return end
    local long = dir .. "/" .. string.rep("r", 80)
    local path = dir .. "/long.conf.lua"
    write(path, string.format([[return require("sandbox") { image = "i", runRoot = %q, workspaceRoot = %q,
      stateFile = %q, model = "m", modelUrl = "https://m.example/", apiKey = function() end }]],
      long, dir .. "/ws", dir .. "/state/c.json"))
    local r = sbx({ "doctor", path, "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("FAIL  socket path", r.out, 1, true)
    assert.matches("fix: choose a runRoot of at most 76 bytes", r.out, 1, true)
  end)

  it("reports overlapping roots, a uid that is not the process's, and a missing apiKey", function()
    if not non_root() then return end
    local uid = core.getuid()
    local path = dir .. "/overlap.conf.lua"
    write(path, string.format([[return require("sandbox") { image = "i", runRoot = %q, workspaceRoot = %q,
      stateFile = %q, model = "m", modelUrl = "https://m.example/", uid = %d }]],
      dir .. "/ws/run", dir .. "/ws", dir .. "/state/c.json", uid + 1))
    local r = sbx({ "doctor", path, "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("FAIL  roots            sandbox roots must be separate", r.out, 1, true)
    assert.matches("fix: remove uid/gid from the config or set uid = " .. uid, r.out, 1, true)
    assert.matches("FAIL  apiKey", r.out, 1, true)
    assert.matches("fix: add apiKey = function()", r.out, 1, true)
  end)

  it("reports a config that does not load as a FAIL line", function()
    write(dir .. "/broken.lua", "return 42")
    local r = sbx({ "doctor", dir .. "/broken.lua" })
    assert.equal(1, r.code)
    assert.matches("^FAIL  config", r.out)
    assert.matches("must return sandbox", r.out, 1, true)
  end)

  it("names the service account when run as root", function()
    if not IS_ROOT then
      pending("only observable as root")
      return
    end
    local r = sbx({ "doctor", config(dir), "--no-docker" })
    assert.matches("runuser -u sbx -- sbx doctor", r.out, 1, true)
    -- never a fix that hands the directories to root
    assert.is_nil(r.out:find("chown root", 1, true))
  end)

  it("asks the daemon when docker is usable: a docker line, and the image line or its fix", function()
    if not non_root() then return end
    local r = sbx({ "doctor", config(dir) })
    assert.matches("\n%a+ +docker ", r.out)
    if r.out:find("ok    docker ", 1, true) then
      assert.matches("image            pi-roundtable-sandbox:local", r.out, 1, true)
      assert.matches("docker data", r.out, 1, true)
    end
  end)
end)

describe("sbx run and sbx chat with a fake driver", function()
  local dir, path
  before_each(function()
    dir = tmpdir()
    path = config(dir, "driver = driver,", FAKE_DRIVER)
  end)
  after_each(function() rmtree(dir) end)

  it("run prints the reply on stdout and exits 0", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "alice:Alice:p-1", "hello", "there" })
    assert.equal(0, r.code, r.err)
    assert.equal("echo Alice: hello there (reset=false)\n", r.out)
    -- the turn left nothing in runRoot; the workspace exists
    assert.same({}, core.fs_readdir(dir .. "/run"))
    assert.equal(1, #core.fs_readdir(dir .. "/ws"))
  end)

  it("run prints control characters other than \\n and \\t as U+FFFD, mentions neutralised; --json prints the exact text (hardening.md 6)", function()
    if not non_root() then return end
    local F, Z = "\239\191\189", "\226\128\139"
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "controls" })
    assert.equal(0, r.code, r.err)
    assert.equal(F .. "]0;title" .. F .. F .. "]52;c;AAAA" .. F .. " a\tb\nc" .. F .. F .. F .. " @" .. Z .. "everyone\n", r.out)
    r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "--json", "controls" })
    assert.equal(0, r.code, r.err)
    assert.equal('{"ok":true,"text":"\\u001b]0;title\\u0007\\u001b]52;c;AAAA\\u0007 a\\tb\\nc\\r\194\133\127 @'
      .. Z .. 'everyone","reason":"ok"}\n', r.out)
    r = sbx({ "chat", path, "--channel", "demo:1", "--speaker", "a" }, "controls\n")
    assert.equal(0, r.code, r.err)
    assert.equal("sandbox: " .. F .. "]0;title" .. F .. F .. "]52;c;AAAA" .. F .. " a\tb\nc" .. F .. F .. F .. " @" .. Z
      .. "everyone\n", r.out)
  end)

  it("--json of a failed turn carries what the operator acts on: turn, fix, upstream status and cause", function()
    local common = require "sandbox.cli._common"
    local json = require "sandbox.json"
    local line = common.json_reply(true, { ok = false, reason = "upstream_status", turn = "ab12", fix = "check modelUrl and model",
      route = "/model", status = 404, code = "model_not_found" }, "The sandbox turn failed or was stopped.")
    assert.same({ ok = false, text = "The sandbox turn failed or was stopped.", reason = "upstream_status", turn = "ab12",
      fix = "check modelUrl and model", route = "/model", status = 404, code = "model_not_found" }, json.plain(json.decode(line)))
    line = common.json_reply(true, { ok = false, reason = "upstream_unreachable", cause = "connection refused" }, "x")
    assert.equal("connection refused", json.decode(line).cause)
    -- a successful turn's line stays the three members
    assert.equal('{"ok":true,"text":"hi","reason":"ok"}', common.json_reply(true, { ok = true, reason = "ok", turn = "t" }, "hi"))
  end)

  it("a provider's refusal is reported by its status and fix, without the worker's own failure message", function()
    local common = require "sandbox.cli._common"
    local out = {}
    local real = io.stderr
    io.stderr = { write = function(_, ...) for _, v in ipairs { ... } do out[#out + 1] = v end end }
    local ok, code = pcall(common.report_turn, "run", { ok = false, reason = "upstream_status", error = "sandbox worker failed",
      route = "/model", status = 401, code = "invalid_api_key" }, true, nil, nil)
    local unreachable = {}
    local mark = #out
    pcall(common.report_turn, "run", { ok = false, reason = "upstream_unreachable", error = "sandbox worker failed",
      route = "/model", cause = "name resolution failed" }, true, nil, nil)
    io.stderr = real
    assert.is_true(ok, code)
    local text = table.concat(out, "", 1, mark)
    for i = mark + 1, #out do unreachable[#unreachable + 1] = out[i] end
    assert.matches("sbx run: turn failed: upstream_status\n  upstream: route=/model status=401 code=invalid_api_key\n", text, 1, true)
    assert.is_nil(text:find("sandbox worker failed", 1, true))
    local u = table.concat(unreachable)
    assert.matches("  upstream: route=/model cause=name resolution failed\n", u, 1, true)
    assert.is_nil(u:find("sandbox worker failed", 1, true))
  end)

  it("run reports a worker outcome by its reason, never as an unexpected error (hardening.md 9)", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "big" })
    assert.equal(1, r.code)
    assert.equal("The sandbox turn failed or was stopped.\n", r.out)
    assert.matches("sbx run: turn failed: invalid_reply\n  fix: the image is not this engine's worker, or it was "
      .. "tampered with\n  error: body too large\n", r.err, 1, true)
    assert.is_nil(r.err:find("unexpected error", 1, true))
  end)

  it("run reads TEXT from stdin with -", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "alice", "-" }, "from stdin\n")
    assert.equal(0, r.code, r.err)
    assert.equal("echo alice: from stdin (reset=false)\n", r.out)
  end)

  it("run: a worker answer ok=false prints the generic guest text and exits 1", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "not ok" })
    assert.equal(1, r.code)
    assert.equal("The sandbox turn failed.\n", r.out)
    assert.matches("sbx run: turn failed: budget_exhausted\n  fix: a guest or model loop spent the turn's broker calls",
      r.err, 1, true)
  end)

  it("run: a failed turn prints the guest text, and no driver detail without SBX_DEBUG", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "raise" })
    assert.equal(1, r.code)
    assert.equal("The sandbox turn failed or was stopped.\n", r.out)
    assert.is_nil(r.err:find("driver exploded", 1, true))
    assert.matches("sbx run: turn failed: worker_failed\n  fix: check the image with `sbx doctor " .. path .. "`",
      r.err, 1, true)
  end)

  it("run: a turn over --timeout fails with the deadline and its fix", function()
    if not non_root() then return end
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "--timeout", "1000", "slow" })
    assert.equal(1, r.code)
    assert.equal("The sandbox turn failed or was stopped.\n", r.out)
    assert.matches("sbx run: turn failed: deadline", r.err, 1, true)
    assert.matches("fix: raise turnTimeoutMs", r.err, 1, true)
    assert.matches(" warn turn finished channel=demo:1 turn=%x+ reason=deadline", r.err)
  end)

  it("run as the wrong user names the fix", function()
    if not non_root() then return end
    local p2 = config(dir, "driver = driver, uid = " .. (core.getuid() + 1) .. ",", FAKE_DRIVER)
    local r = sbx({ "run", p2, "--channel", "demo:1", "--speaker", "a", "hi" })
    assert.equal(3, r.code)
    assert.matches("run the host as a non-root user; worker uid/gid must match it", r.err, 1, true)
    assert.matches("fix: remove uid/gid from the config or set uid = " .. core.getuid(), r.err, 1, true)
  end)

  it("run refuses a 0755 runRoot with the fix", function()
    if not non_root() then return end
    core.fs_mkdir(dir .. "/run")
    os.execute("chmod 755 " .. shq(dir .. "/run"))
    local r = sbx({ "run", path, "--channel", "demo:1", "--speaker", "a", "hi" })
    assert.equal(3, r.code)
    assert.matches("sandbox roots must be private directories owned by the service user", r.err, 1, true)
    assert.matches("chmod 700", r.err, 1, true)
  end)

  it("chat runs one turn per line in order, skips blank lines and stops at /quit", function()
    if not non_root() then return end
    local r = sbx({ "chat", path, "--channel", "demo:1", "--speaker", "alice:Alice" },
      "first\n\n   \nsecond\r\n/help\n/quit\nnever\n")
    assert.equal(0, r.code, r.err)
    assert.equal("sandbox: echo Alice: first (reset=false)\nsandbox: echo Alice: second (reset=false)\n", r.out)
    assert.matches("sbx chat: channel demo:1 as Alice", r.err, 1, true)
    assert.matches("/quit, /exit", r.err, 1, true)
  end)

  it("chat leaves at end of input after the queued turns, reporting failures as guest text", function()
    if not non_root() then return end
    local r = sbx({ "chat", path, "--channel", "demo:1", "--speaker", "bob" }, "one\nnot ok\nraise\ntwo")
    assert.equal(0, r.code, r.err)
    assert.equal(table.concat({
      "sandbox: echo bob: one (reset=false)",
      "sandbox: The sandbox turn failed.",
      "sandbox: The sandbox turn failed or was stopped.",
      "sandbox: echo bob: two (reset=false)", "" }, "\n"), r.out)
  end)
end)

-- Real Docker (opt-in like spec/docker/: SANDBOX_DOCKER_TEST=1, a daemon this
-- user may use, and the image from `make image`).
describe("with real Docker (SANDBOX_DOCKER_TEST=1)", function()
  local function docker_ready()
    if os.getenv("SANDBOX_DOCKER_TEST") ~= "1" then
      pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker cases")
      return false
    end
    if not non_root() then return false end
    local ok = os.execute("docker image inspect pi-roundtable-sandbox:local >/dev/null 2>&1")
    if not ok then
      pending("the image pi-roundtable-sandbox:local is missing (make image)")
      return false
    end
    return true
  end

  local function sbx_demo_dirs()
    local p = io.popen("ls -d /tmp/sbx-demo-* 2>/dev/null")
    local s = p:read("a")
    p:close()
    return s
  end

  it("`sbx demo` runs two turns, the second recalls the first's note, and leaves nothing", function()
    if not docker_ready() then return end
    local before = sbx_demo_dirs()
    local r = sbx({ "demo", "--no-build" })
    assert.equal(0, r.code, r.out .. r.err)
    assert.matches("Alice: Please remember that the team lunch is on Friday at noon.", r.out, 1, true)
    assert.matches("the model asked for host_clock and memory_set", r.out, 1, true)
    assert.matches('notes say: "the team lunch is on Friday at noon"', r.out, 1, true)
    assert.matches("saw the host key on 3 of 3 calls", r.out, 1, true)
    assert.matches("cleaned up: no container left", r.out, 1, true)
    assert.equal(before, sbx_demo_dirs())
  end)

  it("run, chat and doctor against the scripted model started by the config itself", function()
    if not docker_ready() then return end
    local dir = tmpdir()
    local path = config(dir, "", "")
    write(path, string.format([[
local m = assert(require("sandbox.cli._demo_model").start { key = "spec-host-key" })
return require("sandbox") {
  image = "pi-roundtable-sandbox:local", runRoot = %q, workspaceRoot = %q, stateFile = %q,
  model = "demo-model", modelUrl = m.url, allowHttp = true,
  apiKey = function() return "spec-host-key" end,
  tools = { { name = "clock", description = "Read the current UTC time",
    parameters = { type = "object", properties = {} },
    run = function(_, ctx) ctx.signal:throw_if_aborted() return "2026-01-02T03:04:05Z" end } },
}
]], dir .. "/run", dir .. "/ws", dir .. "/state/channels.json"))
    local r = sbx({ "run", path, "--channel", "demo:docker", "--speaker", "bob:Bob", "Remember that the door is blue" })
    assert.equal(0, r.code, r.err)
    assert.equal('Bob, got it. The host clock says 2026-01-02T03:04:05Z. I saved a channel note: "the door is blue".\n', r.out)
    r = sbx({ "chat", path, "--channel", "demo:docker", "--speaker", "bob:Bob" }, "What do you remember?\n")
    assert.equal(0, r.code, r.err)
    assert.matches('^sandbox: Bob, this channel\'s notes say: "the door is blue"', r.out)
    r = sbx({ "doctor", path })
    assert.equal(0, r.code, r.out)
    assert.matches("ok    image            pi-roundtable-sandbox:local present", r.out, 1, true)
    assert.matches("ok    stale            no containers of this installation", r.out, 1, true)
    assert.same({}, core.fs_readdir(dir .. "/run"))
    rmtree(dir)
  end)
end)

describe("sbx doctor (spec/operations.md 5)", function()
  local fake_upstream = require "fake_upstream"
  local async = require "sandbox.async"
  local json = require "sandbox.json"
  local dir, up

  setup(function() up = fake_upstream.start() end)
  teardown(function() if up then up:stop() end end)
  before_each(function()
    dir = tmpdir()
    async.run(function() up:reset() end)
  end)
  after_each(function() rmtree(dir) end)

  local function conf(extra)
    return config(dir, string.format("modelUrl = %q, allowHttp = true, %s",
      up:url("/v1/chat/completions"), extra or ""))
  end

  it("--probe sends one minimal request and names the outputTokensField fix for a 400 unsupported_parameter", function()
    if not non_root() then return end
    async.run(function() up:script { { status = 400, body = '{"error":{"message":"Unsupported parameter: '
      .. "'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.\","
      .. '"type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}' } } end)
    local r = sbx({ "doctor", conf(), "--no-docker", "--probe" })
    assert.equal(1, r.code, r.out)
    assert.matches("FAIL  probe            model call refused upstream: status=400 code=unsupported_parameter "
      .. "type=invalid_request_error param=max_tokens (127.0.0.1 auth=bearer max_tokens=1)", r.out, 1, true)
    assert.matches('\n      fix: set outputTokensField = "max_completion_tokens"\n', r.out, 1, true)
    assert.is_nil(r.out:find("Unsupported parameter", 1, true))
    assert.is_nil(r.out:find("spec-key", 1, true))
    local log = async.run(function() return up:log() end)
    assert.equal(1, #log)
    assert.equal('{"model":"spec-model","messages":[{"role":"user","content":"ping"}],"stream":false,"max_tokens":1}',
      log[1].body)
    assert.equal("Bearer spec-key", (function()
      for _, h in ipairs(log[1].headers) do if h[1] == "authorization" then return h[2] end end
    end)())
  end)

  it("--probe with the configured field passes and never prints the reply", function()
    if not non_root() then return end
    local r = sbx({ "doctor", conf('outputTokensField = "max_completion_tokens",'), "--no-docker", "--probe" })
    assert.equal(0, r.code, r.out)
    assert.matches("ok    probe            status=200 127.0.0.1 auth=bearer max_completion_tokens=1", r.out, 1, true)
    assert.is_nil(r.out:find('"ok"', 1, true))
    local log = async.run(function() return up:log() end)
    assert.truthy(log[1].body:find('"max_completion_tokens":1}', 1, true))
  end)

  it("prints the model route it will use, never the key", function()
    if not non_root() then return end
    local r = sbx({ "doctor", conf('modelAuth = "api-key", maxOutputTokens = 8000,'), "--no-docker" })
    assert.matches("ok    broker           model route 127.0.0.1 auth=api-key output=max_tokens limit=8000", r.out, 1, true)
    assert.is_nil(r.out:find("spec-key", 1, true))
  end)

  it("--channel calls apiKey once with that scope and reports a nil-returning hook", function()
    if not non_root() then return end
    local marks = dir .. "/calls"
    local p = config(dir, string.format([[apiKey = function(scope)
      local f = io.open(%q, "a") f:write(scope.channel, " ", scope.speaker.id, "\n") f:close()
      return nil
    end,]], marks))
    -- the config's own apiKey line comes first in the table; this one wins
    local r = sbx({ "doctor", p, "--no-docker", "--channel", "discord:42", "--speaker", "bob" })
    assert.equal(1, r.code)
    assert.matches("FAIL  apiKey call      credential_missing: returned nil for channel discord:42", r.out, 1, true)
    assert.matches("fix: apiKey returned no credential for this channel/speaker", r.out, 1, true)
    assert.equal("discord:42 bob\n", spec_fs.read(marks))
    r = sbx({ "doctor", conf(), "--no-docker" })
    assert.matches("skip  apiKey call      not called (use --channel KEY to call it once)", r.out, 1, true)
  end)

  it("--channel: a hook that returns a key says only that", function()
    if not non_root() then return end
    local r = sbx({ "doctor", conf(), "--no-docker", "--channel", "discord:42" })
    assert.matches("ok    apiKey call      returned a credential for channel discord:42", r.out, 1, true)
    assert.is_nil(r.out:find("spec-key", 1, true))
  end)

  it("--json prints the checks as one JSON array", function()
    if not non_root() then return end
    local r = sbx({ "doctor", conf(), "--no-docker", "--json" })
    assert.equal(0, r.code, r.out)
    local list = assert(json.decode(r.out))
    assert.equal("array", json.kind(list))
    local by = {}
    for _, c in ipairs(list) do by[c.name] = c end
    assert.equal("ok", by.config.status)
    assert.equal("ok", by.runRoot.status)
    assert.equal("skip", by.docker.status)
    os.execute("chmod 755 " .. shq(dir .. "/ws") .. " 2>/dev/null; mkdir -p " .. shq(dir .. "/ws") .. " && chmod 755 " .. shq(dir .. "/ws"))
    r = sbx({ "doctor", conf(), "--no-docker", "--json" })
    assert.equal(1, r.code)
    for _, c in ipairs(assert(json.decode(r.out))) do
      if c.name == "workspaceRoot" then
        assert.equal("fail", c.status)
        assert.equal("sandbox roots must be private directories owned by the service user", c.message)
        assert.equal("chmod 700 " .. dir .. "/ws", c.fix)
      end
    end
  end)

  it("checks what sbx run refuses, in its words: the time zone, the state file, apiKey against modelAuth", function()
    if not non_root() then return end
    local r = spec_fs.run("env TZ=Not/AZone " .. BIN .. " doctor " .. shq(conf()) .. " --no-docker")
    assert.matches("FAIL  time zone        invalid time zone: Not/AZone", r, 1, true)
    assert.matches("fix: set TZ to an IANA zone name", r, 1, true)
    os.execute("mkdir -m 700 " .. shq(dir .. "/state"))
    write(dir .. "/state/channels.json", "{not json")
    local out = sbx({ "doctor", conf(), "--no-docker" }).out
    assert.matches("FAIL  stateFile        invalid sandbox channel state", out, 1, true)
    local p = dir .. "/none.conf.lua"
    write(p, string.format([[return require("sandbox") { image = "i", runRoot = %q, workspaceRoot = %q,
      stateFile = %q, model = "m", modelUrl = "http://127.0.0.1:1/v1", allowHttp = true, modelAuth = "none",
      apiKey = function() return "ollama" end }]], dir .. "/run", dir .. "/ws", dir .. "/state/c.json"))
    out = sbx({ "doctor", p, "--no-docker" }).out
    assert.matches("FAIL  config", out, 1, true)
    assert.matches('apiKey is unused when modelAuth is "none"', out, 1, true)
    assert.matches("fix: remove apiKey from the config", out, 1, true)
  end)

  it("an unreadable config says so and how to fix it; a missing one names the path", function()
    if not non_root() then return end
    local p = conf()
    os.execute("chmod 000 " .. shq(p))
    local r = sbx({ "doctor", p })
    assert.equal(1, r.code)
    assert.matches("FAIL  config", r.out, 1, true)
    assert.matches("Permission denied", r.out, 1, true)
    assert.matches("fix: make " .. p .. " readable by ", r.out, 1, true)
    assert.is_nil(r.out:find("correct the config script", 1, true))
    r = sbx({ "doctor", dir .. "/missing.lua" })
    assert.matches("fix: check the path: " .. dir .. "/missing.lua does not exist", r.out, 1, true)
  end)

  it("an unreachable DOCKER_HOST names that variable; a missing image names make image", function()
    if not non_root() then return end
    local sock = dir .. "/none.sock"
    local out = spec_fs.run("env DOCKER_HOST=unix://" .. sock .. " " .. BIN .. " doctor " .. shq(conf()))
    assert.matches("FAIL  docker           the Docker daemon did not answer: DOCKER_HOST=unix://" .. sock, out, 1, true)
    assert.matches("fix: DOCKER_HOST=unix://" .. sock .. " does not answer: start the daemon on that socket or fix DOCKER_HOST",
      out, 1, true)
    assert.is_nil(out:find("dockerd &", 1, true))
    local ok_docker = spec_fs.run("docker info >/dev/null 2>&1 && echo yes") == "yes"
    if not ok_docker then return end
    local missing = "sbx-cli-spec-missing:" .. core.random_hex(4)
    local p = config(dir, string.format("image = %q,", missing))
    out = sbx({ "doctor", p }).out
    assert.matches("FAIL  image            sandbox image is missing: " .. missing, out, 1, true)
    assert.matches("fix: build it: make -C ", out, 1, true)
    assert.matches(" image SBX_IMAGE=" .. missing, out, 1, true)
  end)
end)

describe("sbx run: cleanup_failed through the CLI driver (a docker binary whose rm fails)", function()
  it("reports cleanup_failed with its fix and exit 1, naming sbx cleanup", function()
    if not non_root() then return end
    local dir = tmpdir()
    local fake = dir .. "/docker"
    write(fake, [[#!/bin/sh
case "$1" in
  run) cat >/dev/null; printf '{"ok":true,"text":"done"}'; exit 0 ;;
  rm) echo "Error response from daemon: driver failed to remove the container" >&2; exit 1 ;;
  info) echo "24.0|/var/lib/docker"; exit 0 ;;
  ps) exit 0 ;;
  *) exit 1 ;;
esac
]])
    os.execute("chmod 755 " .. shq(fake))
    local p = config(dir, string.format('driver = require("sandbox.drivers.cli").new { binary = %q },', fake))
    local r = sbx({ "run", p, "--channel", "demo:1", "--speaker", "a", "hi" })
    assert.equal(1, r.code, r.err)
    assert.equal("The sandbox turn failed or was stopped.\n", r.out)
    assert.matches("sbx run: turn failed: cleanup_failed\n  fix: inspect this installation's containers; `sbx cleanup "
      .. p .. " --force`", r.err, 1, true)
    rmtree(dir)
  end)
end)

-- issue 21 item 7: sbx doctor checks the shipped rich and precheck example
-- configs (each given its argument with --options, as the Bun bridge gives
-- `options`), passes them on a correct setup, and names the fix of each of
-- their startup refusals in that mode's own words.
describe("sbx doctor on the shipped rich and precheck example configs", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() rmtree(dir) end)

  local function opts(t)
    local parts = {}
    for k, v in pairs(t) do parts[#parts + 1] = string.format("%q:%q", k, v) end
    return "{" .. table.concat(parts, ",") .. "}"
  end

  it("examples/rich.conf.lua passes with a private partyDir (rich mode's checks, no sandbox{} option refused)", function()
    if not non_root() then return end
    local r = sbx({ "doctor", "examples/rich.conf.lua", "--no-docker", "--options", opts { partyDir = dir .. "/party" } })
    assert.equal(0, r.code, r.out .. r.err)
    assert.matches("ok    config           examples/rich.conf.lua (rich mode)", r.out, 1, true)
    assert.matches("ok    partyDir         " .. dir .. "/party (private", r.out, 1, true)
    assert.matches("all checks passed", r.out, 1, true)
    assert.is_nil(r.out:find("unknown sandbox option", 1, true))
  end)

  it("examples/precheck.conf.lua passes with a private runRoot", function()
    if not non_root() then return end
    local r = sbx({ "doctor", "examples/precheck.conf.lua", "--no-docker", "--options", opts { runRoot = dir .. "/pre" } })
    assert.equal(0, r.code, r.out .. r.err)
    assert.matches("ok    config           examples/precheck.conf.lua (precheck mode)", r.out, 1, true)
    assert.matches("ok    runRoot          " .. dir .. "/pre (private", r.out, 1, true)
    assert.is_nil(r.out:find("unknown sandbox option", 1, true))
  end)

  it("each startup refusal names its fix: no partyDir, a shared partyDir, a shared or relative runRoot", function()
    if not non_root() then return end
    local r = sbx({ "doctor", "examples/rich.conf.lua", "--no-docker" })
    assert.equal(1, r.code)
    assert.matches("Dedicated absolute state directory required", r.out, 1, true)
    assert.matches("fix: set partyDir to an absolute path (not /) of a directory used only by rich mode "
      .. "(a config that takes it from its argument: sbx doctor examples/rich.conf.lua --options '{\"partyDir\":", r.out, 1, true)
    local shared = dir .. "/shared"
    core.fs_mkdir(shared)
    os.execute("chmod 755 " .. shq(shared))
    r = sbx({ "doctor", "examples/rich.conf.lua", "--no-docker", "--options", opts { partyDir = shared } })
    assert.equal(1, r.code)
    assert.matches("State directory must be private and host-owned", r.out, 1, true)
    assert.matches("fix: chown " .. require("sandbox.cli._common").user_name() .. ": " .. shared .. " && chmod 700 " .. shared, r.out, 1, true)
    r = sbx({ "doctor", "examples/precheck.conf.lua", "--no-docker", "--options", opts { runRoot = shared } })
    assert.equal(1, r.code)
    assert.matches("fix: chown " .. require("sandbox.cli._common").user_name() .. ": " .. shared .. " && chmod 700 " .. shared .. "\n", r.out, 1, true)
    assert.is_nil(r.out:find("WORKSPACEROOT", 1, true))     -- the runner has no workspaceRoot
    r = sbx({ "doctor", "examples/precheck.conf.lua", "--no-docker", "--options", opts { runRoot = "relative/dir" } })
    assert.equal(1, r.code)
    assert.matches("fix: set runRoot to the absolute path of a directory used only by the precheck runner", r.out, 1, true)
  end)

  it("--options must be a JSON object; sbx run refuses a rich config and points at doctor", function()
    if not non_root() then return end
    local r = sbx({ "doctor", "examples/rich.conf.lua", "--options", "[1]" })
    assert.equal(2, r.code)
    assert.matches("--options must be a JSON object", r.err, 1, true)
    local conf = dir .. "/rich.lua"
    write(conf, string.format('return assert(loadfile("examples/rich.conf.lua"))({ partyDir = %q })', dir .. "/party"))
    r = sbx({ "run", conf, "--channel", "demo:1", "--speaker", "1", "hi" })
    assert.equal(3, r.code)
    assert.matches("returns a rich-mode runtime, not sandbox { ... }", r.err, 1, true)
  end)

  it("with real Docker: the image each example names, or its build command", function()
    if os.getenv("SANDBOX_DOCKER_TEST") ~= "1" then
      pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker cases")
      return
    end
    if not non_root() then return end
    local r = sbx({ "doctor", "examples/rich.conf.lua", "--options",
      opts { partyDir = dir .. "/party", image = "pi-roundtable-sandbox:no-such-tag-h21" } })
    assert.equal(1, r.code)
    assert.matches("ok    docker           daemon ", r.out, 1, true)
    assert.matches("FAIL  image            rich worker image is missing: pi-roundtable-sandbox:no-such-tag-h21", r.out, 1, true)
    assert.matches("fix: build it: make %-C .- image%-pi\n", r.out)
    if os.execute("docker image inspect pi-roundtable-sandbox:pi >/dev/null 2>&1") then
      r = sbx({ "doctor", "examples/rich.conf.lua", "--options", opts { partyDir = dir .. "/party" } })
      assert.equal(0, r.code, r.out)
      assert.matches("ok    image            pi-roundtable-sandbox:pi present", r.out, 1, true)
    end
    if os.execute("docker image inspect pi-roundtable-sandbox:precheck >/dev/null 2>&1") then
      r = sbx({ "doctor", "examples/precheck.conf.lua", "--options", opts { runRoot = dir .. "/pre" } })
      assert.equal(0, r.code, r.out)
      assert.matches("ok    image            pi-roundtable-sandbox:precheck present", r.out, 1, true)
    end
  end)
end)
