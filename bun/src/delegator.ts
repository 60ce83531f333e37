// delegator.ts: ScopedSandboxDelegator for Bun hosts (shared/spec/
// fetch-and-delegation.md section 3). The delegator itself runs in the
// engine (lua/sandbox/delegator/init.lua: option checks, the order of start()'s
// refusals, per-channel slots, deadlines, scrubbed failure reasons); its
// run, deliver and logger are this host's JavaScript functions, which the
// engine calls back (callback.request) with the job's signal mirrored into
// an AbortSignal. start() and runningChannels() are synchronous, as in Lua.
//
//   const d = new ScopedSandboxDelegator({ target: "research", run, deliver, logger });
//   const job = d.start({ channel, target: "research", author, title, task }); // throws DelegationError
//   await d.dispose();
import { rethrowAs } from "./ffi.ts";
import { ownerName, utilityEngine, wireNumber } from "./utility.ts";

export interface DelegationAuthor {
  id: string;
  name: string;
  principalId: string;
}

export interface DelegationRequest {
  channel: string;
  target: string;
  author: DelegationAuthor & { tier: "member" };
  title: string;
  task: string;
}

export interface DelegationJob {
  id: number;
  channel: string;
  target: string;
  author: DelegationAuthor & { tier: "member" };
  title: string;
  task: string;
  /** Wall-clock milliseconds since the Unix epoch. */
  startedAt: number;
}

export type DelegationOutcome = { ok: true; report: string } | { ok: false; error: string };

export interface DelegationContext {
  channel: string;
  author: DelegationAuthor;
  /** Aborts on the job's deadline or the delegator's disposal. */
  signal: AbortSignal;
}

export interface ScopedSandboxDelegatorOptions {
  target: string;
  /** 1 … 10 per channel (default 2). */
  maxRunning?: number;
  /** 1,000 … 1,200,000 ms (default 600,000). */
  timeoutMs?: number;
  /** Each a whole number of at least 1, or Infinity. */
  maxTitleChars?: number;
  maxReportChars?: number;
  diagnosticChars?: number;
  run: (task: string, ctx: DelegationContext) => string | Promise<string>;
  deliver: (job: DelegationJob, outcome: DelegationOutcome) => void | Promise<void>;
  logger: { error(message: string, fields: Record<string, unknown>): void };
  /** Path of libsbx.so (default: the bridge's, or $SBX_LIB). */
  library?: string;
}

/** A refusal of start(): "Delegation scope refused", "title and task are required", ... */
export class DelegationError extends Error {
  override name = "DelegationError";
}

// A declaration, not an arrow const: TypeScript's control flow treats only
// declared functions returning never as ending the path (TS2366 otherwise).
function rethrow(err: unknown): never {
  return rethrowAs(err, { DelegationError });
}

export class ScopedSandboxDelegator {
  private readonly owner: string;
  private readonly engine: ReturnType<typeof utilityEngine>;

  constructor(options: ScopedSandboxDelegatorOptions) {
    const o = (options ?? {}) as Partial<ScopedSandboxDelegatorOptions>;
    this.engine = utilityEngine(o.library);
    this.owner = ownerName("d");
    const logger = o.logger;
    const callbacks = {
      run: typeof o.run === "function",
      deliver: typeof o.deliver === "function",
      logger: logger !== null && typeof logger === "object" && typeof logger.error === "function",
    };
    this.engine.registerOwner(this.owner, (fn, args, signal) => {
      if (fn === "run") {
        const ctx = (args[1] ?? {}) as { channel: string; author: DelegationAuthor };
        return o.run!(String(args[0]), { channel: ctx.channel, author: ctx.author, signal });
      }
      if (fn === "deliver") return o.deliver!(args[0] as DelegationJob, args[1] as DelegationOutcome);
      if (fn === "logger.error") return logger!.error(String(args[0]), (args[1] ?? {}) as Record<string, unknown>);
      throw new Error(`no delegator callback ${fn}`);
    });
    const wire: Record<string, unknown> = {};
    for (const k of ["target", "maxRunning", "timeoutMs", "maxTitleChars", "maxReportChars", "diagnosticChars"]) {
      const v = (o as Record<string, unknown>)[k];
      if (v !== undefined) wire[k] = wireNumber(v);
    }
    try {
      this.engine.callSync({ type: "delegator.new", owner: this.owner, options: wire, callbacks });
    } catch (err) {
      this.engine.unregisterOwner(this.owner);
      rethrow(err);
    }
  }

  /** Starts a job (without waiting for it) or throws a DelegationError. */
  start(request: DelegationRequest): DelegationJob {
    const keys = request !== null && typeof request === "object" ? Object.keys(request) : [];
    try {
      return this.engine.callSync<DelegationJob>({ type: "delegator.start", owner: this.owner, request, keys });
    } catch (err) {
      rethrow(err);
    }
  }

  /** One channel key per tracked job (a channel with two jobs appears twice). */
  runningChannels(): string[] {
    try {
      const v = this.engine.callSync<unknown>({ type: "delegator.runningChannels", owner: this.owner });
      return Array.isArray(v) ? (v as string[]) : [];
    } catch (err) {
      rethrow(err);
    }
  }

  /** Resolves when every job tracked now has settled (delivered). */
  async idle(): Promise<void> {
    await this.engine.submit({ type: "delegator.idle", owner: this.owner }).catch(rethrow);
  }

  /** Refuses new work, aborts every job's signal, waits for them to settle. Idempotent. */
  async dispose(): Promise<void> {
    if (this.engine.closed) return;
    await this.engine.submit({ type: "delegator.dispose", owner: this.owner }).catch(rethrow);
  }
}
