-- precheck_entry_spec.lua: the precheck image's entry script
-- (worker/precheck/precheck-main.mjs; shared/spec/precheck.md 7, behaviours
-- 26-34 of section 9), run by the real bun outside a container with only
-- HOME, TMPDIR, PRECHECK_BROKER_SOCKET and PATH set, against the real
-- precheck broker, which forwards to a real MCP server on the official SDK.
local async = require "sandbox.async"
local json = require "sandbox.json"
local mcp = require "mcp_server"
local P = require "precheck_harness"

local run = async.run
local server
local ok_mcp, why_mcp = mcp.available()
local have_bun = os.execute("command -v bun >/dev/null 2>&1")

setup(function()
  if ok_mcp then server = mcp.start {} end
end)
teardown(function()
  if server then server:stop() end
end)

-- Runs `script` with the entry script against a broker for `servers`
-- ({name, url, tools}), the input listing `granted` ({{name, {tools}}}).
-- Returns the answer, the exit status and the broker's stats; fn(b, sig)
-- runs before the script starts.
local function entry(script, servers, granted, opts, before)
  return run(function()
    local b, path, dir, sig = P.broker(servers or {}, opts)
    if before then before(b, sig) end
    local tmp = P.tmpdir()
    local answer, stdout, status = P.entry(P.input(script, granted or {}), path, tmp)
    local stats = b:stats()
    local left = P.entries(tmp)
    P.stop(b, dir)
    P.rmdir(tmp)
    assert.equal(0, status)
    assert(answer, "no JSON answer: " .. tostring(stdout))
    return answer, stats, left
  end)
end

local function health(tools, url)
  return { P.server("health", url or server.url, tools) }
end

local function calls_since(before)
  local out = {}
  run(function()
    for i, e in ipairs(P.log(server)) do
      if i > before then out[#out + 1] = e end
    end
  end)
  return out
end

local function log_size()
  return run(function() return #P.log(server) end)
end

describe("precheck entry script (precheck.md 7)", function()
  if not ok_mcp then pending(why_mcp) return end
  if not have_bun then pending("bun is not installed (run `make deps`)") return end

  it("runs the default export with mcp, today and schedule through the broker (behaviour 26)", function()
    local before = log_size()
    local answer, _, tmp_left = entry([[
      export default async ({ mcp, firedAt, timeZone, today, schedule }) => {
        if (!(firedAt instanceof Date) || firedAt.toISOString() !== "2026-10-04T05:00:00.000Z") throw new Error("firedAt");
        if (timeZone !== "Europe/Paris") throw new Error("timeZone");
        await mcp.call("health", "login");
        const v = await mcp.json("health", "hrv", { date: today });
        return { wake: true, context: `#${schedule.id} ${today}: HRV ${v.hrv}` };
      };
    ]], health { "login", "hrv" }, { { "health", { "login", "hrv" } } })
    assert.is_true(answer.ok)
    assert.is_true(answer.result.wake)
    assert.equal("#13 2026-10-04: HRV 22", answer.result.context)
    local seen = calls_since(before)
    assert.equal(2, #seen)
    assert.equal("login", seen[1].body.params.name)
    assert.equal('"arguments":{}', seen[1].raw:match('"arguments":%b{}'))
    assert.equal("hrv", seen[2].body.params.name)
    assert.equal('"arguments":{"date":"2026-10-04"}', seen[2].raw:match('"arguments":%b{}'))
    for _, name in ipairs(tmp_left) do    -- the script file was deleted after the import
      assert.is_nil(name:find("^precheck%-"), name)
    end
  end)

  it("exits 0 with its answer although a setInterval is left running (behaviour 27)", function()
    local answer = entry([[
      setInterval(() => {}, 10);
      export default () => { setInterval(() => {}, 5); return { wake: false, note: "timers left" }; };
    ]])
    assert.is_true(answer.ok)
    assert.equal("timers left", answer.result.note)
  end)

  it("refuses an ungranted tool without asking the broker (behaviour 28)", function()
    local answer, stats = entry([[
      export default async ({ mcp }) => mcp.call("health", "garmin-delete-everything", {});
    ]], health { "garmin-login" }, { { "health", { "garmin-login" } } })
    assert.is_false(answer.ok)
    assert.equal("health/garmin-delete-everything is not granted to this script", answer.error)
    assert.equal(16, stats.budget)
  end)

  it("fails an isError result with its first text content (behaviour 29)", function()
    run(function()
      server:queue_raw { status = 200, contentType = "application/json",
        body = '{"jsonrpc":"2.0","id":1,"result":{"isError":true,"content":[{"type":"image","data":""},{"type":"text","text":"Not logged in"}]}}' }
    end)
    local answer = entry([[
      export default async ({ mcp }) => mcp.call("health", "garmin-login");
    ]], health({ "garmin-login" }, server.raw_url), { { "health", { "garmin-login" } } })
    assert.is_false(answer.ok)
    assert.equal("health/garmin-login: Not logged in", answer.error)
  end)

  it("sends console noise to stderr and accepts export { check as default } (behaviour 30)", function()
    local answer = entry([[
      console.log("log"); console.info("info"); console.warn("warn"); console.error("error");
      console.debug("debug"); console.table([1]); console.dir({ a: 1 });
      async function check() { console.log("inside"); return { wake: false, note: "ok" }; }
      export { check as default };
    ]])
    assert.is_true(answer.ok)
    assert.same({ wake = false, note = "ok" }, { wake = answer.result.wake, note = answer.result.note })
  end)

  it("fails a module without a default export function (behaviour 31)", function()
    for _, script in ipairs { "export const check = () => 1;", "export default 42;" } do
      local answer = entry(script)
      assert.is_false(answer.ok)
      assert.equal("the script has no default export function", answer.error)
    end
  end)

  it("maps each broker status to its reason text: 403, 404, 409, 429 and any other (behaviour 32)", function()
    local servers = {
      P.server("health", server.url, { "slow", "garmin-login" }),
      P.server("raw", server.raw_url, { "x" }),
    }
    run(function() server:queue_raw { status = 500, body = "down" } end)
    local answer = entry([[
      export default async ({ mcp }) => {
        const errors = [];
        const attempt = async (p) => { try { await p; errors.push("ok"); } catch (e) { errors.push(e.message); } };
        await attempt(mcp.call("health", "forbidden"));
        await attempt(mcp.call("ghost", "x"));
        // the second call comes while the first is pending: it settles first
        await Promise.all([attempt(mcp.call("health", "slow", { ms: 800 })),
          new Promise((r) => setTimeout(r, 300)).then(() => attempt(mcp.call("health", "garmin-login")))]);
        await attempt(mcp.call("raw", "x"));
        await attempt(mcp.call("health", "garmin-login"));
        return errors;
      };
    ]], servers, { { "health", { "slow", "garmin-login", "forbidden" } }, { "ghost", { "x" } }, { "raw", { "x" } } },
      { maxCalls = 3 })
    assert.is_true(answer.ok)
    assert.same({
      "health/forbidden: that server or tool is not granted to this script",
      "ghost/x: that server is not granted to this script",
      "health/garmin-login: the script made two MCP calls at once; await each before the next",
      "ok",
      "raw/x: the broker call failed",
      "health/garmin-login: the script made too many MCP calls",
    }, { table.unpack(answer.result) })
  end)

  it("maps 410 to the run ended", function()
    local answer = entry([[
      export default async ({ mcp }) => mcp.call("health", "garmin-login");
    ]], health { "garmin-login" }, { { "health", { "garmin-login" } } }, {}, function(_, sig) sig:abort("x") end)
    assert.is_false(answer.ok)
    assert.equal("health/garmin-login: the run ended", answer.error)
  end)

  it("mcp.json returns structured content first, then parsed first text, then raw text, then undefined (behaviour 33)", function()
    run(function()
      server:queue_raw { status = 200, contentType = "application/json",
        body = '{"jsonrpc":"2.0","id":1,"result":{"structuredContent":0,"content":[{"type":"text","text":"[1]"}]}}' }
      server:queue_raw { status = 200, contentType = "application/json",
        body = '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\\"a\\":1}"}]}}' }
      server:queue_raw { status = 200, contentType = "text/event-stream",
        body = 'data: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"plain words"}]}}\n\n' }
      server:queue_raw { status = 200, contentType = "application/json",
        body = '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":""}]}}' }
    end)
    local answer = entry([[
      export default async ({ mcp }) => {
        const out = [];
        for (let i = 0; i < 4; i++) {
          const v = await mcp.json("raw", "x");
          out.push(v === undefined ? "undefined" : v);
        }
        return out;
      };
    ]], { P.server("raw", server.raw_url, { "x" }) }, { { "raw", { "x" } } })
    assert.is_true(answer.ok)
    assert.equal(0, answer.result[1])
    assert.equal(1, answer.result[2].a)
    assert.equal("plain words", answer.result[3])
    assert.equal("undefined", answer.result[4])
  end)

  it("fails non-object arguments locally, without a broker call (behaviour 34)", function()
    local before = log_size()
    local answer, stats = entry([[
      export default async ({ mcp }) => {
        const errors = [];
        for (const args of [[1], null, "x", 3, new Date(0)]) {
          try { await mcp.call("health", "login", args); } catch (e) { errors.push(e.message); }
        }
        return errors;
      };
    ]], health { "login" }, { { "health", { "login" } } })
    assert.is_true(answer.ok)
    for i = 1, 5 do assert.equal("health/login: arguments must be a JSON object", answer.result[i]) end
    assert.equal(16, stats.budget)
    assert.equal(0, #calls_since(before))
  end)

  it("keeps running, without answering, while the script's promise never settles", function()
    run(function()
      local tmp = P.tmpdir()
      local answer, stdout, _, sig = P.entry(P.input("export default () => new Promise(() => {});"), nil, tmp, 1500)
      P.rmdir(tmp)
      assert.is_nil(answer)
      assert.equal("", stdout)
      assert.equal(9, sig)        -- only the kill (the runner's deadline) ended it
    end)
  end)

  it("answers ok:false for invalid input, a throw, and a result that cannot be serialized, exiting 0", function()
    run(function()
      local tmp = P.tmpdir()
      local answer, _, status = P.entry('{"script":1}', nil, tmp)
      assert.equal(0, status)
      assert.same({ ok = false, error = "invalid precheck input" }, { ok = answer.ok, error = answer.error })
      answer, _, status = P.entry(string.rep(" ", 65537), nil, tmp)
      assert.equal(0, status)
      assert.equal("body too large", answer.error)
      answer = P.entry(P.input("export default () => { throw new Error('x'.repeat(1500)); }"), nil, tmp)
      assert.equal(1000, #answer.error)
      answer = P.entry(P.input("export default () => { throw 'plain'; }"), nil, tmp)
      assert.equal("plain", answer.error)
      answer = P.entry(P.input("export default () => ({ n: 1n })"), nil, tmp)
      assert.is_false(answer.ok)
      answer = P.entry(P.input("export default () => undefined"), nil, tmp)
      assert.is_true(answer.ok)
      assert.equal(json.null, answer.result)
      P.rmdir(tmp)
    end)
  end)

  it("lets a script import Bun's built-in modules only", function()
    local answer = entry([[
      import { createHash } from "node:crypto";
      export default () => createHash("sha256").update("x").digest("hex").slice(0, 8);
    ]])
    assert.is_true(answer.ok)
    assert.equal("2d711642", answer.result)
    answer = entry([[import pad from "left-pad"; export default () => pad("1", 3);]])
    assert.is_false(answer.ok)
    assert.truthy(answer.error:find("left-pad", 1, true))
  end)
end)
