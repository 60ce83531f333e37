// rich.test.ts: PiSandboxRuntime through the bridge (rich mode,
// shared/spec/rich-mode.md): the runtime in the utility engine, its option
// checks with the Lua messages, and whole turns whose callbacks (oauthToken,
// effort.judge, memory.promptBlock, tools.call, fetchImpl, logger and an
// offline driver) are this test's JavaScript functions. The "container"
// behind the driver is a small worker loop speaking section 10 over the
// turn's real broker socket; real Docker runs in spec/docker/.
import { afterAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { disposeUtilityEngine, PiSandboxRuntime, type PiContainerSpec, type PiSandboxRuntimeOptions } from "../src/index.ts";

const dirs: string[] = [];
afterAll(() => {
  disposeUtilityEngine();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function party(): string {
  const d = mkdtempSync(join(tmpdir(), "rich-bun-"));
  chmodSync(d, 0o700);
  dirs.push(d);
  return join(d, "p");
}

async function call(sock: string, method: string, path: string, body?: unknown, timeoutMs = 60_000) {
  const res = await fetch(`http://localhost${path}`, {
    method, unix: sock, body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  } as RequestInit);
  return { status: res.status, text: await res.text(), headers: res.headers };
}

type TurnJson = { turnId: string; author: { id: string; name: string; principalId?: string }; text: string; memory: string; thinking: string };

/** A worker loop on sock: ready, next, run, result; until stopped. */
function workerLoop(sock: string, onTurn: (t: TurnJson) => Promise<unknown>) {
  let stopped = false;
  const turns: TurnJson[] = [];
  (async () => {
    while (!stopped) {
      try {
        if ((await call(sock, "POST", "/worker/ready", {})).status !== 200) { await Bun.sleep(50); continue; }
        const next = await call(sock, "GET", "/worker/next");
        if (next.status !== 200) continue;
        const t = JSON.parse(next.text) as TurnJson;
        turns.push(t);
        const result = await onTurn(t);
        await call(sock, "POST", "/worker/result", { turnId: t.turnId, result });
      } catch {
        await Bun.sleep(50);
      }
    }
  })();
  return { turns, stop: () => { stopped = true; } };
}

function fixtureDriver(onTurn: (t: TurnJson, sock: string) => Promise<unknown>) {
  const running = new Map<string, { spec: PiContainerSpec; loop: ReturnType<typeof workerLoop> }>();
  const calls: string[] = [];
  return {
    calls,
    running,
    driver: {
      ensureRunning(spec: PiContainerSpec) {
        calls.push(`ensureRunning ${spec.name}`);
        if (running.has(spec.name)) return;
        const sock = join(spec.runDir, "broker.sock");
        running.set(spec.name, { spec, loop: workerLoop(sock, (t) => onTurn(t, sock)) });
      },
      status(name: string) {
        const r = running.get(name);
        return r ? { state: "running" as const, image: r.spec.image, profile: r.spec.profile } : { state: "missing" as const };
      },
      remove(name: string) {
        calls.push(`remove ${name}`);
        running.get(name)?.loop.stop();
        running.delete(name);
      },
      logs(name: string) {
        calls.push(`logs ${name}`);
        return "worker log line\n";
      },
    },
  };
}

function options(over: Partial<PiSandboxRuntimeOptions> = {}): PiSandboxRuntimeOptions {
  return {
    partyDir: party(),
    image: "pi-roundtable-sandbox:pi",
    profiles: { main: { model: "claude-sonnet-4-6" } },
    oauthToken: () => "host-token",
    effort: { judge: () => "medium" },
    ...over,
  };
}

describe("PiSandboxRuntime options", () => {
  test("each refused option throws the Lua message, in the page's order", () => {
    const cases: [Partial<PiSandboxRuntimeOptions>, string][] = [
      [{ partyDir: "relative" }, "Dedicated absolute state directory required"],
      [{ containerPrefix: "Bad" }, "Invalid container prefix"],
      [{ turnTimeoutMs: 999 }, "Invalid runtime deadline"],
      [{ upstream: "http://api.anthropic.com" }, "Invalid trusted endpoint"],
      [{ maxCalls: 0 }, "Invalid broker budget"],
      [{ maxOutputTokens: 1024 }, "Invalid output-token budget"],
      [{ timeZone: "Nowhere/City" }, "Invalid time zone"],
      [{ oauthToken: undefined }, "Invalid Pi sandbox option: oauthToken"],
      // a name outside the one declaration (lua/sandbox/rich/_option_table.lua, generated)
      [{ partydir: "/tmp/x" } as never, "Invalid Pi sandbox option: partydir"],
    ];
    for (const [over, message] of cases) {
      expect(() => new PiSandboxRuntime({ ...options(), driver: fixtureDriver(async () => ({})).driver, ...over } as PiSandboxRuntimeOptions)).toThrow(message);
    }
  });
});

describe("PiSandboxRuntime turns", () => {
  test("a turn calls back the host's functions, binds the speaker for tools, and returns reply files as bytes", async () => {
    const judged: unknown[] = [];
    const toolCtx: unknown[] = [];
    const lines: string[] = [];
    const fetched: string[] = [];
    const fx = fixtureDriver(async (t, sock) => {
      const tool = await call(sock, "POST", "/tools/whoami", { input: { q: 1 }, speaker: { id: "owner" } });
      const model = await call(sock, "POST", "/anthropic/v1/messages", { messages: [{ role: "user", content: t.text }] });
      return { ok: true, text: `${tool.text} | ${model.status} ${model.text}`, files: [{ name: "note.txt", data: Buffer.from("bytes!").toString("base64") }] };
    });
    const rt = new PiSandboxRuntime(options({
      driver: fx.driver,
      effort: { judge: (text, ctx) => { judged.push([text, ctx.level ?? null]); return "high"; } },
      memory: { visibility: "shared", promptBlock: async (channel, id) => `memory of ${id} in ${channel}` },
      tools: { names: ["whoami"], call: async (name, input, ctx) => { toolCtx.push({ name, input, speaker: ctx.speaker, channel: ctx.channel, aborted: ctx.signal.aborted }); return { ok: true, text: `you are ${ctx.speaker.principalId}`, extra: "dropped" } as never; } },
      fetchImpl: async (req) => { fetched.push(`${req.url} ${req.headers.authorization}`); return { status: 200, headers: { "content-type": "application/json" }, body: '{"type":"message","content":[]}' }; },
      logger: { info: (m) => lines.push(m), warn: (m) => lines.push(m), error: (m) => lines.push(m) },
    }));
    const r = await rt.runTurn({ channel: "discord:party", profile: "main", turnId: "t1", author: { id: "123", name: "Ann", principalId: "ann" }, text: "hello" });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.text).toBe('{"ok":true,"text":"you are ann"} | 200 {"type":"message","content":[]}');
    expect(r.files.length).toBe(1);
    expect(r.files[0]!.name).toBe("note.txt");
    expect(new TextDecoder().decode(r.files[0]!.data)).toBe("bytes!");
    expect(judged).toEqual([["hello", null]]);
    expect(toolCtx).toEqual([{ name: "whoami", input: { q: 1 }, speaker: { id: "123", name: "Ann", principalId: "ann" }, channel: "discord:party", aborted: false }]);
    expect(fetched).toEqual(["https://api.anthropic.com/v1/messages Bearer host-token"]);
    const seen = [...fx.running.values()][0]!.loop.turns[0]!;
    expect(seen.memory).toBe("memory of 123 in discord:party");
    expect(seen.thinking).toBe("high");
    expect(await rt.sessionsDir("discord:party")).toMatch(/\/discord_party\/workspace\/sessions$/);
    expect((await rt.status("discord:party")).state).toBe("running");
    await rt.stop("discord:party");
    expect(fx.calls).toContain("remove roundtable-sandbox-discord_party");
    await rt.dispose();
  }, 60_000);

  test("aborting a turn's signal cancels it and removes the container after reading its log", async () => {
    let release: () => void = () => {};
    const fx = fixtureDriver(() => new Promise((resolve) => { release = () => resolve({ ok: true, text: "late", files: [] }); }));
    const lines: [string, Record<string, unknown>][] = [];
    const rt = new PiSandboxRuntime(options({ driver: fx.driver, logger: { info: () => {}, warn: (m, f) => lines.push([m, f]), error: (m, f) => lines.push([m, f]) } }));
    const ac = new AbortController();
    const pending = rt.runTurn({ channel: "discord:abort", profile: "main", turnId: "t1", author: { id: "1", name: "Bo" }, text: "wait", signal: ac.signal });
    while (![...fx.running.values()].some((r) => r.loop.turns.length > 0)) await Bun.sleep(20);
    ac.abort("user left");
    const r = await pending;
    release();
    expect(r).toEqual({ ok: false, error: "Sandbox turn failed: Turn cancelled", cause: "Turn cancelled" });
    expect(fx.calls.slice(-2)).toEqual(["logs roundtable-sandbox-discord_abort", "remove roundtable-sandbox-discord_abort"]);
    const failed = lines.find(([m]) => m === "sandbox turn failed");
    expect(failed?.[1]).toMatchObject({ channel: "discord:abort", turn: "t1", timedOut: false, cancelled: true });
    // one turn record like a sealed turn's: its line and its counter (docs/operations.md 3, 6)
    const finished = lines.find(([m]) => m === "turn finished");
    expect(finished?.[1]).toMatchObject({ channel: "discord:abort", turn: "t1", reason: "stopped" });
    const metrics = await rt.metrics();
    expect(metrics).toContain('\nsbx_turns_total{mode="rich",reason="stopped"} 1\n');
    expect(metrics).toContain('\nsbx_turns_total{mode="rich",reason="ok"} 0\n');
    await rt.dispose();
  }, 60_000);

  test("a Lua config script can build the runtime instead", async () => {
    const dir = party();
    const conf = join(dir + "-conf.lua");
    writeFileSync(conf, `
      local rich = require("sandbox").rich
      local o = ...
      return rich { partyDir = o.partyDir, image = "img:1", profiles = { main = { model = "m" } },
        oauthToken = function() return "t" end, effort = { judge = function() return "low" end },
        driver = { ensureRunning = function() end, remove = function() end, status = function() return { state = "missing" } end } }
    `);
    const rt = new PiSandboxRuntime({ config: conf, options: { partyDir: dir } });
    expect(await rt.sessionsDir("discord:x")).toBe(`${dir}/discord_x/workspace/sessions`);
    await rt.dispose();
    writeFileSync(conf, "return {}");
    expect(() => new PiSandboxRuntime({ config: conf })).toThrow("must return sandbox.rich");
  });
});
