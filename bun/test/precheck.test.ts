// precheck.test.ts: precheckScriptRunner through the bridge: the Lua runner
// (lua/sandbox/precheck) in the utility engine, built by a trusted Lua config
// (fixtures/precheck.conf.lua, whose driver seam stands in for the
// container), with describe/run as promises, toolName synchronous and the
// run's AbortSignal mirrored into the engine. The last case runs the example
// (examples/bun/precheck.ts) through real containers when Docker and the
// precheck image are there.
import { afterAll, describe, expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { disposeUtilityEngine, type PrecheckContext, precheckScriptRunner } from "../src/index.ts";
import { fixture, makeRoots } from "./helpers.ts";

const roots = makeRoots("sbp-");
afterAll(() => {
  disposeUtilityEngine();
  roots.cleanup();
});

const runner = (options: Record<string, unknown> = {}) =>
  precheckScriptRunner({ config: fixture("precheck.conf.lua"), options: { runRoot: roots.runRoot, ...options } });

const context = (over: Partial<PrecheckContext> = {}): PrecheckContext => ({
  schedule: { id: 13, title: "Morning HRV", channel: "discord:1", target: "dm:ada", createdTier: "owner" },
  firedAt: "2026-10-04T05:00:00.000Z",
  tier: "member",
  timeZone: "Europe/Paris",
  today: "2026-10-04",
  tools: [{ server: "health", tool: "garmin-get-hrv" }],
  ...over,
});

describe("precheckScriptRunner", () => {
  test("describe lists the grant for the asker's tier and says can call no MCP server otherwise", async () => {
    const r = runner();
    const text = await r.describe({ channel: "discord:1", target: "dm:ada", tier: "member" });
    expect(text).toContain("- health: garmin-login, garmin-get-hrv");
    expect(text).toContain("`today` is the date in the host's time zone");
    expect(await r.describe({ channel: "discord:1", target: "dm:ada", tier: "guest" })).toContain("can call no MCP server");
    await r.dispose();
  });

  test("toolName answers synchronously; timeoutMs is present only when set", async () => {
    const plain = runner();
    expect(plain.toolName("health", "garmin-get-hrv")).toBe("garmin-get-hrv");
    expect("timeoutMs" in plain).toBe(false);
    const prefixed = runner({ prefixed: true, timeoutMs: 5000 });
    expect(prefixed.toolName("health", "garmin-get-hrv")).toBe("health_garmin-get-hrv");
    expect(prefixed.timeoutMs).toBe(5000);
    await plain.dispose();
    await prefixed.dispose();
  });

  test("run resolves with the script's result; grant sees the run's tier", async () => {
    const r = runner();
    expect(await r.run('answer:{"ok":true,"result":{"wake":false,"note":"normal"}}', context())).toEqual({
      wake: false,
      note: "normal",
    });
    expect(await r.run('answer:{"ok":true,"result":null}', context())).toBeUndefined();
    expect(JSON.parse((await r.run("seen", context())) as string)).toEqual({ channel: "discord:1", target: "dm:ada", tier: "member" });
    expect(await r.run("servers", context())).toEqual([{ name: "health", tools: ["garmin-get-hrv"] }]);
    // The run's broker is live: the approved call is accepted and forwarded;
    // its upstream (mcp.example.com) is out of reach here, hence 502.
    expect(await r.run("broker", context())).toBe("502");
    expect(readdirSync(roots.runRoot)).toEqual([]);
    await r.dispose();
  });

  test("run rejects with the script's error, cut to 1,000 characters", async () => {
    const r = runner();
    await expect(r.run(`answer:{"ok":false,"error":"${"x".repeat(1200)}"}`, context())).rejects.toThrow("x".repeat(1000));
    await expect(r.run("answer:not json", context())).rejects.toThrow("the precheck worker answered nothing it could read");
    await expect(r.run("x".repeat(70_000), context())).rejects.toThrow("precheck script too large");
    // each run counts like a sealed turn, with its mode (docs/operations.md 6)
    const text = await r.metrics();
    expect(text).toContain('\nsbx_turns_total{mode="precheck",reason="script_error"} 1\n');
    expect(text).toContain('\nsbx_turns_total{mode="precheck",reason="invalid_reply"} 1\n');
    await r.dispose();
  });

  test("an aborted signal rejects with its reason, at once or once the run has ended", async () => {
    const r = runner();
    const done = new AbortController();
    done.abort(new Error("host stopping"));
    await expect(r.run("hang", context({ signal: done.signal }))).rejects.toThrow("host stopping");
    const later = new AbortController();
    const reason = new Error("core deadline");
    setTimeout(() => later.abort(reason), 100);
    let caught: unknown;
    try {
      await r.run("hang", context({ signal: later.signal }));
    } catch (err) {
      caught = err;
    }
    expect(caught).toBe(reason);
    expect(readdirSync(roots.runRoot)).toEqual([]);
    await r.dispose();
  });

  test("the runner's own deadline rejects with precheck script timed out", async () => {
    const r = runner({ timeoutMs: 1000 });
    await expect(r.run("hang", context())).rejects.toThrow("precheck script timed out");
    await r.dispose();
  });

  test("construction errors are thrown with the runner's message", () => {
    expect(() => runner({ runRoot: "relative" })).toThrow("sandbox roots must be absolute dedicated directories");
    expect(() => precheckScriptRunner({ config: fixture("raises.conf.lua") })).toThrow();
    expect(() => precheckScriptRunner({ config: "" })).toThrow("precheckScriptRunner: config must be a Lua file path");
  });
});

function dockerReady(): string | null {
  if (process.platform !== "linux") return "not a Linux host";
  if (process.getuid?.() === 0) return "running as root (the runner refuses root)";
  const info = Bun.spawnSync(["docker", "image", "inspect", "pi-roundtable-sandbox:precheck"], { stdout: "pipe", stderr: "pipe" });
  if (info.exitCode !== 0) return "image pi-roundtable-sandbox:precheck is missing (make image)";
  const sdk = Bun.spawnSync(["test", "-d", join(import.meta.dir, "..", "..", "spec", "fixtures", "node_modules", "@modelcontextprotocol")]);
  if (sdk.exitCode !== 0) return "the MCP SDK fixture is not installed (make deps)";
  return null;
}

const notReady = dockerReady();
const REQUIRED = process.env.SANDBOX_DOCKER_TEST === "1";
if (notReady && !REQUIRED) console.log(`precheck.test.ts: skipping the example through Docker: ${notReady}`);

describe("examples/bun/precheck.ts", () => {
  test.skipIf(notReady !== null && !REQUIRED)(
    "wakes one turn and skips another through real containers and a real MCP server",
    async () => {
      expect(notReady).toBeNull();
      const example = join(import.meta.dir, "..", "..", "examples", "bun", "precheck.ts");
      const child = Bun.spawn([process.execPath, example], { stdout: "pipe", stderr: "pipe", env: { ...process.env } });
      const killer = setTimeout(() => child.kill(9), 120_000);
      const code = await child.exited;
      clearTimeout(killer);
      const out = await new Response(child.stdout).text();
      const err = await new Response(child.stderr).text();
      expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
      expect(out).toMatch(/precheck #1: wake the agent with "#1 \d{4}-\d\d-\d\d: HRV 22 is under 30"/);
      expect(out).toContain("precheck #2: skip the turn (note: HRV 22 is fine today)");
      expect(out).toContain("- health: garmin-login, garmin-get-hrv");
      expect(out).toContain("precheck: run root left empty: true");
    },
    150_000,
  );
});
