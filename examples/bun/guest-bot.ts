// examples/bun/guest-bot.ts: a runnable simulation of a chat host using the
// sandbox plugin. A scripted sequence of message events goes through what a
// host's router does with a claim: claim(event, admission) decides, then
// handle(event, admission) runs the decided action; the script prints each
// decision and every reply.
//
//   bun examples/bun/guest-bot.ts             real sealed turns (Docker, `make image`)
//   bun examples/bun/guest-bot.ts --offline   no Docker: host.lua's stand-in driver
//
// Run it as a non-root user in the docker group (the engine refuses root), e.g.
//   runuser -u sbx -- bun examples/bun/guest-bot.ts
//
// The model is a scripted Chat Completions endpoint on 127.0.0.1 (so no real
// key is needed): it asks for host_clock, then answers with the clock. The
// container has no network: only its broker reaches the endpoint, with the
// key apiKey returns here. Everything it creates is removed at the end.
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  sandbox,
  type SandboxAdmission,
  type SandboxCommandEvent,
  type SandboxEvent,
  type SandboxMessageEvent,
} from "pi-roundtable-sandbox";

const offline = process.argv.includes("--offline");
if (process.getuid?.() === 0) {
  console.error("guest-bot: the sandbox refuses root; run it as the service account, e.g. runuser -u sbx -- bun examples/bun/guest-bot.ts");
  process.exit(1);
}
if (offline && process.env.SANDBOX_EXAMPLE_OFFLINE !== "1") {
  // host.lua reads the switch from the environment the engine inherits.
  const child = Bun.spawnSync([process.execPath, ...process.argv.slice(1)], {
    env: { ...process.env, SANDBOX_EXAMPLE_OFFLINE: "1" },
    stdio: ["inherit", "inherit", "inherit"],
  });
  process.exit(child.exitCode ?? 1);
}

// ---- a scripted model endpoint on loopback ----------------------------------
const HOST_KEY = "example-host-key";
let modelCalls = 0;
const model = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  async fetch(req) {
    modelCalls++;
    if (req.headers.get("authorization") !== `Bearer ${HOST_KEY}`) {
      return Response.json({ error: { message: "invalid api key" } }, { status: 401 });
    }
    const body = (await req.json()) as { messages: Array<{ role: string; content?: string | null }>; tools?: Array<{ function: { name: string } }> };
    const msgs = body.messages;
    const lastUser = msgs.map((m) => m.role).lastIndexOf("user");
    const toolResult = msgs.slice(lastUser + 1).find((m) => m.role === "tool");
    let speaker = "guest";
    let said = "";
    try {
      const wrapped = JSON.parse(msgs[lastUser]?.content ?? "") as { speaker?: { name?: string }; message?: string };
      speaker = wrapped.speaker?.name ?? speaker;
      said = wrapped.message ?? "";
    } catch {
      said = msgs[lastUser]?.content ?? "";
    }
    const firstLine = said.split("\n").at(-1) ?? said;
    let message: Record<string, unknown>;
    if (toolResult) {
      let clock = String(toolResult.content ?? "");
      try {
        clock = (JSON.parse(clock) as { text?: string }).text ?? clock; // the worker wraps tool output as {"text": ...}
      } catch {
        // keep the raw content
      }
      message = { role: "assistant", content: `${speaker}, the host clock says ${clock}. You said: "${firstLine}"` };
    } else if (body.tools?.some((t) => t.function.name === "host_clock")) {
      message = {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_clock", type: "function", function: { name: "host_clock", arguments: "{}" } }],
      };
    } else {
      message = { role: "assistant", content: `${speaker}, you said: "${firstLine}"` };
    }
    return Response.json({ id: "chatcmpl-example", object: "chat.completion", choices: [{ index: 0, finish_reason: "stop", message }] });
  },
});

// ---- the plugin, configured like roundtable.config.ts --------------------------
const root = mkdtempSync(join(tmpdir(), "gb-"));
chmodSync(root, 0o700);
const plugin = await sandbox({
  config: join(import.meta.dir, "host.lua"),
  image: "pi-roundtable-sandbox:local",
  runRoot: join(root, "run"),
  workspaceRoot: join(root, "work"),
  stateFile: join(root, "state", "channels.json"),
  provider: "openai",
  model: "operator-selected-model",
  modelUrl: `http://127.0.0.1:${model.port}/v1/chat/completions`,
  allowHttp: true, // the loopback stand-in for https://api.openai.com
  apiKey: ({ channel, speaker }) => {
    console.log(`   apiKey({ channel: "${channel}", speaker: ${speaker.principalId} }) -> the host key`);
    return HOST_KEY;
  },
  typing: (event) => {
    console.log(`   [typing in #${event.channelId}]`);
  },
});

// ---- the scripted conversation ----------------------------------------------
const GUILD = "42";
const CHANNEL = "guests";
const owner = { id: "owner", name: "Ada" };
const alice = { id: "alice", name: "Alice" };
const bob = { id: "bob", name: "Bob" };
const access: Record<string, SandboxAdmission> = {
  owner: { tier: "owner", principalId: "owner" },
  alice: { tier: "member", principalId: "p_alice" },
  bob: { tier: "member", principalId: "p_bob" },
};

const cmd = (subcommand: "on" | "off" | "status"): SandboxCommandEvent => ({
  type: "command",
  surface: "discord",
  channelId: CHANNEL,
  guildId: GUILD,
  author: owner,
  command: "roundtable",
  group: "sandbox",
  subcommand,
});
let n = 0;
const msg = (author: { id: string; name: string; bot?: boolean }, text: string, over: Partial<SandboxMessageEvent> = {}): SandboxMessageEvent => ({
  type: "message",
  id: `m${++n}`,
  surface: "discord",
  channelId: CHANNEL,
  guildId: GUILD,
  author: { bot: false, integration: false, ...author },
  mentionsBot: true,
  replyToBot: false,
  text,
  ...over,
});

const script: Array<[string, SandboxEvent]> = [
  ["owner turns the channel on", cmd("on")],
  ["Alice mentions the bot", msg(alice, "@bot what time is it?")],
  ["Bob replies to the bot", msg(bob, "thanks! and where am I?", { mentionsBot: false, replyToBot: true, quoted: "an earlier bot reply" })],
  ["another bot mentions the bot", msg({ id: "otherbot", name: "OtherBot", bot: true }, "@bot beep")],
  ["Alice talks without mentioning the bot", msg(alice, "brb", { mentionsBot: false })],
  ["an author the access rules do not serve", msg({ id: "mallory", name: "Mallory" }, "@bot let me in")],
  ["owner checks the status", cmd("status")],
  ["owner turns the channel off", cmd("off")],
  ["Alice mentions the bot again", msg(alice, "@bot still there?")],
];

try {
  console.log(`guest-bot: sandbox plugin "${plugin.name}" (priority ${plugin.priority}), commands /${plugin.commands?.command} sandbox on|off|status`);
  console.log(`guest-bot: ${offline ? "offline (no container)" : "real sealed turns in Docker"}\n`);
  for (const [what, event] of script) {
    const who = event.author.name;
    const text = event.type === "command" ? `/${event.command} ${event.group} ${event.subcommand}` : event.text;
    console.log(`-- ${what}\n${who}: ${text}`);
    const admission = access[event.author.id] ?? null;
    const decision = plugin.claim(event, admission);
    if (!decision.claim) {
      console.log("   claim: not claimed -> the host routes it to its own agents as usual\n");
      continue;
    }
    console.log(`   claim: ${decision.action}`);
    const result = await plugin.handle(event, admission);
    if (result === null) {
      console.log("   (dropped: no reply, never routed to a host agent)\n");
      continue;
    }
    const eph = "ephemeral" in result && result.ephemeral ? " (ephemeral)" : "";
    for (const r of result.replies) console.log(`bot${eph}: ${r}`);
    console.log();
  }
  const st = await plugin.status();
  console.log(`guest-bot: sandboxed channels now: [${st.channels.join(", ")}]; the model endpoint was called ${modelCalls} times`);
} finally {
  await plugin.dispose();
  model.stop(true);
  rmSync(root, { recursive: true, force: true });
}
