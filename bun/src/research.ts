// research.ts: SandboxResearchWorker for Bun hosts (shared/spec/
// fetch-and-delegation.md section 4). The worker (the session, its agent
// loop, tool restriction, bounds and outcome rules) runs in the engine
// (lua/sandbox/delegator/research.lua through lua/sandbox/embed/_research.lua); the
// model runtime, search, extractFetched, fetchContent and extension
// factories are this host's functions, called back per run. Meant as a
// ScopedSandboxDelegator's run:
//
//   const worker = new SandboxResearchWorker({ modelRuntime, agentDir, workDir,
//     model: "anthropic/claude-sonnet-4", thinking: "medium", search, extractFetched });
//   const delegator = new ScopedSandboxDelegator({ target: "research",
//     run: (task, ctx) => worker.run(task, ctx.signal), deliver, logger });
//
// The model runtime is the trusted host object that resolves models and
// makes model calls (its credentials never reach the engine's worker state):
//   findModel(model) -> a handle (anything) or undefined when not available here
//   complete(handle, request, signal) -> the assistant message
//     request  { system, thinking, messages, tools }   (active tools only)
//     message  { role: "assistant", content: [{ type: "text", text } |
//                { type: "toolCall", id, name, arguments }], stopReason, errorMessage? }
// Extension factories get `api.registerTool({ name, description, parameters,
// execute(args, signal) })` and `api.on("tool_call", (event) => ({ block, reason }))`.
import { EngineError, rethrowAs } from "./ffi.ts";
import { fromWire, type SafeFetchResult, type WireResult } from "./fetch.ts";
import { ownerName, utilityEngine } from "./utility.ts";

export type ThinkingLevel = "low" | "medium" | "high" | "xhigh";

export interface ResearchToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

export interface ResearchRequest {
  system: string;
  thinking: ThinkingLevel;
  messages: unknown[];
  tools: ResearchToolSpec[];
}

export interface AssistantMessage {
  role: "assistant";
  content: ({ type: "text"; text: string } | { type: "thinking"; thinking: string } | {
    type: "toolCall";
    id: string;
    name: string;
    arguments: Record<string, unknown>;
  })[];
  stopReason: "stop" | "length" | "toolUse" | "error" | "aborted";
  errorMessage?: string;
}

export interface ResearchModelRuntime {
  findModel(model: string): unknown;
  complete(handle: unknown, request: ResearchRequest, signal: AbortSignal): AssistantMessage | Promise<AssistantMessage>;
}

export interface ResearchExtensionApi {
  registerTool(tool: ResearchToolSpec & { execute(args: Record<string, unknown>, signal: AbortSignal): unknown }): void;
  on(
    event: "tool_call",
    handler: (event: { toolName: string; toolCallId: string; input: unknown }) => unknown,
  ): void;
}

export interface SandboxResearchWorkerOptions {
  modelRuntime: ResearchModelRuntime;
  agentDir: string;
  workDir: string;
  /** "<provider>/<id>" */
  model: string;
  thinking: ThinkingLevel;
  search?: (query: string, signal: AbortSignal) => string | Promise<string>;
  /** Text of an already bounded, pinned safeFetch result; must not fetch its URL again. */
  extractFetched?: (result: SafeFetchResult, signal: AbortSignal) => string | Promise<string>;
  /** Host-owned fetch-and-extract (then refusing private targets and bounding time and size is the host's job). */
  fetchContent?: (url: string, signal: AbortSignal) => string | Promise<string>;
  tools?: {
    /** Trusted Lua extension files, each returning a factory (lua/sandbox/delegator/research.lua). */
    extensionPaths?: string[];
    extensionFactories?: ((api: ResearchExtensionApi) => void)[];
    toolNames: string[];
    prompt?: string;
  };
  scope?: <T>(fn: () => Promise<T>) => Promise<T> | T;
  /** Text of a run stopped by its deadline (default "the worker ran out of time"). */
  aborted?: string;
  library?: string;
}

/** A failed run: "the worker ran out of time", the provider's error, ... */
export class ResearchError extends Error {
  override name = "ResearchError";
}
/** "model <m> is not available on this host" */
export class ConfigError extends Error {
  override name = "ConfigError";
}

const FUNCTIONS = ["search", "extractFetched", "fetchContent", "scope"] as const;

/** What the constructor check sees of a host function: true, or the value itself (refused). */
function fnFlag(v: unknown): unknown {
  if (v === undefined) return undefined;
  return typeof v === "function" ? true : v === null ? false : typeof v === "object" ? "not a function" : v;
}

// A declaration, not an arrow const: TypeScript's control flow treats only
// declared functions returning never as ending the path (TS2366 otherwise).
function rethrow(err: unknown): never {
  return rethrowAs(err, { ResearchError, ConfigError });
}

interface Load {
  tools: Map<string, (args: Record<string, unknown>, signal: AbortSignal) => unknown>;
  guards: ((event: { toolName: string; toolCallId: string; input: unknown }) => unknown)[];
}

export class SandboxResearchWorker {
  private readonly o: SandboxResearchWorkerOptions;
  private readonly wire: Record<string, unknown>;

  constructor(options: SandboxResearchWorkerOptions) {
    const o = (options ?? {}) as SandboxResearchWorkerOptions;
    this.o = o;
    const rt = o.modelRuntime as unknown as Record<string, unknown> | undefined;
    const fns: Record<string, unknown> = {
      modelRuntime:
        rt !== null && typeof rt === "object" && typeof rt.findModel === "function" && typeof rt.complete === "function"
          ? true
          : (fnFlag(rt) ?? null),
    };
    for (const k of FUNCTIONS) fns[k] = fnFlag((o as unknown as Record<string, unknown>)[k]);
    const opts: Record<string, unknown> = {
      agentDir: o.agentDir,
      workDir: o.workDir,
      model: o.model,
      thinking: o.thinking,
      aborted: o.aborted,
    };
    let factories: unknown;
    if (o.tools !== undefined) {
      const t = o.tools as unknown;
      if (t !== null && typeof t === "object") {
        const tt = t as Record<string, unknown>;
        opts.tools = { extensionPaths: tt.extensionPaths, toolNames: tt.toolNames, prompt: tt.prompt };
        const f = tt.extensionFactories;
        factories = Array.isArray(f) ? f.map((x) => typeof x === "function") : f === undefined ? undefined : "not a list";
      } else {
        opts.tools = t === null ? "null" : t;
      }
    }
    this.wire = { options: opts, fns, factories };
    try {
      utilityEngine(o.library).callSync({ type: "research.check", ...this.wire });
    } catch (err) {
      rethrow(err);
    }
  }

  /** One research run: the report, or a ResearchError / ConfigError; an aborted signal rejects with its reason. */
  async run(task: string, signal?: AbortSignal): Promise<string> {
    if (signal?.aborted) throw signal.reason;
    const inner = () => this.runOnce(task, signal);
    if (!this.o.scope) return inner();
    let settled: { ok: true; value: string } | { ok: false; error: unknown } | null = null;
    let scopeFailed = false;
    let scopeError: unknown;
    try {
      await this.o.scope(async () => {
        try {
          const value = await inner();
          settled = { ok: true, value };
          return value;
        } catch (error) {
          settled = { ok: false, error };
          throw error;
        }
      });
    } catch (err) {
      scopeFailed = true;
      scopeError = err;
    }
    // What the research returned or raised, whatever scope did with it.
    const s = settled as { ok: true; value: string } | { ok: false; error: unknown } | null;
    if (s === null) {
      if (scopeFailed) throw scopeError;
      throw new Error("the research scope did not run the research");
    }
    if (!s.ok) throw s.error;
    return s.value;
  }

  private async runOnce(task: string, signal?: AbortSignal): Promise<string> {
    const o = this.o;
    const engine = utilityEngine(o.library);
    const owner = ownerName("r");
    const handles = new Map<string, unknown>();
    const loads = new Map<number, Load>();
    let nextLoad = 0;
    const handler = async (fn: string, args: unknown[], callSignal: AbortSignal): Promise<unknown> => {
      switch (fn) {
        case "findModel": {
          const h = await o.modelRuntime.findModel(String(args[0]));
          if (h === undefined || h === null) return null;
          const key = `h${handles.size + 1}`;
          handles.set(key, h);
          return key;
        }
        case "complete": {
          const req = (args[1] ?? {}) as Record<string, unknown>;
          const request: ResearchRequest = {
            system: String(req.system ?? ""),
            thinking: req.thinking as ThinkingLevel,
            messages: Array.isArray(req.messages) ? req.messages : [],
            tools: Array.isArray(req.tools) ? (req.tools as ResearchToolSpec[]) : [],
          };
          return await o.modelRuntime.complete(handles.get(String(args[0])), request, callSignal);
        }
        case "search":
          return await o.search!(String(args[0]), callSignal);
        case "fetchContent":
          return await o.fetchContent!(String(args[0]), callSignal);
        case "extractFetched":
          return await o.extractFetched!(fromWire((args[0] ?? {}) as WireResult), callSignal);
        case "extension.load": {
          const factory = o.tools?.extensionFactories?.[Number(args[0]) - 1];
          if (typeof factory !== "function") throw new Error("no such extension factory");
          const load: Load = { tools: new Map(), guards: [] };
          const specs: ResearchToolSpec[] = [];
          factory({
            registerTool(t) {
              specs.push({ name: t.name, description: t.description, parameters: t.parameters });
              load.tools.set(t.name, t.execute);
            },
            on(event, h) {
              if (event === "tool_call" && typeof h === "function") load.guards.push(h);
            },
          });
          nextLoad += 1;
          loads.set(nextLoad, load);
          return { load: nextLoad, tools: specs, guard: load.guards.length > 0 };
        }
        case "extension.execute": {
          const exec = loads.get(Number(args[0]))?.tools.get(String(args[1]));
          if (!exec) throw new Error(`Tool ${String(args[1])} not found`);
          const input = args[2] !== null && typeof args[2] === "object" ? (args[2] as Record<string, unknown>) : {};
          return await exec(input, callSignal);
        }
        case "extension.toolCall": {
          const event = args[1] as { toolName: string; toolCallId: string; input: unknown };
          for (const g of loads.get(Number(args[0]))?.guards ?? []) {
            const r = (await g(event)) as { block?: unknown; reason?: unknown } | undefined;
            if (r && r.block) return { block: true, reason: typeof r.reason === "string" ? r.reason : undefined };
          }
          return null;
        }
      }
      throw new Error(`no research host function ${fn}`);
    };
    engine.registerOwner(owner, handler);
    const { id, result } = engine.send<string>({ type: "research.run", owner, task, ...this.wire });
    const done = result.finally(() => engine.unregisterOwner(owner));
    const onAbort = () => {
      if (id > 0 && !engine.closed) engine.submit({ type: "cancel", target: id, reason: "aborted" }).catch(() => undefined);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await done;
    } catch (err) {
      // The run's own outcome (the aborted text) is the worker's answer;
      // an abort before the session opened rejects with the caller's reason.
      if (signal?.aborted && !(err instanceof EngineError && err.info)) throw signal.reason;
      return rethrow(err);
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }
}
