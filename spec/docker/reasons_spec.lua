-- docker/reasons_spec.lua: every failure reason of spec/operations.md 1 that
-- a sealed turn on the real daemon can meet, each from a real cause, as
-- `sbx run` shows it: the guest text on stdout, `sbx run: turn failed:
-- <reason>` and its fix on stderr, the class exit status (0 ok, 1 the turn
-- failed, 4 the daemon or the image), and the `turn finished` line
-- ("Behaviours the specs must cover" 1-2). The real worker image is built
-- from this build under a test tag; the hostile workers are FROM-scratch
-- images of spec/fixtures/hostile/probe.c. The provider families' turns in
-- real Docker are spec/docker/provider_turns_spec.lua. Opt-in with
-- SANDBOX_DOCKER_TEST=1; runs as the sbx account.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local fake_upstream = require "fake_upstream"
local probe_images = require "probe_images"
local spec_fs = require "spec_fs"
local C = require "log_capture"
local D = require "docker_runtime"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local KEY = "reasons-spec-key-Zq81"
local TAG = core.random_hex(4)
local WORKER = "sbx-reasons-spec-worker:" .. TAG
local PROBES = { bogus = true, oomclaim = true, oom = true, garbage = true, hostile = true }
local BUILD = package.cpath:match("(build[%w%-]*)/lua/%?%.so") or "build"

local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("failure reasons on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

local function probe_image(mode) return "sbx-reasons-spec-" .. mode .. ":" .. TAG end

describe("failure reasons on real Docker, through sbx run", function()
  local root, up
  local n = 0

  setup(function()
    assert.is_not.equal(0, (core.getuid()), "run the Docker specs as the non-root sbx account")
    local _, rc = sh("docker info")
    assert.equal(0, rc, "the Docker daemon does not answer")
    root = spec_fs.tmpdir("sb-reasons")
    local out
    out, rc = sh("SBX_IMAGE=" .. WORKER .. " SBX_IMAGE_CONTEXT=" .. q(root .. "/ctx") .. " bash worker/image.sh " .. BUILD)
    assert.equal(0, rc, "make image recipe failed: " .. out)
    os.execute("mkdir -p " .. q(root .. "/probe"))
    out, rc = sh("cc -static -O2 -o " .. q(root .. "/probe/probe") .. " spec/fixtures/hostile/probe.c")
    assert.equal(0, rc, out)
    for mode in pairs(PROBES) do
      spec_fs.write(root .. "/probe/Dockerfile",
        "FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT [\"/probe\", \"" .. mode .. "\"]\n")
      out, rc = sh("docker build -q -t " .. q(probe_image(mode)) .. " " .. q(root .. "/probe"))
      assert.equal(0, rc, out)
    end
    up = fake_upstream.start()
  end)

  teardown(function()
    if up then up:stop() end
    for _, image in ipairs { WORKER, probe_image("bogus"), probe_image("oomclaim"), probe_image("oom"),
                             probe_image("garbage"), probe_image("hostile") } do
      probe_images.remove_containers_of(image)
      sh("docker image rm -f " .. q(image))
    end
    if root then spec_fs.rmdir(root, "sb-reasons") end
  end)

  -- Writes a config (extra: Lua source inside sandbox{...}) and runs
  -- `sbx run` on it; -> {code, out, err, turn = the parsed turn line}.
  local function sbx_run(extra, opts)
    opts = opts or {}
    n = n + 1
    local dir = root .. "/c" .. n
    os.execute("mkdir -m 700 -p " .. q(dir))
    local path = dir .. "/sandbox.conf.lua"
    spec_fs.write(path, string.format([[
%s
return require("sandbox") {
  image = %q, runRoot = %q, workspaceRoot = %q, stateFile = %q,
  model = "spec-model", modelUrl = %q, allowHttp = true,
  apiKey = %s,
  %s
  %s
}
]], opts.prelude or "", opts.image or WORKER, dir .. "/run", dir .. "/work", dir .. "/state/c.json",
      opts.url or up:url("/v1/chat/completions"), opts.api_key or string.format("function() return %q end", KEY),
      extra or "", D.lua()))
    if opts.before then opts.before(dir) end
    local cmd = string.format("%s %s run %s --channel %s --speaker guest %s -- %s",
      opts.env or "", BUILD .. "/sbx", q(path), q(opts.channel or "fake:reasons"),
      opts.timeout and ("--timeout " .. opts.timeout) or "", q(opts.text or "What time is it?"))
    local outf, errf = dir .. "/out", dir .. "/err"
    local _, _, code
    if opts.interrupt_after then
      local pid = spec_fs.sh(string.format("(%s >%s 2>%s & echo $!)", cmd, q(outf), q(errf)))
      os.execute("sleep " .. opts.interrupt_after)
      os.execute("kill -INT " .. pid)
      _, _, code = os.execute(string.format("while kill -0 %s 2>/dev/null; do sleep 0.2; done", pid))
      code = nil
    else
      _, _, code = os.execute(string.format("%s >%s 2>%s", cmd, q(outf), q(errf)))
    end
    local r = { code = code, out = spec_fs.read(outf) or "", err = spec_fs.read(errf) or "" }
    for line in r.err:gmatch("[^\n]+") do
      if line:find(" turn finished ", 1, true) then r.turn = C.parse_text(line) end
    end
    r.dir = dir
    return r
  end

  local function script(list)
    async.run(function()
      up:reset()
      up:script(list)
    end)
  end

  local function json_reply(message, finish)
    return { status = 200, headers = { ["Content-Type"] = "application/json" },
      body = json.encode(json.object({ "choices" }, { choices = json.array { json.object({ "index", "message",
        "finish_reason" }, { index = 0, message = message, finish_reason = finish or "stop" }) } })) }
  end

  local function expect(r, reason, code, fix)
    assert.equal(code, r.code, r.err)
    if reason ~= "ok" then
      assert.matches("sbx run: turn failed: " .. reason .. "\n", r.err, 1, true)
      if fix then
        local line = r.err:match("\n  fix: ([^\n]*)")
        assert.truthy(line and line:find(fix, 1, true), r.err)
      end
    end
    assert.truthy(r.turn, r.err)
    assert.equal(reason, r.turn.fields.reason)
    assert.is_nil(r.err:find(KEY, 1, true), "the key never reaches the log")
  end

  it("ok: the reply on stdout, exit 0, the turn line with its phase timings", function()
    script {}
    local r = sbx_run()
    expect(r, "ok", 0)
    assert.equal("ok\n", r.out)
    for _, k in ipairs { "ms", "ms_start", "ms_first_call", "ms_reply", "ms_removed", "exit" } do
      assert.matches("^%d+$", r.turn.fields[k], k)
    end
    assert.equal("1", r.turn.fields.model_calls)
  end)

  it("upstream_status: a 401 names the status, the code and the credential fix", function()
    script { { status = 401, body = '{"error":{"message":"Incorrect API key provided: ' .. KEY
      .. '","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}' } }
    local r = sbx_run()
    expect(r, "upstream_status", 1, "check the credential apiKey returns for this channel")
    assert.matches("  upstream: route=/model status=401 code=invalid_api_key type=invalid_request_error", r.err, 1, true)
    assert.equal("The sandbox turn failed or was stopped.\n", r.out)
  end)

  it("upstream_status: a 429 is the provider's quota (once the host's retries are spent)", function()
    local quota = { status = 429, body = '{"error":{"code":"rate_limit_exceeded","type":"requests"}}' }
    script { quota, quota, quota }
    expect(sbx_run(), "upstream_status", 1, "the provider is rate limiting or out of quota")
  end)

  it("upstream_unreachable: nothing listens at modelUrl", function()
    expect(sbx_run(nil, { url = string.format("http://127.0.0.1:%d/v1", fake_upstream.closed_port()) }),
      "upstream_unreachable", 1, "check modelUrl / the network from this host")
  end)

  it("upstream_invalid: a 200 that is not JSON", function()
    script { { status = 200, body = "<html>not an API</html>" } }
    expect(sbx_run(), "upstream_invalid", 1, "check modelUrl points at a Chat Completions endpoint")
  end)

  it("reflection: a reply echoing the key", function()
    script { json_reply(json.object({ "role", "content" }, { role = "assistant", content = "your key is " .. KEY })) }
    expect(sbx_run(), "reflection", 1, 'use modelAuth = "none"')
  end)

  it("credential_missing: apiKey returns nil for this channel", function()
    script {}
    expect(sbx_run(nil, { api_key = "function() return nil end" }), "credential_missing", 1,
      "apiKey returned no credential for this channel/speaker")
    async.run(function() assert.equal(0, #up:log()) end)
  end)

  it("credential_error: apiKey raises (its text stays out of the log)", function()
    script {}
    local r = sbx_run(nil, { api_key = "function() error('vault down') end" })
    expect(r, "credential_error", 1, "the hook raised; see the preceding log line")
    assert.matches("error apiKey raised an error channel=fake:reasons", r.err, 1, true)
    assert.is_nil(r.err:find("vault down", 1, true))
  end)

  it("budget_exhausted: twelve tool-calling replies spend the worker's model calls", function()
    local list = {}
    local call = json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
      tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c", type = "function",
        ["function"] = json.object({ "name", "arguments" }, { name = "memory_get", arguments = '{"scope":"speaker"}' }) }) } })
    for i = 1, 12 do list[i] = json_reply(call, "tool_calls") end
    script(list)
    local r = sbx_run()
    expect(r, "budget_exhausted", 1, "a guest or model loop spent the turn's broker calls")
    assert.equal("The sandbox turn failed.\n", r.out)
    assert.equal("12", r.turn.fields.model_calls)
  end)

  it("tool_failed: a host tool that raises is counted; the turn still succeeds", function()
    local call = json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
      tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c", type = "function",
        ["function"] = json.object({ "name", "arguments" }, { name = "host_boom", arguments = "{}" }) }) } })
    script { json_reply(call, "tool_calls") }
    local r = sbx_run([[tools = { { name = "boom", description = "b", parameters = { type = "object" },
      run = function() error("tool exploded") end } },]])
    expect(r, "ok", 0)
    assert.equal("1", r.turn.fields.tool_failures)
    assert.matches("broker call channel=fake:reasons turn=%x+ route=/tools/boom status=502 reason=tool_failed", r.err)
    assert.is_nil(r.err:find("tool exploded", 1, true))
  end)

  it("model_no_text: a reply with no text", function()
    script { json_reply(json.object({ "role", "content" }, { role = "assistant", content = "" })) }
    expect(sbx_run(), "model_no_text", 1, "the model's reply held no text")
  end)

  it("model_filtered: finish_reason content_filter with no text", function()
    script { json_reply(json.object({ "role", "content" }, { role = "assistant", content = json.null }), "content_filter") }
    expect(sbx_run(), "model_filtered", 1, "the provider's content filter withheld the reply")
  end)

  it("context_budget: tool descriptions over 32 KiB", function()
    script {}
    local r = sbx_run(string.format([[tools = { { name = "big", description = %q, parameters = { type = "object" },
      run = function() return "" end } },]], string.rep("d", 40000)))
    expect(r, "context_budget", 1, "do not fit one model request")
  end)

  it("memory_store and history: a corrupt channel file in the workspace", function()
    local seg = core.sha256_hex("fake:reasons")
    for _, c in ipairs { { "memory.json", "not json", "memory_store", "memory.json was invalid" },
                         { "history.json", "[1]", "history", "history.json was invalid" } } do
      -- moved aside, the turn goes on (hardening.md 8): ok, and a warn line
      script {}
      local r = sbx_run(nil, { before = function(dir)
        os.execute("mkdir -m 700 " .. q(dir .. "/work") .. " " .. q(dir .. "/work/" .. seg))
        spec_fs.write(dir .. "/work/" .. seg .. "/" .. c[1], c[2])
      end })
      expect(r, "ok", 0)
      assert.matches("warn worker repaired a store channel=fake:reasons turn=" .. r.turn.fields.turn
        .. " reason=" .. c[3], r.err, 1, true)
      -- a workspace the worker cannot write: it cannot move the file aside,
      -- and the turn fails with its reason
      script {}
      r = sbx_run(nil, { before = function(dir)
        os.execute("mkdir -m 700 " .. q(dir .. "/work") .. " " .. q(dir .. "/work/" .. seg))
        spec_fs.write(dir .. "/work/" .. seg .. "/" .. c[1], c[2])
        os.execute("chmod 500 " .. q(dir .. "/work/" .. seg))
      end })
      os.execute("chmod 700 " .. q(r.dir .. "/work/" .. seg))
      expect(r, c[3], 1, c[4])
    end
  end)

  it("worker_failed: a hostile worker's claimed reason does not change the host's", function()
    local r = sbx_run(nil, { image = probe_image("bogus") })
    expect(r, "worker_failed", 1, "check the image with `sbx doctor")
    r = sbx_run(nil, { image = probe_image("oomclaim") })
    expect(r, "worker_failed", 1)
    assert.equal("137", r.turn.fields.exit)
  end)

  it("worker_oom: the container is OOM-killed (the daemon's oom event)", function()
    local r = sbx_run("limits = { memoryMb = 64 },", { image = probe_image("oom") })
    expect(r, "worker_oom", 1, "raise limits.memoryMb or look for a memory bomb in this channel")
  end)

  it("invalid_reply: stdout that is not a reply", function()
    expect(sbx_run(nil, { image = probe_image("garbage") }), "invalid_reply", 1,
      "the image is not this engine's worker, or it was tampered with")
  end)

  it("deadline: a worker that never answers within --timeout", function()
    local r = sbx_run(nil, { image = probe_image("hostile"), timeout = 1000 })
    expect(r, "deadline", 1, "raise turnTimeoutMs")
  end)

  it("stopped: Ctrl-C during the turn", function()
    local r = sbx_run(nil, { image = probe_image("hostile"), interrupt_after = 2 })
    assert.matches("sbx run: turn failed: stopped\n", r.err, 1, true)
    assert.equal("stopped", r.turn.fields.reason)
  end)

  it("image_missing: exit 4, naming the build command", function()
    local missing = "sbx-reasons-spec-missing:" .. TAG
    local r = sbx_run(nil, { image = missing })
    expect(r, "image_missing", 4, "image SBX_IMAGE=" .. missing)
  end)

  it("daemon_unavailable: DOCKER_HOST names a socket nothing answers on; exit 4, naming that variable", function()
    local sock = root .. "/nothing.sock"
    local r = sbx_run(nil, { env = "DOCKER_HOST=unix://" .. sock })
    expect(r, "daemon_unavailable", 4, "DOCKER_HOST=unix://" .. sock .. " does not answer")
  end)
end)
