// harness.mjs: starts the rich worker (worker/pi/pi-main.js) as a real bun
// process outside a container, against the scripted broker peer
// (spec/fixtures/rich_broker_peer.mjs) and the Anthropic-shaped upstream
// (spec/fixtures/anthropic_sse_upstream.mjs). Each worker gets a fresh
// temporary directory holding its socket, workspace, HOME and Pi agent dir, a
// free loopback port for its forwarder, and a content module written by the
// spec. stop() kills the worker (SIGKILL) and removes the directory.
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, realpathSync } from "node:fs";
import { join, resolve } from "node:path";
import { tmpdir } from "node:os";
import { startPeer } from "../fixtures/rich_broker_peer.mjs";
import { startAnthropicUpstream } from "../fixtures/anthropic_sse_upstream.mjs";

export const ROOT = resolve(import.meta.dir, "..", "..");
export const MAIN = join(ROOT, "worker", "pi", "pi-main.js");

export function freePort() {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
  const port = s.port;
  s.stop(true);
  return port;
}

export const DEFAULT_CONTENT = `
export function workerContent(profile) {
  return { model: { provider: "claude-bridge", id: "claude-sonnet-4-6" }, prompt: "You are the spec persona for " + profile + "." };
}
`;

// startWorker({content, script, tools, servers, config, peerOptions, env, dir, wrap})
// dir: reuse an earlier worker's directory (its workspace and content), as a
// restarted container does. wrap: a command prefix the worker runs under
// (e.g. ["unshare", "--user", "--map-root-user", "--mount"], which execs it).
export async function startWorker(opts = {}) {
  const dir = opts.dir ?? realpathSync(mkdtempSync(join(tmpdir(), "rich-worker-")));
  const ws = join(dir, "workspace");
  for (const d of ["run", "workspace/attachments", "workspace/sessions", "home", "tmp"]) mkdirSync(join(dir, d), { recursive: true, mode: 0o700 });
  const contentPath = join(dir, "content.mjs");
  if (!opts.dir || opts.content) writeFileSync(contentPath, opts.content ?? DEFAULT_CONTENT);
  if (opts.files) for (const [p, body] of Object.entries(opts.files)) { mkdirSync(join(dir, p, ".."), { recursive: true }); writeFileSync(join(dir, p), body); }
  const upstream = opts.upstream ?? await startAnthropicUpstream({ script: opts.script ?? [] });
  const socketPath = join(dir, "run", "broker.sock");
  const peer = await startPeer({ socketPath, upstream: upstream.url, tools: opts.tools, servers: opts.servers, config: opts.config, ...(opts.peerOptions ?? {}) });
  const port = freePort();
  const lines = [];
  const env = {
    PATH: process.env.PATH,
    SANDBOX_PROFILE: opts.profile ?? "spec",
    TZ: "UTC",
    ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}/anthropic`,
    CLAUDE_CODE_OAUTH_TOKEN: "sandbox-dummy-token",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    SANDBOX_CONTENT: contentPath,
    HOME: join(dir, "home"),
    PI_CODING_AGENT_DIR: join(dir, "tmp", "pi-agent"),
    CLAUDE_CONFIG_DIR: join(ws, "claude"),
    SANDBOX_WORKSPACE: ws,
    SANDBOX_BROKER_SOCKET: socketPath,
    ...(opts.env ?? {}),
  };
  const proc = Bun.spawn([...(opts.wrap ?? []), "bun", MAIN], { env, stdout: "pipe", stderr: "pipe", cwd: dir });
  const exited = proc.exited;
  (async () => {
    const dec = new TextDecoder();
    let buf = "";
    for await (const chunk of proc.stdout) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf("\n")) >= 0) { lines.push(buf.slice(0, i)); buf = buf.slice(i + 1); }
    }
  })();
  const stderr = new Response(proc.stderr).text();
  const logs = () => lines.map((l) => { try { return JSON.parse(l); } catch { return { raw: l }; } });
  const waitLog = async (msg, timeoutMs = 60_000) => {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const hit = logs().find((l) => l.msg === msg);
      if (hit) return hit;
      if (Date.now() > end) throw new Error(`no log line "${msg}" within ${timeoutMs} ms; lines: ${lines.join("\n")}`);
      await Bun.sleep(50);
    }
  };
  return {
    dir, ws, port, peer, upstream, proc, exited, logs, waitLog, stderr, env,
    // kill(): the worker and its peer go, the directory stays (a restart).
    async kill() {
      proc.kill("SIGKILL");
      await exited;
      peer.stop();
    },
    async stop() {
      await this.kill();
      if (!opts.upstream) upstream.stop();
      if (!opts.dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

// until(pred, what): polls pred every 50 ms for up to 30 s (no timing assertion:
// only a bound on how long a spec waits for something that must happen).
export async function until(pred, what = "condition") {
  const end = Date.now() + 30_000;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`gave up waiting for ${what}`);
    await Bun.sleep(50);
  }
}

export const turn = (over = {}) => ({
  turnId: "t1", author: { id: "123", name: "Ann", principalId: "ann" }, text: "hi",
  memory: "", memoryVisibility: "private", images: [], thinking: "low", ...over,
});
