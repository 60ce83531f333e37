// rich_worker.test.mjs: the rich images against the real Docker daemon
// (spec/rich-mode.md 17.1, behaviours 129 and 130, worker side). Opt-in with
// SANDBOX_DOCKER_TEST=1, run as a non-root docker-group account (sbx), after
// `make image-pi`. The container gets the section 5.3 settings (network none,
// read-only root, 512 MiB /tmp tmpfs, 1,536 MiB memory = swap, one CPU, 256
// PIDs, nofile 256, CapDrop ALL, no-new-privileges, the seccomp profile worker/pi/seccomp.json, exactly the run/ and
// workspace/ binds, the 5.3 environment), the scripted broker peer listens on
// the bind-mounted socket and the Anthropic-shaped upstream serves the model.
// Containers are named roundtable-rich-test-<pid>-<n> and removed afterwards.
import { describe, test, expect, afterAll } from "bun:test";
import { mkdtempSync, mkdirSync, rmSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { tmpdir } from "node:os";
import { startPeer } from "../fixtures/rich_broker_peer.mjs";
import { startAnthropicUpstream, textReply } from "../fixtures/anthropic_sse_upstream.mjs";

const ON = process.env.SANDBOX_DOCKER_TEST === "1";
const IMAGE = process.env.PI_IMAGE || "pi-roundtable-sandbox:pi";
const DEPS = process.env.PI_DEPS_IMAGE || "pi-roundtable-sandbox:pi-deps";
const SECRET = "sk-ant-oat01-host-only-secret-value";
// The rich image's own seccomp allow-list (hardening.md 1; rich/docker.lua passes it to every container).
const SECCOMP = resolve(import.meta.dir, "..", "..", "worker", "pi", "seccomp.json");
const names = [];
let seq = 0;

function docker(...args) {
  const p = Bun.spawnSync(["docker", ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
}

// The create settings of section 5.3, as docker run flags.
function runArgs(name, dir, profile = "spec") {
  return [
    "run", "-d", "--name", name, "--user", `${process.getuid()}:${process.getgid()}`,
    "--network", "none", "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=512m,mode=1777",
    "--memory", "1536m", "--memory-swap", "1536m", "--cpus", "1", "--pids-limit", "256",
    "--ulimit", "nofile=256:256", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--security-opt", `seccomp=${SECCOMP}`, "--restart", "unless-stopped", "--pull", "never", "--log-driver", "local",
    "-v", `${dir}/run:/run/sandbox:ro`, "-v", `${dir}/workspace:/workspace`,
    "-e", `SANDBOX_PROFILE=${profile}`, "-e", "TZ=UTC", "-e", "ANTHROPIC_BASE_URL=http://127.0.0.1:8080/anthropic",
    "-e", "CLAUDE_CODE_OAUTH_TOKEN=sandbox-dummy-token", "-e", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
    "-e", "SANDBOX_CONTENT=/app/worker/content.ts", "-e", "HOME=/tmp/home", "-e", "PI_CODING_AGENT_DIR=/tmp/pi-agent",
    "-e", "CLAUDE_CONFIG_DIR=/workspace/claude", IMAGE,
  ];
}

function filesUnder(dir) {
  const out = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}

afterAll(() => { for (const n of names) docker("rm", "-f", n); });

describe.skipIf(!ON)("rich images on real Docker (17.1)", () => {
  test("both images are FROM scratch: bun, its libraries and node_modules, the worker and content, no shell or other runtime", () => {
    for (const t of [DEPS, IMAGE]) expect(docker("image", "inspect", t).code).toBe(0);
    const name = `roundtable-rich-test-${process.pid}-${++seq}`;
    names.push(name);
    expect(docker("create", "--name", name, IMAGE).code).toBe(0);
    const p = Bun.spawnSync(["sh", "-c", `docker export ${name} | tar -t`], { stdout: "pipe" });
    expect(p.exitCode).toBe(0);
    const paths = new Set(p.stdout.toString().split("\n").map((s) => s.replace(/\/$/, "")));
    for (const want of ["usr/local/bin/bun", "lib64/ld-linux-x86-64.so.2", "app/worker/pi-main.js", "app/worker/lib/session.js",
      "app/worker/content.ts", "app/persona", "app/assets", "app/shared",
      "app/node_modules/@earendil-works/pi-coding-agent/package.json", "app/node_modules/pi-claude-bridge/package.json",
      "app/node_modules/pi-mcp-adapter/package.json", "app/node_modules/typebox/package.json",
      "app/node_modules/@anthropic-ai/claude-agent-sdk-linux-x64/claude", "tmp", "workspace", "run/sandbox"]) {
      expect(paths.has(want)).toBe(true);
    }
    const list = [...paths];
    expect(list.filter((x) => /(^|\/)(sh|bash|dash|busybox|node|python3?|perl)$/.test(x) && !x.startsWith("app/node_modules/"))).toEqual([]);
    expect(list.filter((x) => /(^|\/)(auth\.json|\.credentials\.json)$/.test(x))).toEqual([]);
    expect(list.filter((x) => x.startsWith("app/") && !x.startsWith("app/node_modules/") && /\.(c|h|lua)$/.test(x))).toEqual([]);   // no host source
    expect(docker("run", "--rm", "--entrypoint", "/bin/sh", IMAGE, "-c", "true").code).not.toBe(0);
  }, 180_000);

  test("the container posts ready, serves one turn against the scripted upstream, and only the peer ever holds the real token", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rich-docker-"));
    mkdirSync(join(dir, "run"), { mode: 0o700 });
    mkdirSync(join(dir, "workspace", "sessions"), { recursive: true, mode: 0o700 });
    const upstream = await startAnthropicUpstream({ script: [textReply("Hello from the container")] });
    const peer = await startPeer({ socketPath: join(dir, "run", "broker.sock"), upstream: upstream.url, secret: SECRET });
    const name = `roundtable-rich-test-${process.pid}-${++seq}`;
    names.push(name);
    try {
      const run = docker(...runArgs(name, dir));
      expect(run.err).toBe("");
      expect(run.code).toBe(0);
      await Promise.race([peer.whenReady(), Bun.sleep(90_000).then(() => { throw new Error(`no ready: ${docker("logs", name).out}`); })]);
      expect(peer.readies[0]).toEqual({ capabilities: { privateTo: true, readerRecords: true }, privateHistory: false });
      const result = await peer.runTurn({
        turnId: "t1", author: { id: "123", name: "Ann", principalId: "ann" }, text: "hello there",
        memory: "", memoryVisibility: "private", images: [], thinking: "low",
      }, { timeoutMs: 120_000 });
      expect(result).toEqual({ ok: true, text: "Hello from the container", files: [] });
      const calls = upstream.messageRequests();
      expect(calls.length).toBe(1);
      expect(calls[0].headers.authorization).toBe(`Bearer ${SECRET}`);
      expect(JSON.stringify(calls[0].body)).toContain("[Ann (123)] hello there");
      expect(peer.modelCalls.every((c) => c.headers.authorization === "Bearer sandbox-dummy-token")).toBe(true);
      const inspect = JSON.parse(docker("inspect", name).out)[0];
      expect(JSON.stringify(inspect.Config.Env)).not.toContain(SECRET);
      expect(inspect.HostConfig.NetworkMode).toBe("none");
      expect(inspect.HostConfig.ReadonlyRootfs).toBe(true);
      for (const f of filesUnder(join(dir, "workspace"))) {
        if (statSync(f).size < 64 * 1024 * 1024) expect(readFileSync(f, "utf8").includes(SECRET)).toBe(false);
      }
      const logs = docker("logs", name).out;
      expect(logs).not.toContain(SECRET);
      const lines = logs.trim().split("\n").map((l) => JSON.parse(l));
      expect(lines.map((l) => l.msg)).toContain("turn finished");
      expect(lines.every((l) => l.app === "sandbox-worker")).toBe(true);
      expect(readdirSync(join(dir, "workspace", "sessions")).some((f) => f.endsWith(".jsonl"))).toBe(true);
    } finally {
      docker("rm", "-f", name);
      peer.stop();
      upstream.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);
});
