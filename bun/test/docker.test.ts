// docker.test.ts: full sealed turns through the real engine and Docker: the
// default CLI driver starts pi-roundtable-sandbox:local (`make image`) with
// --network none; the worker reaches only its broker, which takes the key
// from the TypeScript apiKey and calls a fake Chat Completions endpoint on
// 127.0.0.1 (allowHttp). Every container this installation made is checked
// gone afterwards.
//
// Runs when the Docker daemon answers and the image exists; skipped (with the
// reason printed) otherwise. SANDBOX_DOCKER_TEST=1 makes a missing daemon or
// image a failure instead, as the busted Docker specs do.
import { afterAll, afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readdirSync, realpathSync } from "node:fs";
import { join } from "node:path";
import { sandbox, type SandboxPlugin } from "../src/index.ts";
import { baseOptions, fakeModel, makeRoots, MEMBER, mention, type FakeModel, type Roots, until, answered } from "./helpers.ts";

const IMAGE = process.env.SBX_TEST_IMAGE ?? "pi-roundtable-sandbox:local";
const REQUIRED = process.env.SANDBOX_DOCKER_TEST === "1";
const HOST_KEY = "integration-host-key";
const TURN_MS = 120_000;

function docker(...args: string[]): { ok: boolean; out: string } {
  const r = Bun.spawnSync(["docker", ...args], { stdout: "pipe", stderr: "pipe", timeout: 30_000 });
  return { ok: r.exitCode === 0, out: `${r.stdout.toString()}${r.stderr.toString()}`.trim() };
}

function dockerState(): string | null {
  if (process.platform !== "linux") return "not a Linux host";
  if (process.getuid?.() === 0) return "running as root (the runtime refuses root)";
  let info: { ok: boolean; out: string };
  try {
    info = docker("info", "--format", "{{.ServerVersion}}");
  } catch {
    return "the docker CLI is not installed";
  }
  if (!info.ok) return "the Docker daemon does not answer";
  if (!docker("image", "inspect", IMAGE).ok) return `image ${IMAGE} is missing (make image)`;
  return null;
}

const unavailable = dockerState();
if (unavailable && !REQUIRED) console.log(`docker.test.ts: skipped: ${unavailable}`);

/** Containers (any state) labelled with this installation (spec/runtime.md 6.1). */
function containersOf(roots: Roots): string[] {
  const id = createHash("sha256")
    .update(`${realpathSync(roots.workspaceRoot)}\0${realpathSync(roots.runRoot)}`)
    .digest("hex");
  const r = docker("ps", "-a", "--filter", `label=roundtable.sandbox.installation=${id}`, "--format", "{{.Names}}");
  if (!r.ok) throw new Error(`docker ps failed: ${r.out}`);
  return r.out.split("\n").filter(Boolean);
}

describe.skipIf(unavailable !== null && !REQUIRED)("real Docker", () => {
  let roots: Roots;
  const allRoots: Roots[] = [];
  let model: FakeModel;
  let plugin: SandboxPlugin | null = null;
  let keyCalls: Array<{ channel: string; principalId: string }> = [];
  let keyAnswer: (channel: string) => string | undefined = () => HOST_KEY;

  beforeEach(async () => {
    if (unavailable) throw new Error(`SANDBOX_DOCKER_TEST=1 but ${unavailable}`);
    roots = makeRoots("sbd-");
    allRoots.push(roots);
    model = fakeModel("Hello from the sealed worker.");
    keyCalls = [];
    keyAnswer = () => HOST_KEY;
    plugin = await sandbox({
      ...baseOptions(roots, model.url),
      image: IMAGE,
      turnTimeoutMs: 60_000,
      initialChannels: ["discord:100", "discord:200"],
      apiKey: ({ channel, speaker }) => {
        keyCalls.push({ channel, principalId: speaker.principalId });
        return keyAnswer(channel);
      },
    });
  });

  afterEach(async () => {
    const p = plugin;
    plugin = null;
    await p?.dispose();
    try {
      if (roots) {
        expect(containersOf(roots)).toEqual([]);
        expect(readdirSync(roots.runRoot)).toEqual([]);
      }
    } finally {
      model?.stop();
      roots?.cleanup();
    }
  });

  afterAll(() => {
    // Nothing of ours may survive the file, whatever failed above.
    for (const r of allRoots) {
      try {
        for (const name of containersOf(r)) docker("rm", "-f", name);
      } catch {
        // roots already removed: nothing was left
      }
    }
  });

  test(
    "a mention runs a sealed turn in a fresh container; only the broker's upstream call carries the TS key",
    async () => {
      const result = await plugin!.handle(mention("100", "Hello sandbox"), MEMBER);
      expect(result).toEqual(answered("Hello from the sealed worker."));
      expect(keyCalls.length).toBeGreaterThanOrEqual(1);
      expect(keyCalls[0]).toEqual({ channel: "discord:100", principalId: "p_alice" });
      expect(model.calls.length).toBe(keyCalls.length);
      for (const call of model.calls) {
        expect(call.authorization).toBe(`Bearer ${HOST_KEY}`);
        expect(call.body.includes(HOST_KEY)).toBe(false);
        expect(JSON.parse(call.body).model).toBe("fake-model");
      }
      // the channel's workspace persists; the turn directory is gone
      expect(readdirSync(roots.workspaceRoot).length).toBe(1);
    },
    TURN_MS,
  );

  test(
    "an apiKey answering undefined fails the model call closed: the endpoint is never called",
    async () => {
      keyAnswer = () => undefined;
      const result = await plugin!.handle(mention("100", "Hello sandbox"), MEMBER);
      expect(keyCalls.length).toBeGreaterThanOrEqual(1);
      expect(model.calls.length).toBe(0);
      expect(result).not.toBeNull();
      expect(result!.replies.join("\n")).not.toContain("Hello from the sealed worker.");
    },
    TURN_MS,
  );

  test(
    "two channels run concurrently, each in its own container and workspace",
    async () => {
      model.delayMs = 1500;
      const a = plugin!.handle(mention("100", "first channel"), MEMBER);
      const b = plugin!.handle(mention("200", "second channel"), MEMBER);
      await until(async () => (await plugin!.services.SANDBOX.runtime.busy()).length === 2, 60_000, "both turns");
      expect(await Promise.all([a, b])).toEqual([
        answered("Hello from the sealed worker."),
        answered("Hello from the sealed worker."),
      ]);
      expect(new Set(keyCalls.map((k) => k.channel))).toEqual(new Set(["discord:100", "discord:200"]));
      expect(readdirSync(roots.workspaceRoot).length).toBe(2);
    },
    TURN_MS,
  );

  test(
    "stop while a turn runs removes its container and the guest sees the failure text",
    async () => {
      model.delayMs = 30_000;
      const running = plugin!.handle(mention("100", "take your time"), MEMBER);
      await until(() => model.calls.length > 0, 60_000, "the worker's model call");
      expect(containersOf(roots).length).toBe(1);
      const t0 = Date.now();
      expect(await plugin!.stop("discord:100")).toBe(true);
      const result = await running;
      expect(["The sandbox turn failed.", "The sandbox turn failed or was stopped."]).toContain(result!.replies[0]!);
      expect(Date.now() - t0).toBeLessThan(20_000);
      expect(await plugin!.services.SANDBOX.runtime.busy()).toEqual([]);
      expect(containersOf(roots)).toEqual([]);
    },
    TURN_MS,
  );

  test(
    "a process that exits mid-turn without dispose() still removes the container",
    async () => {
      const r = makeRoots("sbx-");
      allRoots.push(r);
      try {
        const child = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "exit-mid-turn.ts")], {
          env: { ...process.env, ROOT: r.root, IMAGE },
          stdout: "pipe",
          stderr: "pipe",
        });
        const killer = setTimeout(() => child.kill(9), 90_000);
        const code = await child.exited;
        clearTimeout(killer);
        expect(await new Response(child.stdout).text()).toBe("model called\n");
        expect(code).toBe(0);
        expect(containersOf(r)).toEqual([]);
        expect(readdirSync(r.runRoot)).toEqual([]);
      } finally {
        r.cleanup();
      }
    },
    TURN_MS,
  );
});
