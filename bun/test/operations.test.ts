// operations.test.ts: the operator's view through the Bun bridge
// (spec/operations.md 1-3, providers.md 1): the provider options by their
// sandbox{} names, the `logger` option receiving the engine's lines as
// (message, fields), logLevel, the audit lines, and a turn's failure reason
// in runTurn's result, all through the real engine with the fake driver of
// test/fixtures/fake-driver.conf.lua and a loopback model server.
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { sandbox, type SandboxOptions, type SandboxPlugin } from "../src/index.ts";
import { answered, baseOptions, fixture, makeRoots, type Roots } from "./helpers.ts";

type Line = { level: string; message: string; fields: Record<string, unknown> };

let roots: Roots;
let plugin: SandboxPlugin | null = null;
let lines: Line[] = [];
let server: ReturnType<typeof Bun.serve> | null = null;
let calls: Array<{ headers: Headers; body: string }> = [];
let answer: () => Response = () => Response.json({ choices: [{ index: 0, message: { role: "assistant", content: "Hi." } }] });

const logger = {
  debug: (message: string, fields: Record<string, unknown>) => lines.push({ level: "debug", message, fields }),
  info: (message: string, fields: Record<string, unknown>) => lines.push({ level: "info", message, fields }),
  warn: (message: string, fields: Record<string, unknown>) => lines.push({ level: "warn", message, fields }),
  error: (message: string, fields: Record<string, unknown>) => lines.push({ level: "error", message, fields }),
};
const SPEAKER = { id: "alice", name: "Alice", principalId: "p_alice" };
const KEY = "bun-ops-key-5Tq";

function modelUrl(): string {
  return `http://127.0.0.1:${server!.port}/v1/chat/completions`;
}

async function start(over: Partial<SandboxOptions> = {}): Promise<SandboxPlugin> {
  plugin = await sandbox({
    ...baseOptions(roots, modelUrl()),
    config: fixture("fake-driver.conf.lua"),
    initialChannels: ["discord:100"],
    apiKey: () => KEY,
    logger,
    ...over,
  });
  return plugin;
}

beforeEach(() => {
  roots = makeRoots();
  lines = [];
  calls = [];
  answer = () => Response.json({ choices: [{ index: 0, message: { role: "assistant", content: "Hi." } }] });
  server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      calls.push({ headers: req.headers, body: await req.text() });
      return answer();
    },
  });
});

afterEach(async () => {
  await plugin?.dispose();
  plugin = null;
  server?.stop(true);
  roots.cleanup();
});

describe("the provider options (providers.md 1)", () => {
  test("modelAuth api-key, maxOutputTokens and outputTokensField reach the forced request", async () => {
    const p = await start({ modelAuth: "api-key", maxOutputTokens: 9000, outputTokensField: "max_completion_tokens" });
    const r = await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    expect(r).toMatchObject({ ok: true, text: "Hi.", reason: "ok" });
    expect(calls[0]!.headers.get("api-key")).toBe(KEY);
    expect(calls[0]!.headers.get("authorization")).toBeNull();
    const body = JSON.parse(calls[0]!.body);
    expect(body.max_completion_tokens).toBe(9000);
    expect(body.max_tokens).toBeUndefined();
  });

  test("modelAuth none sends no credential and refuses an apiKey", async () => {
    const p = await start({ modelAuth: "none", apiKey: undefined });
    await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    expect(calls[0]!.headers.get("authorization")).toBeNull();
    expect(calls[0]!.headers.get("api-key")).toBeNull();
    await p.dispose();
    plugin = null;
    await expect(start({ modelAuth: "none" })).rejects.toThrow('apiKey is unused when modelAuth is "none"');
  });

  test("refuses bad values with sandbox{}'s strings", async () => {
    await expect(start({ modelAuth: "basic" as never })).rejects.toThrow('modelAuth must be "bearer", "api-key" or "none"');
    await expect(start({ maxOutputTokens: 200001 })).rejects.toThrow("maxOutputTokens must be 1 to 200000");
    await expect(start({ outputTokensField: "max_output_tokens" as never })).rejects.toThrow(
      'outputTokensField must be "max_tokens" or "max_completion_tokens"',
    );
    await expect(start({ logFormat: "xml" as never })).rejects.toThrow('logFormat must be "text" or "json"');
    await expect(start({ logLevel: "trace" as never })).rejects.toThrow('logLevel must be "debug", "info", "warn" or "error"');
    await expect(start({ audit: "yes" as never })).rejects.toThrow("audit must be a boolean");
    await expect(start({ logger: { info: () => {} } as never })).rejects.toThrow(
      "logger must be a table of functions {debug?, info, warn, error}",
    );
  });
});

describe("the logger option (operations.md 2-3)", () => {
  test("gets every line as (message, fields): the audit line and the turn line, channel and turn on each", async () => {
    const p = await start();
    const r = await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    const call = lines.find((l) => l.message === "broker call");
    expect(call).toMatchObject({ level: "info", fields: { channel: "discord:100", route: "/model", status: 200 } });
    const done = lines.find((l) => l.message === "turn finished");
    expect(done).toMatchObject({ level: "info", fields: { channel: "discord:100", reason: "ok", turn: r.turn } });
    expect(typeof done!.fields.ms).toBe("number");
    expect(lines.some((l) => l.level === "debug")).toBe(false);
    for (const l of lines) expect(JSON.stringify(l)).not.toContain(KEY);
  });

  test("logLevel debug adds `turn started`; audit false drops the audit lines", async () => {
    const p = await start({ logLevel: "debug", audit: false });
    await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    expect(lines.find((l) => l.message === "turn started")).toMatchObject({ level: "debug", fields: { channel: "discord:100" } });
    expect(lines.some((l) => l.message === "broker call")).toBe(false);
  });
});

describe("a turn's failure reason (operations.md 1)", () => {
  test("runTurn carries the reason, the provider's status and tokens, and the fix; the guest text stays generic", async () => {
    answer = () => Response.json({ error: { message: `bad key ${KEY}`, type: "invalid_request_error", code: "invalid_api_key" } }, { status: 401 });
    const p = await start();
    const r = await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    expect(r).toMatchObject({
      ok: false, reason: "upstream_status", route: "/model", status: 401, code: "invalid_api_key",
      type: "invalid_request_error", fix: "check the credential apiKey returns for this channel",
      guest: "The sandbox turn failed.",
    });
    const done = lines.find((l) => l.message === "turn finished");
    expect(done).toMatchObject({ level: "warn", fields: { reason: "upstream_status", status: 401, code: "invalid_api_key" } });
    expect(lines.find((l) => l.message === "model call refused upstream")).toBeDefined();
    for (const l of lines) expect(JSON.stringify(l)).not.toContain("bad key");
    const handled = await p.handle(
      { type: "message", channelId: "100", guildId: "9001", author: { id: "alice", name: "Alice" }, mentionsBot: true, text: "model" },
      { tier: "member", principalId: "p_alice" },
    );
    expect(handled).toEqual(answered("The sandbox turn failed."));
  });
});

describe("the metrics (operations.md 4)", () => {
  test("plugin.metrics() is the text exposition the turns moved", async () => {
    const p = await start();
    const before = await p.metrics();
    expect(before).toContain("# TYPE sbx_turns_total counter\n");
    expect(before).toContain('\nsbx_turns_total{reason="ok"} 0\n');
    await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    answer = () => Response.json({ error: { message: "no", type: "invalid_request_error", code: "invalid_api_key" } }, { status: 401 });
    await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    const after = await p.metrics();
    expect(after).toContain('\nsbx_turns_total{reason="ok"} 1\n');
    expect(after).toContain('\nsbx_turns_total{reason="upstream_status"} 1\n');
    expect(after).toContain('\nsbx_broker_requests_total{route_kind="model",status="200"} 1\n');
    expect(after).toContain('\nsbx_upstream_responses_total{route_kind="model",status="401"} 1\n');
    expect(after).toContain("\nsbx_turn_duration_seconds_count 2\n");
    expect(after).not.toContain(KEY);
    expect(after).not.toContain("discord:100");
  });

  test("metricsListen serves GET /metrics on loopback and refuses anything else at start", async () => {
    const probe = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
    const port = probe.port;
    probe.stop(true);
    const p = await start({ metricsListen: `127.0.0.1:${port}` });
    await p.services.SANDBOX.runtime.runTurn("discord:100", SPEAKER, "model");
    const res = await fetch(`http://127.0.0.1:${port}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
    expect(await res.text()).toContain('\nsbx_turns_total{reason="ok"} 1\n');
    expect((await fetch(`http://127.0.0.1:${port}/other`)).status).toBe(404);
    await p.dispose();
    plugin = null;
    await expect(start({ metricsListen: "0.0.0.0:9464" })).rejects.toThrow("metricsListen must be a loopback address and port");
  });
});
