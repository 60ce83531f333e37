-- docker/precheck_spec.lua: the precheck runner on the real daemon with the
-- real image pi-roundtable-sandbox:precheck (`make image`), as the non-root
-- service account (shared/spec/precheck.md 9 behaviours 25 and 35, and the
-- hostile script of the issue): a direct network fetch fails while a granted
-- mcp.json call through the precheck broker works; the backstop deadline
-- kills and removes a script that never returns; a script that writes
-- outside /tmp, forks past the PID limit, looks for credentials or calls an
-- ungranted tool 100 times gets only its own run refused. After every run
-- runRoot is empty and no container of that run is left.
-- The MCP server is the SDK fixture (spec/fixtures/mcp_server.mjs) on
-- loopback: only the host-side broker reaches it. Opt-in with
-- SANDBOX_DOCKER_TEST=1.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local mcp = require "mcp_server"
local P = require "precheck_harness"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local IMAGE = "pi-roundtable-sandbox:precheck"

local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("precheck runner on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end
-- The docker-runsc pass (docker_runtime.lua): the precheck runner has no
-- `runtime` option (warm-turns.md 2 gives it to the sealed runtime only), so
-- its containers would run under the default runtime again: said, not rerun.
if require("docker_runtime").name then
  describe("precheck runner on real Docker", function()
    pending("SBX_RUNTIME=" .. require("docker_runtime").name .. ": the precheck runner takes no runtime option "
      .. "(its containers always use the daemon's default; the first docker pass covered them)")
  end)
  return
end

describe("precheck runner on real Docker", function()
  local base, server, runner, root
  local next_id = math.random(100000000, 999999999)

  setup(function()
    assert.equal("Linux", sh("uname -s"))
    assert.is_not.equal(0, (core.getuid()), "run the Docker specs as the non-root sbx account")
    local _, rc = sh("docker info")
    assert.equal(0, rc, "the Docker daemon does not answer (make deps starts it)")
    local out
    out, rc = sh("docker image inspect " .. IMAGE)
    assert.equal(0, rc, "make image first: " .. out)
    local ok, why = mcp.available()
    assert(ok, why)
    server = mcp.start {}
    base = P.tmpdir()
    root = base .. "/run"
    runner = sandbox.precheckScriptRunner {
      image = IMAGE, runRoot = root, allowHttpMcp = true, timeoutMs = 30000,
      grant = function(scope)
        if scope.tier ~= "member" then return {} end
        return { { name = "health", url = server.url, tools = { "garmin-login", "garmin-get-hrv" },
                   token = function() return P.TOKEN end } }
      end,
    }
  end)

  teardown(function()
    if server then server:stop() end
    if base then P.rmdir(base) end
  end)

  local function containers(id)
    local out = sh("docker ps -a --filter name=roundtable-precheck-" .. id .. "- --format '{{.Names}}'")
    return out
  end

  -- One run of `script` as schedule #id; returns ok, result-or-error, id.
  local function run_script(script, over, r)
    next_id = next_id + 1
    local id = next_id
    local ctx = P.context(over)
    ctx.schedule.id = id
    ctx.tools = ctx.tools and #ctx.tools > 0 and ctx.tools or { { server = "health", tool = "garmin-get-hrv" } }
    local ok, res = pcall(async.run, function() return (r or runner).run(script, ctx) end)
    return ok, res, id
  end

  local function upstream_calls()
    return async.run(function() return #P.log(server) end)
  end

  local function left_nothing(id)
    assert.same({}, P.entries(root))
    assert.equal("", containers(id))
  end

  it("fails a direct network fetch while a granted mcp.json call works; runRoot is empty afterwards (behaviour 35)", function()
    local before = upstream_calls()
    local ok, res, id = run_script([[
      export default async ({ mcp, today }) => {
        let net = "blocked";
        for (const url of ["http://1.1.1.1/", "http://example.com/", "]] .. server.url .. [["]) {
          try { await fetch(url, { signal: AbortSignal.timeout(5000) }); net = "open " + url; } catch {}
        }
        const v = await mcp.json("health", "garmin-get-hrv", { date: today });
        return { wake: true, context: `${net} ${today} ${v.hrv}` };
      };
    ]])
    assert.is_true(ok, res)
    assert.is_true(res.wake)
    assert.equal("blocked 2026-10-04 22", res.context)
    assert.equal(before + 1, upstream_calls())
    left_nothing(id)
  end)

  it("kills and removes a script that never returns when the backstop deadline fires (behaviour 25)", function()
    local quick = sandbox.precheckScriptRunner {
      image = IMAGE, runRoot = root, allowHttpMcp = true, timeoutMs = 1000, grant = function() return {} end,
    }
    local ok, err, id = run_script("export default () => new Promise(() => {});", nil, quick)
    assert.is_false(ok)
    assert.equal("precheck script timed out", err)
    left_nothing(id)
  end)

  it("refuses only the run of a script that writes outside /tmp", function()
    local ok, res, id = run_script([[
      import { writeFileSync } from "node:fs";
      export default () => {
        const wrote = [];
        for (const p of ["/x", "/app/x", "/usr/local/bin/bun", "/workspace/x", "/broker/x", "/proc/x"]) {
          try { writeFileSync(p, "1"); wrote.push(p); } catch {}
        }
        writeFileSync("/tmp/ok", "1");
        return { wake: false, note: wrote.join(",") || "none" };
      };
    ]])
    assert.is_true(ok, res)
    assert.equal("none", res.note)
    left_nothing(id)
  end)

  it("contains a fork bomb in its own run", function()
    local ok, res, id = run_script([[
      import { spawn } from "node:child_process";
      export default async () => {
        let started = 0, refused = 0;
        const kids = [];
        for (let i = 0; i < 64; i++) {
          try {
            const k = spawn("/usr/local/bin/bun", ["-e", "setTimeout(() => {}, 60000)"], { stdio: "ignore" });
            k.on("error", () => { refused++; });
            kids.push(k);
            started++;
          } catch { refused++; }
        }
        await new Promise((r) => setTimeout(r, 1000));
        return { wake: false, note: `${started} ${refused}` };
      };
    ]])
    -- Either the script saw the PID limit refuse children, or the limit
    -- ended the container: only this run is refused.
    if ok then
      local started, refused = res.note:match("^(%d+) (%d+)$")
      assert.is_true(tonumber(refused) > 0, res.note)
      assert.is_true(tonumber(started) - tonumber(refused) < 32, res.note)
    else
      assert.equal("sandbox worker failed", res)
    end
    left_nothing(id)
    local again_ok, again = run_script([[
      export default async ({ mcp, today }) => ({ wake: false, note: String((await mcp.json("health", "garmin-get-hrv", { date: today })).hrv) });
    ]])
    assert.is_true(again_ok, again)
    assert.equal("22", again.note)
  end)

  it("finds no credential, URL or host file in the container", function()
    local ok, res, id = run_script([[
      import { readdirSync, readFileSync } from "node:fs";
      export default () => {
        const seen = { env: process.env, broker: readdirSync("/broker"), workspace: readdirSync("/workspace"),
                       root: readdirSync("/"), files: {} };
        for (const p of ["/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline", "/etc/passwd", "/etc/hosts",
                         "/broker/broker.sock", "/app/bunfig.toml"]) {
          try { seen.files[p] = readFileSync(p, "latin1"); } catch (e) { seen.files[p] = "error " + e.code; }
        }
        return { wake: false, note: JSON.stringify(seen) };
      };
    ]])
    assert.is_true(ok, res)
    local seen = json.decode(res.note)
    assert.same({ "broker.sock" }, { table.unpack(seen.broker) })
    assert.same({}, { table.unpack(seen.workspace) })
    assert.is_nil(res.note:find(P.TOKEN, 1, true))
    assert.is_nil(res.note:find(tostring(server.port), 1, true))
    assert.is_nil(res.note:find("127.0.0.1:", 1, true))
    assert.equal("/tmp/home", seen.env.HOME)
    for name in pairs(seen.env) do assert.truthy(({ HOME = true, PATH = true, HOSTNAME = true })[name], name) end
    left_nothing(id)
  end)

  it("refuses an ungranted tool called 100 times, through the helper and straight at the broker; the upstream never sees it", function()
    local before = upstream_calls()
    local ok, res, id = run_script([[
      import net from "node:net";
      const raw = (body) => new Promise((resolve, reject) => {
        const s = net.createConnection({ path: "/broker/broker.sock" });
        const chunks = [];
        s.on("connect", () => s.end("POST /mcp/health HTTP/1.1\r\nhost: broker\r\ncontent-type: application/json\r\n" +
          `content-length: ${Buffer.byteLength(body)}\r\n\r\n` + body));
        s.on("data", (c) => chunks.push(c));
        s.on("end", () => resolve(Buffer.concat(chunks).toString().split(" ")[1]));
        s.on("error", reject);
      });
      export default async ({ mcp }) => {
        let local = 0;
        const statuses = {};
        const body = JSON.stringify({ method: "tools/call", params: { name: "garmin-delete-everything", arguments: {} } });
        for (let i = 0; i < 100; i++) {
          try { await mcp.call("health", "garmin-delete-everything"); } catch (e) { if (e.message.endsWith("is not granted to this script")) local++; }
          const st = await raw(body);
          statuses[st] = (statuses[st] || 0) + 1;
        }
        let granted;
        try { await mcp.call("health", "garmin-get-hrv", { date: "2026-10-04" }); granted = "answered"; } catch (e) { granted = e.message; }
        return { wake: false, note: JSON.stringify({ local, statuses, granted }) };
      };
    ]])
    assert.is_true(ok, res)
    local seen = json.decode(res.note)
    assert.equal(100, seen["local"])
    assert.equal(16, seen.statuses["403"])
    assert.equal(84, seen.statuses["429"])
    assert.equal("health/garmin-get-hrv: the script made too many MCP calls", seen.granted)
    assert.equal(before, upstream_calls())
    left_nothing(id)
    -- the next run has its own budget
    local again_ok, again = run_script([[
      export default async ({ mcp }) => ({ wake: false, note: String((await mcp.json("health", "garmin-get-hrv", { date: "x" })).hrv) });
    ]])
    assert.is_true(again_ok, again)
    assert.equal("22", again.note)
  end)
end)
