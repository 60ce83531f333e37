// precheck.ts: the precheck script runner for Bun hosts (shared/spec/
// precheck.md 1). The runner runs in the engine (lua/sandbox/precheck: the
// grant checks, the per-run broker, the sealed container, the answer rules)
// and is built by the operator's trusted Lua config script, which returns
// `sandbox.precheckScriptRunner { ... }` with its grant, token and toolName
// functions; this file hands its members to the chat bot's core. A trusted
// plugin of the operator's registers it with the core's precheck service:
//
//   const runner = precheckScriptRunner({ config: "/etc/roundtable/precheck.conf.lua" });
//   services.PRECHECKS.useScriptRunner(runner);
//   await runner.run(script, { schedule, firedAt, tier, timeZone, today, tools, signal });
//
// `describe` and `run` return promises; `toolName` answers synchronously;
// `timeoutMs` is present only when the config set it. A run whose signal
// aborts rejects with the signal's reason, once its container is removed.
import { rethrowAs } from "./ffi.ts";
import { ownerName, utilityEngine } from "./utility.ts";

export interface PrecheckScope {
  channel: string;
  target: string;
  tier: string;
}

export interface PrecheckSchedule {
  id: number;
  title: string;
  channel: string;
  target: string;
  createdTier: string;
  [member: string]: unknown;
}

export interface PrecheckContext {
  schedule: PrecheckSchedule;
  /** The firing instant, YYYY-MM-DDTHH:MM:SS.sssZ. */
  firedAt: string;
  /** The tier this run is for (never the schedule's creation tier). */
  tier: string;
  timeZone: string;
  /** The date in timeZone, YYYY-MM-DD. */
  today: string;
  /** The calls the core read from the script and that were approved. */
  tools: { server: string; tool: string }[];
  /** Aborted by the core's deadline or by host stop. */
  signal?: AbortSignal;
}

export interface PrecheckScriptRunnerOptions {
  /** The trusted Lua config script returning sandbox.precheckScriptRunner { ... }. */
  config: string;
  /** JSON options handed to the config script as its argument. */
  options?: Record<string, unknown>;
  /** Path of libsbx.so (default: the bridge's, or $SBX_LIB). */
  library?: string;
}

export interface PrecheckScriptRunner {
  /** Guide text for the model (the core shows it through schedule_list). */
  describe(scope: PrecheckScope): Promise<string>;
  /** Runs one script in a fresh sealed container; resolves with its result. */
  run(script: string, context: PrecheckContext): Promise<unknown>;
  /** The name the host's hold rules know a tool by. */
  toolName(server: string, tool: string): string;
  /** Present only when the config set timeoutMs. */
  timeoutMs?: number;
  /** The runs' Prometheus text (docs/operations.md 6): sbx_turns_total{mode="precheck",reason}. */
  metrics(): Promise<string>;
  /** Forgets the runner in the engine (runs in flight finish first). */
  dispose(): Promise<void>;
}

// A declaration, not an arrow const: TypeScript's control flow treats only
// declared functions returning never as ending the path (TS2366 otherwise).
function rethrow(err: unknown): never {
  return rethrowAs(err, {});
}

/** Builds the runner from a trusted Lua config script; throws its construction error. */
export function precheckScriptRunner(options: PrecheckScriptRunnerOptions): PrecheckScriptRunner {
  const o = (options ?? {}) as Partial<PrecheckScriptRunnerOptions>;
  if (typeof o.config !== "string" || o.config === "") throw new Error("precheckScriptRunner: config must be a Lua file path");
  const engine = utilityEngine(o.library);
  const owner = ownerName("p");
  let made: { timeoutMs?: number | null };
  try {
    made = engine.callSync({ type: "precheck.new", owner, config: o.config, options: o.options ?? {} }, 30_000);
  } catch (err) {
    rethrow(err);
  }

  const runner: PrecheckScriptRunner = {
    describe(scope: PrecheckScope): Promise<string> {
      return engine.submit<string>({ type: "precheck.describe", owner, scope }).catch(rethrow);
    },

    metrics(): Promise<string> {
      return engine.submit<string>({ type: "precheck.metrics", owner }).catch(rethrow);
    },

    run(script: string, context: PrecheckContext): Promise<unknown> {
      const { signal, ...wire } = (context ?? {}) as PrecheckContext;
      if (signal?.aborted) return Promise.reject(signal.reason);
      const { id, result } = engine.send<unknown>({ type: "precheck.run", owner, script, context: wire });
      const onAbort = () => {
        if (id > 0 && !engine.closed) {
          engine.submit({ type: "cancel", target: id, reason: reasonText(signal?.reason) }).catch(() => undefined);
        }
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // Settles when the engine's run does (after the container's removal).
      return result.then(
        (value) => {
          signal?.removeEventListener("abort", onAbort);
          if (signal?.aborted) throw signal.reason;
          return value ?? undefined;
        },
        (err: unknown) => {
          signal?.removeEventListener("abort", onAbort);
          if (signal?.aborted) throw signal.reason;
          return rethrow(err);
        },
      );
    },

    toolName(server: string, tool: string): string {
      try {
        return engine.callSync<string>({ type: "precheck.toolName", owner, server, tool });
      } catch (err) {
        rethrow(err);
      }
    },

    async dispose(): Promise<void> {
      if (engine.closed) return;
      await engine.submit({ type: "precheck.dispose", owner }).catch(rethrow);
    },
  };
  if (typeof made.timeoutMs === "number") runner.timeoutMs = made.timeoutMs;
  return runner;
}

/** What the engine's run signal is aborted with (a string there). */
function reasonText(reason: unknown): string {
  if (reason instanceof Error) return reason.message || reason.name;
  return reason === undefined ? "aborted" : String(reason);
}
