// helpers.ts: shared pieces of the bridge's bun tests: private temporary
// roots (short enough for the broker socket budget), a fake Chat Completions
// endpoint on 127.0.0.1, and event builders in lua/sandbox/app.lua's shapes.
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { SandboxAdmission, SandboxCommandEvent, SandboxMessageEvent, SandboxOptions } from "../src/index.ts";

export const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));

/** An answered message as handle returns it with the default mentions = "neutral" (hardening.md 6). */
export const answered = (...replies: string[]) => ({ replies, allowedMentions: { parse: [] } });
export const fixture = (name: string) => join(FIXTURES, name);

export interface Roots {
  root: string;
  runRoot: string;
  workspaceRoot: string;
  stateFile: string;
  cleanup(): void;
}

/** A fresh 0700 directory with run/, work/ and state/channels.json paths under it. */
export function makeRoots(prefix = "sbb-"): Roots {
  const root = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(root, 0o700);
  return {
    root,
    runRoot: join(root, "run"),
    workspaceRoot: join(root, "work"),
    stateFile: join(root, "state", "channels.json"),
    cleanup: () => rmSync(root, { recursive: true, force: true }),
  };
}

export interface ModelCall {
  authorization: string | null;
  body: string;
}

export interface FakeModel {
  url: string;
  calls: ModelCall[];
  /** Milliseconds to wait before answering (stop tests). */
  delayMs: number;
  reply: string;
  stop(): void;
}

/** A non-streaming Chat Completions endpoint on 127.0.0.1 that records every call. */
export function fakeModel(reply = "Hello from the sealed worker."): FakeModel {
  const model: FakeModel = {
    url: "",
    calls: [],
    delayMs: 0,
    reply,
    stop: () => server.stop(true),
  };
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      const body = await req.text();
      model.calls.push({ authorization: req.headers.get("authorization"), body });
      if (model.delayMs > 0) await Bun.sleep(model.delayMs);
      return Response.json({
        id: "chatcmpl-fake",
        object: "chat.completion",
        choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: model.reply } }],
      });
    },
  });
  model.url = `http://127.0.0.1:${server.port}/v1/chat/completions`;
  return model;
}

/** sandbox() options for roots + a model endpoint (allowHttp for the loopback fake). */
export function baseOptions(roots: Roots, modelUrl = "http://127.0.0.1:9/v1/chat/completions"): SandboxOptions {
  return {
    image: "pi-roundtable-sandbox:local",
    runRoot: roots.runRoot,
    workspaceRoot: roots.workspaceRoot,
    stateFile: roots.stateFile,
    model: "fake-model",
    modelUrl,
    allowHttp: true,
    timeZone: "UTC",
  };
}

export const GUILD = "9001";

export function mention(channelId: string, text: string, over: Partial<SandboxMessageEvent> = {}): SandboxMessageEvent {
  return {
    type: "message",
    id: `m-${Math.random().toString(16).slice(2)}`,
    surface: "discord",
    channelId,
    guildId: GUILD,
    author: { id: "alice", name: "Alice", bot: false, integration: false },
    mentionsBot: true,
    replyToBot: false,
    text,
    ...over,
  };
}

export function command(channelId: string, subcommand: "on" | "off" | "status", over: Partial<SandboxCommandEvent> = {}): SandboxCommandEvent {
  return {
    type: "command",
    surface: "discord",
    channelId,
    guildId: GUILD,
    author: { id: "owner", name: "Ada" },
    command: "roundtable",
    group: "sandbox",
    subcommand,
    ...over,
  };
}

export const MEMBER: SandboxAdmission = { tier: "member", principalId: "p_alice" };
export const OWNER: SandboxAdmission = { tier: "owner", principalId: "owner" };

/** Waits until pred() holds (polling), or throws after timeoutMs. */
export async function until(pred: () => boolean | Promise<boolean>, timeoutMs = 10000, what = "condition"): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(10);
  }
}
