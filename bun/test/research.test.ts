// research.test.ts: SandboxResearchWorker through the bridge, with a
// scripted offline model runtime in TypeScript: the engine's worker calls
// findModel / complete / search / fetch / extension tools back here.
import { afterAll, describe, expect, test } from "bun:test";
import {
  type AssistantMessage,
  ConfigError,
  disposeUtilityEngine,
  type ResearchModelRuntime,
  type ResearchRequest,
  ResearchError,
  SandboxResearchWorker,
  type SandboxResearchWorkerOptions,
  ScopedSandboxDelegator,
} from "../src/index.ts";
import { utilityEngine } from "../src/utility.ts";

afterAll(() => disposeUtilityEngine());

const text = (t: string): AssistantMessage => ({ role: "assistant", content: [{ type: "text", text: t }], stopReason: "stop" });
const call = (name: string, args: Record<string, unknown>, id = `c-${name}`): AssistantMessage => ({
  role: "assistant",
  content: [{ type: "toolCall", id, name, arguments: args }],
  stopReason: "toolUse",
});

/** A runtime that answers each complete() with the next scripted step (a message or a function of the request). */
function scripted(steps: (AssistantMessage | ((r: ResearchRequest) => AssistantMessage | Promise<AssistantMessage>))[]) {
  const requests: ResearchRequest[] = [];
  const runtime: ResearchModelRuntime = {
    findModel: (m) => (m === "test/model" ? { id: m } : undefined),
    complete: async (handle, request) => {
      expect(handle).toEqual({ id: "test/model" });
      requests.push(structuredClone(request));
      const step = steps.shift();
      if (!step) return text("out of script");
      return typeof step === "function" ? step(request) : step;
    },
  };
  return { runtime, requests };
}

/** The text of the last tool result the model was sent. */
function lastToolResult(r: ResearchRequest): { text: string; isError: boolean } {
  const m = [...r.messages].reverse().find((x) => (x as { role?: string }).role === "toolResult") as
    | { content: { text: string }[]; isError: boolean }
    | undefined;
  return { text: m?.content?.[0]?.text ?? "", isError: m?.isError === true };
}

const base = (rt: ResearchModelRuntime, extra: Partial<SandboxResearchWorkerOptions> = {}): SandboxResearchWorkerOptions => ({
  modelRuntime: rt,
  agentDir: "/tmp/agent",
  workDir: "/tmp/work",
  model: "test/model",
  thinking: "low",
  ...extra,
});

describe("SandboxResearchWorker options", () => {
  test("the constructor checks in order", () => {
    const { runtime } = scripted([]);
    expect(() => new SandboxResearchWorker(base(runtime))).toThrow("Research needs tools, fetchContent or extractFetched");
    expect(() => new SandboxResearchWorker(base(runtime, { fetchContent: async () => "" }))).toThrow(
      "Research needs search unless it has its own tools",
    );
    expect(() => new SandboxResearchWorker(base(runtime, { tools: { toolNames: ["fetch_content"] } }))).not.toThrow();
    const ok = { search: async () => "", extractFetched: async () => "" };
    expect(() => new SandboxResearchWorker(base(runtime, { ...ok, model: "no-slash" }))).toThrow("Invalid research option model");
    expect(() => new SandboxResearchWorker(base(runtime, { ...ok, thinking: "max" as never }))).toThrow(
      "Invalid research option thinking",
    );
    expect(() => new SandboxResearchWorker({ ...base(runtime, ok), modelRuntime: {} as never })).toThrow(
      "Invalid research option modelRuntime",
    );
    expect(() => new SandboxResearchWorker(base(runtime, { ...ok, search: "x" as never }))).toThrow(
      "Invalid research option search",
    );
    expect(() => new SandboxResearchWorker(base(runtime, { tools: { toolNames: [] } }))).toThrow(
      "Invalid research option tools.toolNames",
    );
  });
});

describe("SandboxResearchWorker runs", () => {
  test("default mode: web_search then an answer; only the two built-in tools are offered", async () => {
    const queries: string[] = [];
    const { runtime, requests } = scripted([
      call("web_search", { query: "capital of France" }),
      (r) => text(`Paris (source: ${lastToolResult(r).text})`),
    ]);
    const worker = new SandboxResearchWorker(
      base(runtime, {
        search: async (q) => {
          queries.push(q);
          return "https://example.org/paris";
        },
        extractFetched: async () => "",
      }),
    );
    expect(await worker.run("What is the capital of France?")).toBe("Paris (source: https://example.org/paris)");
    expect(queries).toEqual(["capital of France"]);
    expect(requests[0]!.tools.map((t) => t.name).sort()).toEqual(["fetch_content", "web_search"]);
    expect(requests[0]!.thinking).toBe("low");
    expect(requests[0]!.system).toContain("public sources");
  });

  test("fetch_content through safe fetch refuses a private URL and the model sees it", async () => {
    const { runtime, requests } = scripted([call("fetch_content", { url: "http://127.0.0.1/admin" }), text("could not fetch")]);
    let extracted = 0;
    const worker = new SandboxResearchWorker(
      base(runtime, {
        search: async () => "",
        extractFetched: async () => {
          extracted++;
          return "";
        },
      }),
    );
    expect(await worker.run("read the admin page")).toBe("could not fetch");
    expect(lastToolResult(requests[1]!)).toEqual({ text: "URL resolves to a non-public address", isError: true });
    expect(extracted).toBe(0);
  });

  test("host tools replace the built-ins; an inactive tool never runs; scope wraps the run", async () => {
    const events: string[] = [];
    let secretRan = false;
    const { runtime, requests } = scripted([
      call("host_secret_tool", {}),
      call("host_lookup", { q: "x" }),
      (r) => text(`report: ${lastToolResult(r).text}`),
    ]);
    const worker = new SandboxResearchWorker(
      base(runtime, {
        tools: {
          toolNames: ["host_lookup"],
          prompt: "custom prompt",
          extensionFactories: [
            (api) => {
              api.registerTool({
                name: "host_lookup",
                description: "looks up",
                parameters: { type: "object", properties: { q: { type: "string" } } },
                execute: async (args) => `looked up ${String(args.q)}`,
              });
              api.registerTool({
                name: "host_secret_tool",
                description: "must stay inactive",
                parameters: { type: "object", properties: {} },
                execute: async () => {
                  secretRan = true;
                  return "secret";
                },
              });
            },
          ],
        },
        scope: async (fn) => {
          events.push("enter");
          try {
            return await fn();
          } finally {
            events.push("exit");
          }
        },
      }),
    );
    expect(await worker.run("task")).toBe("report: looked up x");
    expect(secretRan).toBe(false);
    expect(lastToolResult(requests[1]!)).toEqual({ text: "Tool host_secret_tool not found", isError: true });
    expect(requests[0]!.tools.map((t) => t.name)).toEqual(["host_lookup"]);
    expect(requests[0]!.system).toBe("custom prompt");
    expect(events).toEqual(["enter", "exit"]);
  });

  test("a guard blocks a call; a long report is cut; an unknown model is a ConfigError", async () => {
    const { runtime, requests } = scripted([call("host_lookup", { q: "blocked" }), text("é".repeat(20_005))]);
    const worker = new SandboxResearchWorker(
      base(runtime, {
        tools: {
          toolNames: ["host_lookup"],
          extensionFactories: [
            (api) => {
              api.registerTool({
                name: "host_lookup",
                description: "d",
                parameters: { type: "object", properties: {} },
                execute: async () => "ran",
              });
              api.on("tool_call", (e) => (e.toolName === "host_lookup" ? { block: true, reason: "not on this run" } : undefined));
            },
          ],
        },
      }),
    );
    const report = await worker.run("task");
    expect(lastToolResult(requests[1]!)).toEqual({ text: "not on this run", isError: true });
    expect([...report].length).toBe(20_000 + "\n\n[report cut at 20000 characters]".length);
    expect(report.endsWith("\n\n[report cut at 20000 characters]")).toBe(true);

    const other = new SandboxResearchWorker({ ...base(runtime, { tools: { toolNames: ["x"] } }), model: "test/other" });
    const e = await other.run("task").catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as Error).message).toBe("model test/other is not available on this host");
  });

  test("outcomes: the provider's error, another stop reason, an empty answer", async () => {
    const cases: [AssistantMessage, string][] = [
      [{ role: "assistant", content: [], stopReason: "error", errorMessage: "rate limited" }, "rate limited"],
      [{ role: "assistant", content: [{ type: "text", text: "partial" }], stopReason: "length" }, "the run stopped with length"],
      [text("   "), "the worker's answer is empty"],
    ];
    for (const [msg, error] of cases) {
      const { runtime } = scripted([msg]);
      const worker = new SandboxResearchWorker(base(runtime, { tools: { toolNames: ["x"] } }));
      const e = await worker.run("task").catch((x: unknown) => x);
      expect(e).toBeInstanceOf(ResearchError);
      expect((e as Error).message).toBe(error);
    }
  });

  test("an abort during the model call ends with the aborted text; an aborted signal up front rejects with its reason", async () => {
    const { runtime } = scripted([
      () =>
        new Promise<AssistantMessage>(() => {
          /* never answers: the abort must end the run */
        }),
    ]);
    const worker = new SandboxResearchWorker(base(runtime, { tools: { toolNames: ["x"] }, aborted: "stopped early" }));
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error("deadline")), 50);
    const e = await worker.run("task", ac.signal).catch((x: unknown) => x);
    expect((e as Error).message).toBe("stopped early");
    await Bun.sleep(20);
    expect(utilityEngine().hostCalls).toBe(0);
    const done = new AbortController();
    const reason = new Error("already");
    done.abort(reason);
    expect(await worker.run("task", done.signal).catch((x: unknown) => x)).toBe(reason);
  });

  test("as a scoped delegator's run, end to end", async () => {
    const { runtime } = scripted([call("web_search", { query: "q" }), (r) => text(`found ${lastToolResult(r).text}`)]);
    const worker = new SandboxResearchWorker(base(runtime, { search: async () => "it", extractFetched: async () => "" }));
    const delivered: unknown[] = [];
    const d = new ScopedSandboxDelegator({
      target: "research",
      run: (task, ctx) => worker.run(task, ctx.signal),
      deliver: (job, outcome) => {
        delivered.push([job.task, outcome]);
      },
      logger: { error: () => {} },
    });
    d.start({ channel: "discord:1", target: "research", author: { id: "u", name: "U", principalId: "p", tier: "member" }, title: "t", task: "look" });
    await d.idle();
    expect(delivered).toEqual([["look", { ok: true, report: "found it" }]]);
    await d.dispose();
  });
});
