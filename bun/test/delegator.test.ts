// delegator.test.ts: ScopedSandboxDelegator through the bridge: the Lua
// delegator in the utility engine, its run / deliver / logger as
// JavaScript functions called back with the job's signal as an AbortSignal.
import { afterAll, describe, expect, test } from "bun:test";
import {
  DelegationError,
  type DelegationJob,
  type DelegationOutcome,
  type DelegationRequest,
  disposeUtilityEngine,
  ScopedSandboxDelegator,
  type ScopedSandboxDelegatorOptions,
} from "../src/index.ts";

afterAll(() => disposeUtilityEngine());

const AUTHOR = { id: "u1", name: "Guest", principalId: "p1", tier: "member" as const };

function request(extra: Partial<DelegationRequest> & Record<string, unknown> = {}): DelegationRequest {
  return { channel: "discord:1", target: "research", author: AUTHOR, title: "Look up", task: "find it", ...extra };
}

interface Harness {
  d: ScopedSandboxDelegator;
  delivered: [DelegationJob, DelegationOutcome][];
  logged: [string, Record<string, unknown>][];
}

function make(opts: Partial<ScopedSandboxDelegatorOptions> = {}): Harness {
  const delivered: Harness["delivered"] = [];
  const logged: Harness["logged"] = [];
  const d = new ScopedSandboxDelegator({
    target: "research",
    run: async (task) => `report on ${task}`,
    deliver: (job, outcome) => {
      delivered.push([job, outcome]);
    },
    logger: { error: (m, f) => logged.push([m, f]) },
    ...opts,
  });
  return { d, delivered, logged };
}

function refusal(f: () => unknown): DelegationError {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(DelegationError);
    return err as DelegationError;
  }
  throw new Error("expected a DelegationError");
}

describe("ScopedSandboxDelegator options", () => {
  test("each invalid option gets its message", () => {
    const base = { target: "research", run: async () => "", deliver: () => {}, logger: { error: () => {} } };
    const cases: [Record<string, unknown>, string][] = [
      [{ target: "" }, "Invalid delegation target/budget"],
      [{ maxRunning: 11 }, "Invalid delegation target/budget"],
      [{ timeoutMs: 999 }, "Invalid delegation target/budget"],
      [{ maxTitleChars: 0 }, "Invalid delegation title limit"],
      [{ maxTitleChars: 1.5 }, "Invalid delegation title limit"],
      [{ maxReportChars: NaN }, "Invalid delegation maxReportChars"],
      [{ diagnosticChars: -Infinity }, "Invalid delegation diagnosticChars"],
      [{ run: "not a function" }, "Invalid delegation callbacks"],
      [{ logger: {} }, "Invalid delegation callbacks"],
    ];
    for (const [o, message] of cases) {
      expect(() => new ScopedSandboxDelegator({ ...base, ...o } as never)).toThrow(message);
    }
    expect(() => new ScopedSandboxDelegator({ ...base, maxTitleChars: Infinity, maxReportChars: Infinity })).not.toThrow();
  });
});

describe("ScopedSandboxDelegator start", () => {
  test("returns the job record and delivers the run's report to the asking channel", async () => {
    const seenCtx: unknown[] = [];
    const h = make({
      run: async (task, ctx) => {
        seenCtx.push({ channel: ctx.channel, author: ctx.author, aborted: ctx.signal.aborted, keys: Object.keys(ctx).sort() });
        return `report on ${task}`;
      },
    });
    const before = Date.now();
    const job = h.d.start(request({ title: "  Look up  ", task: "  find it  " }));
    expect(job).toMatchObject({ id: 1, channel: "discord:1", target: "research", title: "Look up", task: "find it" });
    expect(job.author).toEqual(AUTHOR);
    expect(job.startedAt).toBeGreaterThanOrEqual(before - 1000);
    expect(h.d.runningChannels()).toEqual(["discord:1"]);
    await h.d.idle();
    expect(h.delivered).toEqual([[job, { ok: true, report: "report on find it" }]]);
    expect(seenCtx).toEqual([
      { channel: "discord:1", author: { id: "u1", name: "Guest", principalId: "p1" }, aborted: false, keys: ["author", "channel", "signal"] },
    ]);
    expect(h.d.runningChannels()).toEqual([]);
    expect(h.d.start(request()).id).toBe(2);
    await h.d.dispose();
  });

  test("refusals in the spec's order", async () => {
    const h = make({ maxTitleChars: 7, maxRunning: 1, run: () => new Promise<string>(() => {}) as Promise<string> });
    expect(refusal(() => h.d.start(request({ target: "other" }))).message).toBe("Delegation scope refused");
    expect(refusal(() => h.d.start({ ...request(), origin: "x" } as never)).message).toBe("Delegation scope refused");
    expect(refusal(() => h.d.start({ ...request(), thread: undefined } as never)).message).toBe("Delegation scope refused");
    expect(refusal(() => h.d.start(request({ author: { ...AUTHOR, tier: "owner" as never } }))).message).toBe(
      "Delegation scope refused",
    );
    expect(refusal(() => h.d.start(request({ author: { ...AUTHOR, principalId: "" } }))).message).toBe(
      "Delegation scope refused",
    );
    expect(refusal(() => h.d.start(request({ title: "   " }))).message).toBe("title and task are required");
    expect(refusal(() => h.d.start(request({ task: 5 as never }))).message).toBe("title and task are required");
    expect(refusal(() => h.d.start(request({ title: "abcdefgh" }))).message).toBe(
      "the title is 8 characters; keep it within 7",
    );
    expect(refusal(() => h.d.start(request({ task: "é".repeat(4001) }))).message).toBe(
      "the task is 4001 characters; keep it within 4000",
    );
    h.d.start(request());
    expect(refusal(() => h.d.start(request())).message).toBe(
      "this channel already has 1 delegated tasks running; wait for one to report back",
    );
    h.d.start(request({ channel: "discord:2" }));
    expect(h.d.runningChannels().sort()).toEqual(["discord:1", "discord:2"]);
    // dispose aborts the runs' signals; these runs ignore them, so dispose
    // would wait: let the test's own end free the engine instead.
    void h.d.dispose();
    await Bun.sleep(20);
    expect(refusal(() => h.d.start(request({ channel: "discord:3" }))).message).toBe("Delegation scope refused");
  });
});

describe("ScopedSandboxDelegator outcomes", () => {
  test("a failed run reports its message scrubbed and bounded; empty becomes 'the task failed'", async () => {
    const h = make({
      diagnosticChars: 100,
      run: async (task) => {
        if (task === "plain") throw "just a string";
        if (task === "empty") throw new Error("   ");
        throw new Error(`upstream said password=hunter2 at https://me:pw@api.example.com/ ${"x".repeat(200)}`);
      },
    });
    h.d.start(request({ task: "secret" }));
    h.d.start(request({ task: "plain", channel: "discord:2" }));
    h.d.start(request({ task: "empty", channel: "discord:3" }));
    await h.d.idle();
    const byTask = Object.fromEntries(h.delivered.map(([job, out]) => [job.task, out]));
    const secret = byTask.secret as { ok: false; error: string };
    expect(secret.ok).toBe(false);
    expect(secret.error).toStartWith("upstream said password=[redacted] at https://[redacted]@api.example.com/");
    expect(secret.error).not.toContain("hunter2");
    expect([...secret.error].length).toBe(100);
    expect(secret.error.endsWith("…")).toBe(true);
    expect(byTask.plain).toEqual({ ok: false, error: "just a string" });
    expect(byTask.empty).toEqual({ ok: false, error: "the task failed" });
    await h.d.dispose();
  });

  test("a report that is too long or not a string fails", async () => {
    const h = make({
      maxReportChars: 5,
      run: async (task) => (task === "number" ? (42 as unknown as string) : "123456"),
    });
    h.d.start(request({ task: "long" }));
    h.d.start(request({ task: "number", channel: "discord:2" }));
    await h.d.idle();
    for (const [, out] of h.delivered) expect(out).toEqual({ ok: false, error: "Research report too large" });
    await h.d.dispose();
  });

  test("the deadline aborts the run's signal and reports that the worker ran out of time", async () => {
    let abortedWith: unknown = null;
    const h = make({
      timeoutMs: 1000,
      run: (_task, ctx) =>
        new Promise<string>((resolve) => {
          ctx.signal.addEventListener("abort", () => {
            abortedWith = ctx.signal.reason;
            resolve("a late report");
          });
        }),
    });
    const t0 = performance.now();
    h.d.start(request());
    await h.d.idle();
    expect(performance.now() - t0).toBeGreaterThanOrEqual(900);
    expect(abortedWith).not.toBeNull();
    expect(h.delivered[0]![1]).toEqual({ ok: false, error: "the worker ran out of time" });
    await h.d.dispose();
  });

  test("a failing deliver is logged without its text, and keeps the slot until it returns", async () => {
    let release = () => {};
    const gate = new Promise<void>((r) => (release = r));
    const h = make({
      deliver: async (job) => {
        if (job.task === "slow") await gate;
        throw new Error("post failed: token=abcdef123456");
      },
    });
    const job = h.d.start(request({ task: "slow" }));
    await Bun.sleep(50);
    expect(h.d.runningChannels()).toEqual(["discord:1"]);
    release();
    await h.d.idle();
    expect(h.logged).toEqual([["Sandbox task report failed", { channel: "discord:1", job: job.id }]]);
    expect(JSON.stringify(h.logged)).not.toContain("abcdef123456");
    await h.d.dispose();
  });

  test("dispose aborts running jobs, delivers them as timed out, and refuses new work", async () => {
    const h = make({
      run: (_task, ctx) =>
        new Promise<string>((_resolve, reject) => ctx.signal.addEventListener("abort", () => reject(new Error("stopped")))),
    });
    h.d.start(request());
    h.d.start(request({ channel: "discord:2" }));
    await Bun.sleep(20);
    await h.d.dispose();
    expect(h.delivered.map(([, o]) => o)).toEqual([
      { ok: false, error: "the worker ran out of time" },
      { ok: false, error: "the worker ran out of time" },
    ]);
    expect(h.d.runningChannels()).toEqual([]);
    expect(refusal(() => h.d.start(request())).message).toBe("Delegation scope refused");
    await h.d.dispose();
  });
});
