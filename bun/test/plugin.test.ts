// plugin.test.ts: the guest plugin through the real engine (libsbx.so, the
// Lua app, runtime, broker and channel store) with a fake container driver
// defined in a Lua config (test/fixtures/fake-driver.conf.lua), so no Docker
// is needed: claim, handle, commands, services, apiKey from TypeScript,
// concurrent turns, stop while a turn runs, dispose.
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { sandbox, type SandboxCredentialScope, type SandboxOptions, type SandboxPlugin } from "../src/index.ts";
import {
  baseOptions,
  command,
  fakeModel,
  fixture,
  makeRoots,
  MEMBER,
  mention,
  OWNER,
  type FakeModel,
  type Roots,
  until,
  answered,
} from "./helpers.ts";

const ENABLED = "Sandbox routing is enabled. Mention the bot or reply to it to start a sealed turn.";
const DISABLED = "Sandbox routing is disabled. Memory is retained; normal host routing applies again.";

let roots: Roots;
let model: FakeModel;
let plugin: SandboxPlugin | null = null;
let scopes: SandboxCredentialScope[] = [];

async function start(over: Partial<SandboxOptions> = {}): Promise<SandboxPlugin> {
  plugin = await sandbox({
    ...baseOptions(roots, model.url),
    config: fixture("fake-driver.conf.lua"),
    initialChannels: ["discord:100", "discord:200"],
    apiKey: (scope) => {
      scopes.push(scope);
      return `key-for-${scope.channel}`;
    },
    ...over,
  });
  return plugin;
}

beforeEach(() => {
  roots = makeRoots();
  model = fakeModel("Hello from the fake model.");
  scopes = [];
});

afterEach(async () => {
  await plugin?.dispose();
  plugin = null;
  model.stop();
  roots.cleanup();
});

describe("the claim", () => {
  test("answers an admitted mention in a sandbox channel, priority 200", async () => {
    const p = await start();
    expect(p.name).toBe("sandbox");
    expect(p.priority).toBe(200);
    expect(p.claim(mention("100", "hi"), MEMBER)).toEqual({ claim: true, priority: 200, action: "answer" });
  });

  test("drops bots, integrations, direct messages, unaddressed and unresolved authors; never falls through", async () => {
    const p = await start();
    const drop = { claim: true, priority: 200, action: "drop" } as const;
    expect(p.claim(mention("100", "hi", { author: { id: "b", name: "B", bot: true } }), MEMBER)).toEqual(drop);
    expect(p.claim(mention("100", "hi", { webhookId: "w1" }), MEMBER)).toEqual(drop);
    expect(p.claim(mention("100", "hi", { guildId: null }), MEMBER)).toEqual(drop);
    expect(p.claim(mention("100", "hi", { mentionsBot: false }), MEMBER)).toEqual(drop);
    expect(p.claim(mention("100", "hi"), null)).toEqual(drop);
  });

  test("a reply to the bot is admitted; a channel that is not sandboxed is not claimed", async () => {
    const p = await start();
    expect(p.claim(mention("100", "hi", { mentionsBot: false, replyToBot: true }), MEMBER).action).toBe("answer");
    expect(p.claim(mention("999", "hi"), MEMBER)).toEqual({ claim: false, priority: 200 });
    expect(p.owns("discord:100")).toBe(true);
    expect(p.owns("discord:999")).toBe(false);
  });

  test("handle runs a sealed turn and returns the reply; typing starts and stops", async () => {
    const typing: string[] = [];
    const names: string[] = [];
    const p = await start({
      typing: (event) => {
        typing.push(`on:${event.channelId}`);
        return () => typing.push(`off:${event.channelId}`);
      },
      onEvent: (ev) => names.push(ev.name),
    });
    const result = await p.handle(mention("100", "hello there"), MEMBER);
    expect(result).toEqual(answered("Sealed: hello there"));
    expect(typing).toEqual(["on:100", "off:100"]);
    expect(names).toEqual(["claim", "typing", "typing"]);
  });

  test("a reply's mentions are made inert and carry allowedMentions { parse: [] } (hardening.md 6)", async () => {
    const p = await start();
    const zw = "\u200b";
    const result = await p.handle(mention("100", "@everyone <@42> <@&7> <#9> @here"), MEMBER);
    expect(result).toEqual(answered(`Sealed: @${zw}everyone <${zw}@42> <${zw}@&7> <${zw}#9> @${zw}here`));
    await plugin?.dispose();
    plugin = null;
    const allow = await start({ mentions: "allow" });
    expect(await allow.handle(mention("100", "@everyone"), MEMBER)).toEqual({ replies: ["Sealed: @everyone"] });
  });

  test("refuses a mentions option outside neutral | allow like sandbox{} does", async () => {
    await expect(start({ mentions: "loud" as never })).rejects.toThrow('mentions must be "neutral" or "allow"');
  });

  test("handle composes the quoted message and the attachments note", async () => {
    const p = await start();
    const result = await p.handle(mention("100", "what is this?", { quoted: "an old message", attachments: [{ id: "a1" }] }), MEMBER);
    expect(result).toEqual(
      answered("Sealed: Quoted message (untrusted): an old message\n\nwhat is this?\n[Attachments are not supported in this sandbox.]"),
    );
  });

  test("a dropped message and a message in another channel give null and run no turn", async () => {
    const p = await start();
    expect(await p.handle(mention("100", "hi", { author: { id: "b", name: "B", bot: true } }), MEMBER)).toBeNull();
    expect(await p.handle(mention("999", "hi"), MEMBER)).toBeNull();
    expect(await p.services.SANDBOX.runtime.busy()).toEqual([]);
  });

  test("background host turns are skipped in sandbox channels", async () => {
    const p = await start();
    expect(await p.background("discord:100")).toEqual({
      skipped: true,
      reason: "Background host turns are refused in sandbox channels.",
    });
    expect(await p.background("discord:999")).toBeNull();
  });
});

describe("owner commands", () => {
  test("the sandbox group definition follows rootCommand", async () => {
    const p = await start({ rootCommand: "rt" });
    expect(p.commands).toEqual({
      command: "rt",
      group: {
        name: "sandbox",
        description: "Manage this channel's sealed guest agent",
        subcommands: [
          { name: "on", description: "Route mentions and replies into a sealed container" },
          { name: "off", description: "Disable sandbox routing; keep channel memory" },
          { name: "status", description: "Show whether this channel is sandboxed" },
        ],
      },
    });
  });

  test("on, status and off reply with the state texts and persist the state file", async () => {
    const p = await start();
    expect(p.claim(command("300", "on"), OWNER)).toEqual({ claim: true, priority: 200, action: "command" });
    expect(await p.command(command("300", "on"), OWNER)).toEqual({ replies: [ENABLED], ephemeral: true });
    expect(p.owns("discord:300")).toBe(true);
    expect(JSON.parse(readFileSync(roots.stateFile, "utf8"))).toContain("discord:300");
    expect(await p.handle(command("300", "status"), OWNER)).toEqual({ replies: [ENABLED], ephemeral: true });
    expect(await p.command(command("300", "off"), OWNER)).toEqual({ replies: [DISABLED], ephemeral: true });
    expect(p.owns("discord:300")).toBe(false);
    expect(JSON.parse(readFileSync(roots.stateFile, "utf8"))).not.toContain("discord:300");
  });

  test("a non-owner is refused and outside a guild channel the owner is told why", async () => {
    const p = await start();
    const refused = await p.command(command("300", "on", { author: { id: "alice", name: "Alice" } }), MEMBER);
    expect(refused.ephemeral).toBe(true);
    expect(refused.replies).toEqual(["Only the bot owner can use this command."]);
    expect(p.owns("discord:300")).toBe(false);
    expect(await p.command(command("300", "on", { guildId: null }), OWNER)).toEqual({
      replies: ["Sandbox commands require a guild channel."],
      ephemeral: true,
    });
  });
});

describe("the SANDBOX service", () => {
  test("channels: has, list, enable, disable; errors carry the Lua message", async () => {
    const p = await start();
    const { channels } = p.services.SANDBOX;
    expect(p.services.SANDBOX.id).toBe("sandbox.channels");
    expect(await channels.list()).toEqual(["discord:100", "discord:200"]);
    await channels.enable("discord:300");
    expect(await channels.has("discord:300")).toBe(true);
    await channels.disable("discord:100");
    expect(await channels.list()).toEqual(["discord:200", "discord:300"]);
    await expect(channels.enable("bad")).rejects.toThrow(/^invalid sandbox channel/);
  });

  test("runtime: runTurn, busy, startFresh, sweep; a refused turn rejects with the Lua message", async () => {
    const p = await start();
    const { runtime } = p.services.SANDBOX;
    const speaker = { id: "alice", name: "Alice", principalId: "p_alice" };
    expect(await runtime.runTurn("discord:555", speaker, "direct")).toMatchObject({ ok: true, text: "Sealed: direct", reason: "ok" });
    await runtime.startFresh("discord:555");
    expect(await runtime.busy()).toEqual([]);
    expect(await runtime.sweep()).toBe(0);
    await expect(runtime.runTurn("discord:555", { ...speaker, principalId: "" }, "x")).rejects.toThrow(
      "a sandbox turn needs the principal its speaker was admitted as",
    );
    await expect(runtime.runTurn("discord:555", speaker, "x".repeat(32001))).rejects.toThrow(/^sandbox message too large$/);
    expect(await p.startFresh("discord:100")).toBe("sandbox");
  });

  test("host tools from the Lua config and an MCP allow-list from TypeScript are offered to the turn", async () => {
    const p = await start({
      mcp: [
        {
          name: "docs",
          url: "http://127.0.0.1:9/rpc",
          tools: [{ name: "search", description: "Search the docs", parameters: { type: "object" } }],
        },
      ],
    });
    const r = await p.services.SANDBOX.runtime.runTurn("discord:100", { id: "a", name: "A", principalId: "p" }, "offered");
    expect(r).toMatchObject({ ok: true, text: "host:clock mcp:docs/search", reason: "ok" });
  });

  test("the lifecycle entry", async () => {
    const p = await start();
    expect(p.services.lifecycle.name).toBe("sandbox-runtime");
    expect(await p.services.lifecycle.busy()).toEqual([]);
  });

  test("status", async () => {
    const p = await start();
    const st = await p.status();
    expect(st.started).toBe(true);
    expect(st.disposed).toBe(false);
    expect(st.channels).toEqual(["discord:100", "discord:200"]);
    expect(st.engine.abi).toBe(1);
  });
});

describe("apiKey from TypeScript", () => {
  test("is called on the JS thread with {channel, speaker} before the model call; only the broker's upstream call carries it", async () => {
    const p = await start();
    const result = await p.handle(mention("100", "ask the model"), MEMBER);
    expect(result).toEqual(answered("Hello from the fake model."));
    expect(scopes).toEqual([{ channel: "discord:100", speaker: { id: "alice", name: "Alice", principalId: "p_alice" } }]);
    expect(model.calls.length).toBe(1);
    expect(model.calls[0]!.authorization).toBe("Bearer key-for-discord:100");
    expect(JSON.parse(model.calls[0]!.body).model).toBe("fake-model");
  });

  test("an async key works; undefined, empty, a throw or a rejection fail closed (no upstream call)", async () => {
    const answers: Array<() => unknown> = [
      async () => "async-key",
      () => undefined,
      () => "",
      () => {
        throw new Error("no key");
      },
      () => Promise.reject(new Error("no key")),
      () => 42,
    ];
    let next = 0;
    const p = await start({ apiKey: () => answers[next++]!() as string });
    const { runtime } = p.services.SANDBOX;
    const speaker = { id: "alice", name: "Alice", principalId: "p_alice" };
    expect(await runtime.runTurn("discord:100", speaker, "model")).toMatchObject({ ok: true, text: "Hello from the fake model." });
    expect(model.calls.map((c) => c.authorization)).toEqual(["Bearer async-key"]);
    for (let i = 1; i < answers.length; i++) {
      const r = await runtime.runTurn("discord:100", speaker, "model");
      expect(r.ok).toBe(false);
      expect(r.text).toBe("model call failed: 502");
    }
    expect(next).toBe(answers.length);
    expect(model.calls.length).toBe(1);
  });

  test("hostLogin answers for the provider when no apiKey is set", async () => {
    const providers: string[] = [];
    const p = await start({
      apiKey: undefined,
      provider: "openai",
      hostLogin: (provider) => {
        providers.push(provider);
        return "login-key";
      },
    });
    const r = await p.services.SANDBOX.runtime.runTurn("discord:100", { id: "a", name: "A", principalId: "p" }, "model");
    expect(r).toMatchObject({ ok: true, text: "Hello from the fake model.", reason: "ok" });
    expect(providers).toEqual(["openai"]);
    expect(model.calls[0]!.authorization).toBe("Bearer login-key");
  });
});

describe("turns", () => {
  test("two channels run concurrently; the same channel's messages queue in order", async () => {
    const p = await start();
    const a = p.handle(mention("100", "slow a"), MEMBER);
    const b = p.handle(mention("200", "slow b"), MEMBER);
    await until(async () => (await p.services.SANDBOX.runtime.busy()).length === 2, 5000, "both channels busy");
    expect(await p.services.SANDBOX.runtime.busy()).toEqual(["discord:100", "discord:200"]);
    const a2 = p.handle(mention("100", "slow a2"), MEMBER);
    expect(await Promise.all([a, b, a2])).toEqual([
      answered("Sealed: slow a"),
      answered("Sealed: slow b"),
      answered("Sealed: slow a2"),
    ]);
    expect(await p.services.SANDBOX.runtime.busy()).toEqual([]);
  });

  test("stop while a turn runs ends it: the guest sees the failure text, the channel is free", async () => {
    const p = await start();
    expect(await p.stop("discord:100")).toBe(false);
    const running = p.handle(mention("100", "wait for me"), MEMBER);
    await until(async () => (await p.services.SANDBOX.runtime.busy()).includes("discord:100"), 5000, "the turn");
    expect(await p.stop("discord:100")).toBe(true);
    expect(await running).toEqual(answered("The sandbox turn failed."));
    expect(await p.services.SANDBOX.runtime.busy()).toEqual([]);
    expect(await p.handle(mention("100", "again"), MEMBER)).toEqual(answered("Sealed: again"));
  });

  test("dispose while a turn runs ends it; dispose is idempotent; afterwards every call fails", async () => {
    const p = await start();
    const running = p.handle(mention("100", "wait"), MEMBER);
    await until(async () => (await p.services.SANDBOX.runtime.busy()).includes("discord:100"), 5000, "the turn");
    await Promise.all([p.dispose(), p.dispose()]);
    expect(p.disposed).toBe(true);
    const settled = await running.then(
      (v) => ({ value: v }),
      (e: Error) => ({ error: e.message }),
    );
    expect(settled).toEqual({ value: answered("The sandbox turn failed.") });
    expect(() => p.claim(mention("100", "hi"), MEMBER)).toThrow("sandbox is disposed");
    await expect(p.handle(mention("100", "hi"), MEMBER)).rejects.toThrow("sandbox is disposed");
    await expect(p.services.SANDBOX.channels.list()).rejects.toThrow("sandbox is disposed");
    await p.dispose();
    plugin = null;
  });

  test("after dispose the same roots can be owned by a new plugin", async () => {
    const p = await start();
    await p.dispose();
    const q = await start();
    expect(await q.services.SANDBOX.channels.list()).toEqual(["discord:100", "discord:200"]);
  });
});
