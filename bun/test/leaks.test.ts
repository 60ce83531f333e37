// leaks.test.ts: no handle outlives dispose: the engine thread is joined,
// its eventfd closed, the poll timer cleared, and a process that disposed
// its plugin ends on its own.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import { liveEngines } from "../src/ffi.ts";
import { sandbox } from "../src/index.ts";
import { baseOptions, fixture, makeRoots, MEMBER, mention, answered } from "./helpers.ts";

const fds = () => readdirSync("/proc/self/fd").length;
// Threads named like the process: the main thread and engine threads (bun's
// own pools and JSC's JIT workers carry names of their own and come and go).
const threads = () =>
  readdirSync("/proc/self/task").filter((t) => {
    try {
      return readFileSync(`/proc/self/task/${t}/comm`, "utf8").trim() === "bun";
    } catch {
      return false;
    }
  }).length;
const eventfds = () =>
  readdirSync("/proc/self/fd").filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === "anon_inode:[eventfd]";
    } catch {
      return false;
    }
  }).length;

async function cycle(turns = 1): Promise<void> {
  const roots = makeRoots();
  try {
    const plugin = await sandbox({
      ...baseOptions(roots),
      config: fixture("fake-driver.conf.lua"),
      initialChannels: ["discord:1"],
      apiKey: () => "k",
    });
    for (let i = 0; i < turns; i++) {
      expect(await plugin.handle(mention("1", `turn ${i}`), MEMBER)).toEqual(answered(`Sealed: turn ${i}`));
    }
    expect(plugin.claim(mention("1", "x"), MEMBER).action).toBe("answer");
    await plugin.dispose();
  } finally {
    roots.cleanup();
  }
}

describe("no leaked handles after free", () => {
  test("engine threads, eventfds and descriptors return to their baseline after dispose", async () => {
    await cycle(); // warm-up: bun's own lazily created threads and files
    await Bun.sleep(50);
    const before = { fds: fds(), threads: threads(), eventfds: eventfds() };
    for (let i = 0; i < 5; i++) await cycle(2);
    await Bun.sleep(50);
    expect(liveEngines.size).toBe(0);
    expect({ fds: fds(), threads: threads(), eventfds: eventfds() }).toEqual(before);
  });

  test("while a plugin lives it holds one engine thread and one eventfd", async () => {
    const roots = makeRoots();
    try {
      const t0 = threads();
      const e0 = eventfds();
      const plugin = await sandbox({ ...baseOptions(roots), config: fixture("fake-driver.conf.lua"), apiKey: () => "k" });
      expect(liveEngines.size).toBe(1);
      expect(threads()).toBeGreaterThan(t0);
      expect(eventfds()).toBeGreaterThan(e0);
      await plugin.dispose();
      expect(liveEngines.size).toBe(0);
      expect(threads()).toBe(t0);
      expect(eventfds()).toBe(e0);
    } finally {
      roots.cleanup();
    }
  });

  async function runExits(env: Record<string, string>): Promise<{ code: number; out: string; ms: number }> {
    const roots = makeRoots();
    try {
      const t0 = Date.now();
      const child = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "exits.ts")], {
        env: { ...process.env, ROOT: roots.root, ...env },
        stdout: "pipe",
        stderr: "pipe",
      });
      const killer = setTimeout(() => child.kill(9), 25_000);
      const code = await child.exited;
      clearTimeout(killer);
      return { code, out: await new Response(child.stdout).text(), ms: Date.now() - t0 };
    } finally {
      roots.cleanup();
    }
  }

  test(
    "a process that disposed its plugin exits by itself",
    async () => {
      const r = await runExits({});
      const [line, rest] = r.out.split("\n", 2);
      expect(JSON.parse(line!)).toMatchObject({ ok: true, text: "Sealed: hi", reason: "ok" });
      expect(r.out.endsWith("\nreturned\n")).toBe(true);
      expect(rest).toBe("returned");
      expect(r.code).toBe(0);
    },
    30_000,
  );

  test(
    "an apiKey that never settles does not outlive dispose: the turn fails closed and the process exits",
    async () => {
      const r = await runExits({ HANG_KEY: "1" });
      const [line, rest] = r.out.split("\n", 2);
      // the key request was cut by dispose: the turn was stopped (operations.md 1)
      expect(JSON.parse(line!)).toMatchObject({ ok: false, text: "model call failed: 502", reason: "stopped" });
      expect(rest).toBe("returned");
      expect(r.code).toBe(0);
      expect(r.ms).toBeLessThan(15_000);
    },
    30_000,
  );
});
