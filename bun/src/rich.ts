// rich.ts: PiSandboxRuntime, rich mode for Bun hosts (shared/spec/rich-mode.md).
// The runtime itself runs in the engine (lua/sandbox/rich: option checks,
// channel directories and the alias guard, the long-lived container, the
// broker with its scopes, caps and filters); its callbacks are this host's
// JavaScript functions, called back with a turn's or a call's signal
// mirrored into an AbortSignal. Every method returns a promise.
//
//   const rt = new PiSandboxRuntime({ partyDir, image, profiles, oauthToken, effort: { judge } });
//   const rt2 = new PiSandboxRuntime({ config: "/etc/roundtable/rich.conf.lua", options: { ... } });
//   const r = await rt.runTurn({ channel, profile, turnId, author, text, images: [], signal });
//   if (r.ok) send(r.text, r.files);   // files: [{ name, data: Uint8Array }]
//   await rt.stopBrokers();             // host shutdown: containers keep running
//
// Through the bridge, fetchImpl answers whole bodies (a string or bytes), and
// a driver is either the built-in Docker one (`docker: { socket, log }`) or
// an object of async functions (ensureRunning, status, remove, logs?).
import { rethrowAs } from "./ffi.ts";
import { RICH_OPTION_NAMES, RICH_PLAIN_OPTIONS, type PiSandboxRuntimePlainOptions } from "./options.generated.ts";
import { ownerName, utilityEngine } from "./utility.ts";

export type PiThinkingLevel = "low" | "medium" | "high" | "xhigh";

export interface PiSpeaker {
  id: string;
  name: string;
  principalId?: string;
}

export interface PiCredentialScope {
  channel: string;
  speaker: { id: string; name: string; principalId: string };
}

export interface PiToolContext {
  channel: string;
  profile: string;
  speaker: { id: string; name: string; principalId: string };
  thinking: PiThinkingLevel;
  /** Wall-clock milliseconds since the Unix epoch by which the turn ends. */
  deadline?: number;
  signal: AbortSignal;
}

export interface PiToolResponse {
  ok: boolean;
  text?: string;
  error?: string;
  image?: { data: string; mimeType: string };
  privateTo?: string;
}

export interface PiFetchRequest {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string;
}

export interface PiFetchResponse {
  status: number;
  headers?: Record<string, string>;
  body?: string | Uint8Array;
}

export interface PiContainerSpec {
  name: string;
  image: string;
  channel: string;
  profile: string;
  timeZone: string;
  labelChannel: string;
  labelProfile: string;
  runDir: string;
  workspaceDir: string;
  uid: number;
  gid: number;
}

export interface PiContainerDriver {
  ensureRunning(spec: PiContainerSpec): unknown | Promise<unknown>;
  remove(name: string): unknown | Promise<unknown>;
  status(name: string): { state: "missing" | "running" | "stopped"; image?: string; profile?: string } | Promise<{ state: "missing" | "running" | "stopped"; image?: string; profile?: string }>;
  logs?(name: string, lines: number): string | Promise<string>;
}

export interface PiLogConfig {
  driver: string;
  options?: Record<string, string>;
}

export interface PiLogger {
  info(message: string, fields: Record<string, unknown>): void;
  warn(message: string, fields: Record<string, unknown>): void;
  error(message: string, fields: Record<string, unknown>): void;
}

/** A trusted Lua config script returning `sandbox.rich { ... }` (its callbacks are Lua functions). */
export interface PiSandboxRuntimeConfig {
  config: string;
  /** JSON handed to the script as its argument. */
  options?: Record<string, unknown>;
  library?: string;
}

/**
 * sandbox.rich{}'s options (spec/rich-mode.md 3). The plain ones and their
 * types come from the one Lua declaration (lua/sandbox/rich/_option_table.lua
 * TABLE, generated into options.generated.ts); the members below hold host
 * functions, or are the bridge's own (docker, library).
 */
export type { PiSandboxRuntimePlainOptions };
export interface PiSandboxRuntimeOptions extends PiSandboxRuntimePlainOptions {
  oauthToken: (scope: PiCredentialScope) => string | undefined | Promise<string | undefined>;
  memory?: {
    promptBlock?: (channel: string, id: string, name: string, principalId: string) => string | undefined | Promise<string | undefined>;
    visibility?: "private" | "shared";
  };
  effort: { judge: (text: string, ctx: { level?: PiThinkingLevel }) => PiThinkingLevel | Promise<PiThinkingLevel> };
  tools?: { names: string[]; call: (name: string, input: Record<string, unknown>, ctx: PiToolContext) => PiToolResponse | Promise<PiToolResponse> };
  mcp?: { servers: { name: string; url: string; tools: string[] }[]; token?: () => string | undefined | Promise<string | undefined> };
  /** Trusted transport override for offline tests; never a guest input. */
  fetchImpl?: (req: PiFetchRequest) => PiFetchResponse | Promise<PiFetchResponse>;
  /** The built-in Docker driver's settings (Engine API socket; log driver instead of journald). */
  docker?: { socket?: string; log?: PiLogConfig | ((channel: string) => PiLogConfig) };
  driver?: PiContainerDriver;
  logger?: PiLogger;
  compaction?: { engine: string; compact: (request: unknown, ctx: { channel: string; signal: AbortSignal }) => unknown; timeoutMs?: number; maxRequestBytes?: number };
  /** Path of libsbx.so (default: the bridge's, or $SBX_LIB). */
  library?: string;
}

export interface PiTurn {
  channel: string;
  profile: string;
  turnId: string;
  author: PiSpeaker;
  text: string;
  images?: { data: string; mimeType: string }[];
  signal?: AbortSignal;
}

export type PiTurnResult =
  | { ok: true; text: string; files: { name: string; data: Uint8Array }[] }
  | { ok: false; error: string; cause?: string };

const PLAIN = RICH_PLAIN_OPTIONS;
/** Every name the constructor takes: the engine's (generated) and the bridge's own. */
const KNOWN = new Set<string>([...RICH_OPTION_NAMES, "docker", "library"]);

// A declaration, not an arrow const: TypeScript's control flow treats only
// declared functions returning never as ending the path (TS2366 otherwise).
function rethrow(err: unknown): never {
  return rethrowAs(err, {});
}
const isFn = (v: unknown): v is (...a: unknown[]) => unknown => typeof v === "function";

function bodyBase64(body: unknown): string {
  if (body === undefined || body === null) return "";
  if (typeof body === "string") return Buffer.from(body, "utf8").toString("base64");
  if (body instanceof Uint8Array) return Buffer.from(body).toString("base64");
  throw new Error("fetchImpl must answer a string or Uint8Array body");
}

function reasonText(reason: unknown): string {
  if (reason instanceof Error) return reason.message || reason.name;
  return reason === undefined ? "aborted" : String(reason);
}

export class PiSandboxRuntime {
  private readonly owner: string;
  private readonly engine: ReturnType<typeof utilityEngine>;
  private disposed = false;

  /** Checks the options in the engine (section 3's order); throws its message. */
  constructor(options: PiSandboxRuntimeOptions | PiSandboxRuntimeConfig) {
    const o = (options ?? {}) as Partial<PiSandboxRuntimeOptions> & Partial<PiSandboxRuntimeConfig>;
    this.engine = utilityEngine(o.library);
    this.owner = ownerName("pi");
    if (o.config !== undefined) {
      if (typeof o.config !== "string" || o.config === "") throw new Error("PiSandboxRuntime: config must be a Lua file path");
      try {
        this.engine.callSync({ type: "rich.new", owner: this.owner, config: o.config, options: o.options ?? {} }, 30_000);
      } catch (err) {
        rethrow(err);
      }
      return;
    }
    for (const k of Object.keys(o)) {
      // the engine's own words (rich/_options.lua), before anything is registered
      if (!KNOWN.has(k)) throw new Error(`Invalid Pi sandbox option: ${k}`);
    }
    const wire: Record<string, unknown> = {};
    for (const k of PLAIN) if (o[k] !== undefined) wire[k] = o[k];
    if (o.memory) wire.memory = { visibility: o.memory.visibility };
    if (o.tools) wire.tools = { names: o.tools.names };
    if (o.mcp) wire.mcp = { servers: o.mcp.servers };
    if (o.compaction) wire.compaction = { engine: o.compaction.engine, timeoutMs: o.compaction.timeoutMs, maxRequestBytes: o.compaction.maxRequestBytes };
    const log = o.docker?.log;
    if (o.docker) wire.docker = { socket: o.docker.socket, log: isFn(log) ? undefined : log };
    const callbacks: Record<string, boolean> = {
      oauthToken: isFn(o.oauthToken),
      "effort.judge": isFn(o.effort?.judge),
      "memory.promptBlock": isFn(o.memory?.promptBlock),
      "tools.call": isFn(o.tools?.call),
      "mcp.token": isFn(o.mcp?.token),
      fetchImpl: isFn(o.fetchImpl),
      logger: !!o.logger && isFn(o.logger.info) && isFn(o.logger.warn) && isFn(o.logger.error),
      "compaction.compact": isFn(o.compaction?.compact),
      "driver.ensureRunning": !!o.driver && isFn(o.driver.ensureRunning),
      "driver.logs": !!o.driver && isFn(o.driver.logs),
      "docker.log": isFn(log),
    };
    this.engine.registerOwner(this.owner, async (fn, args, signal) => {
      switch (fn) {
        case "oauthToken": return (await o.oauthToken!(args[0] as PiCredentialScope)) ?? null;
        case "effort.judge": return o.effort!.judge(String(args[0]), (args[1] ?? {}) as { level?: PiThinkingLevel });
        case "memory.promptBlock": return (await o.memory!.promptBlock!(...(args as [string, string, string, string]))) ?? null;
        case "tools.call": return o.tools!.call(String(args[0]), (args[1] ?? {}) as Record<string, unknown>, { ...(args[2] as Omit<PiToolContext, "signal">), signal });
        case "mcp.token": return (await o.mcp!.token!()) ?? null;
        case "fetchImpl": {
          const r = await o.fetchImpl!(args[0] as PiFetchRequest);
          return { status: r.status, headers: r.headers ?? {}, bodyBase64: bodyBase64(r.body) };
        }
        case "logger.info": case "logger.warn": case "logger.error":
          return o.logger![fn.slice(7) as "info" | "warn" | "error"](String(args[0]), (args[1] ?? {}) as Record<string, unknown>);
        case "compaction.compact": return o.compaction!.compact(args[0], { ...(args[1] as { channel: string }), signal });
        case "driver.ensureRunning": return (await o.driver!.ensureRunning(args[0] as PiContainerSpec)) ?? null;
        case "driver.remove": return (await o.driver!.remove(String(args[0]))) ?? null;
        case "driver.status": return o.driver!.status(String(args[0]));
        case "driver.logs": return o.driver!.logs!(String(args[0]), Number(args[1]));
        case "docker.log": return (log as (c: string) => PiLogConfig)(String(args[0]));
      }
      throw new Error(`no Pi sandbox callback ${fn}`);
    });
    try {
      this.engine.callSync({ type: "rich.new", owner: this.owner, options: wire, callbacks }, 30_000);
    } catch (err) {
      this.engine.unregisterOwner(this.owner);
      rethrow(err);
    }
  }

  private call<T>(request: Record<string, unknown>): Promise<T> {
    if (this.disposed) return Promise.reject(new Error("PiSandboxRuntime is disposed"));
    return this.engine.submit<T>({ ...request, owner: this.owner }).catch(rethrow);
  }

  /** One turn (section 7); a `signal` abort cancels it (its container is removed). */
  async runTurn(turn: PiTurn): Promise<PiTurnResult> {
    const { signal, ...wire } = (turn ?? {}) as PiTurn;
    if (this.disposed) throw new Error("PiSandboxRuntime is disposed");
    const { id, result } = this.engine.send<{ ok: boolean; text?: string; files?: { name: string; dataBase64: string }[]; error?: string; cause?: string }>(
      { type: "rich.runTurn", owner: this.owner, turn: wire },
    );
    const onAbort = () => {
      if (id > 0 && !this.engine.closed) this.engine.submit({ type: "cancel", target: id, reason: reasonText(signal?.reason) }).catch(() => undefined);
    };
    if (signal?.aborted) onAbort();
    else signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const r = await result.catch(rethrow);
      if (!r.ok) return { ok: false, error: String(r.error ?? ""), ...(r.cause !== undefined ? { cause: String(r.cause) } : {}) };
      return {
        ok: true,
        text: String(r.text ?? ""),
        files: (r.files ?? []).map((f) => ({ name: f.name, data: new Uint8Array(Buffer.from(f.dataBase64, "base64")) })),
      };
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  start(channel: string, profile: string): Promise<void> {
    return this.call({ type: "rich.start", channel, profile }).then(() => undefined);
  }
  stop(channel: string): Promise<void> {
    return this.call({ type: "rich.stop", channel }).then(() => undefined);
  }
  startFresh(channel: string): Promise<void> {
    return this.call({ type: "rich.startFresh", channel }).then(() => undefined);
  }
  status(channel: string): Promise<{ state: "missing" | "running" | "stopped"; image?: string; profile?: string }> {
    return this.call({ type: "rich.status", channel });
  }
  sessionsDir(channel: string): Promise<string> {
    return this.call({ type: "rich.sessionsDir", channel });
  }
  attachmentDir(channel: string): Promise<string> {
    return this.call({ type: "rich.attachmentDir", channel });
  }
  /** Host shutdown: aborts running turns and stops every broker; containers keep running. */
  stopBrokers(): Promise<void> {
    return this.call({ type: "rich.stopBrokers" }).then(() => undefined);
  }
  /**
   * The runtime's Prometheus text exposition (docs/operations.md 6): its turns
   * as sbx_turns_total{mode="rich",reason}, with the turn reason the operator
   * log's `turn finished` line names, and its broker calls and refusals.
   */
  metrics(): Promise<string> {
    return this.call({ type: "rich.metrics" });
  }
  /** stopBrokers, then forgets the runtime in the engine. */
  async dispose(): Promise<void> {
    if (this.disposed || this.engine.closed) return;
    await this.engine.submit({ type: "rich.dispose", owner: this.owner }).catch(rethrow);
    this.disposed = true;
    this.engine.unregisterOwner(this.owner);
  }
}
