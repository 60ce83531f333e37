// pi-roundtable-sandbox: sealed guest channels for a chat bot, embedded in a
// Bun plugin. `sandbox(options)` loads libsbx.so through bun:ffi (src/ffi.ts),
// starts the engine (its own thread: a Lua state and a libuv loop running
// lua/sandbox/app.lua) on the operator's Lua config plus the TypeScript
// options, and resolves to the guest plugin object: the claim, the
// `/<root> sandbox on|off|status` commands and the SANDBOX service that other
// trusted plugins use.
//
//   const plugin = await sandbox({ config: "./sandbox.conf.lua", apiKey: ({ channel }) => keys.get(channel) });
//   const decision = plugin.claim(event, admission);      // { claim, priority: 200, action }
//   const result = await plugin.handle(event, admission); // { replies: [...] } | null
//   await plugin.services.SANDBOX.channels.enable("discord:123");
//   await plugin.dispose();
//
// Every engine error (a config error, an option refused by sandbox{}, a
// refused turn) rejects or throws an Error whose message is the Lua message,
// e.g. "unknown sandbox option: bogus" or "turnTimeoutMs must be 1000 to 600000".
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Engine, type Output } from "./ffi.ts";
import { SANDBOX_JSON_OPTIONS } from "./options.generated.ts";
import type {
  ClaimDecision,
  CommandResult,
  HandleResult,
  SandboxAdmission,
  SandboxChannels,
  SandboxCommandEvent,
  SandboxCommands,
  SandboxCredentialScope,
  SandboxEvent,
  SandboxLifecycle,
  SandboxOptions,
  SandboxPlugin,
  SandboxRuntime,
  SandboxService,
  SandboxSpeaker,
  SandboxStatus,
  TurnResult,
} from "./types.ts";

export type * from "./types.ts";
export { libraryPath } from "./ffi.ts";
export {
  assertPublicUrl,
  DecodeError,
  FetchTimeoutError,
  isPublicAddress,
  isUnsafeUrlError,
  pinnedTransport,
  ResolveError,
  ResponseTooLargeError,
  safeFetch,
  scrubDiagnostic,
  TransportError,
  UnsafeUrlError,
} from "./fetch.ts";
export type {
  AssertPublicUrlOptions,
  LocalAddressesSeam,
  LookupAddress,
  ResolveSeam,
  SafeFetchOptions,
  SafeFetchResult,
  TransportResult,
  TransportSeam,
} from "./fetch.ts";
export { DelegationError, ScopedSandboxDelegator } from "./delegator.ts";
export type {
  DelegationAuthor,
  DelegationContext,
  DelegationJob,
  DelegationOutcome,
  DelegationRequest,
  ScopedSandboxDelegatorOptions,
} from "./delegator.ts";
export { ConfigError, ResearchError, SandboxResearchWorker } from "./research.ts";
export type {
  AssistantMessage,
  ResearchExtensionApi,
  ResearchModelRuntime,
  ResearchRequest,
  ResearchToolSpec,
  SandboxResearchWorkerOptions,
  ThinkingLevel,
} from "./research.ts";
export { precheckScriptRunner } from "./precheck.ts";
export type {
  PrecheckContext,
  PrecheckSchedule,
  PrecheckScope,
  PrecheckScriptRunner,
  PrecheckScriptRunnerOptions,
} from "./precheck.ts";
export { disposeUtilityEngine } from "./utility.ts";
export { PiSandboxRuntime } from "./rich.ts";
export type {
  PiContainerDriver,
  PiContainerSpec,
  PiCredentialScope,
  PiFetchRequest,
  PiFetchResponse,
  PiLogConfig,
  PiLogger,
  PiSandboxRuntimeConfig,
  PiSandboxRuntimeOptions,
  PiSandboxRuntimePlainOptions,
  PiSpeaker,
  PiThinkingLevel,
  PiToolContext,
  PiToolResponse,
  PiTurn,
  PiTurnResult,
} from "./rich.ts";

/** The claim's name and priority (the core agent-server claim is 100). */
export const CLAIM_NAME = "sandbox";
export const CLAIM_PRIORITY = 200;
export const SERVICE_ID = "sandbox.channels";
export const LIFECYCLE_NAME = "sandbox-runtime";
export const DEFAULT_ROOT_COMMAND = "roundtable";

/** The texts of the `sandbox` group (lua/sandbox/channels/commands.lua). */
const GROUP_DESCRIPTION = "Manage this channel's sealed guest agent";
const SUBCOMMANDS = [
  { name: "on", description: "Route mentions and replies into a sealed container" },
  { name: "off", description: "Disable sandbox routing; keep channel memory" },
  { name: "status", description: "Show whether this channel is sandboxed" },
] as const;

/**
 * sandbox{} options that travel to the engine as JSON (options_json.sandbox):
 * generated from the sealed mode's one Lua declaration
 * (lua/sandbox/runtime/_option_table.lua) into options.generated.ts.
 */
const SANDBOX_KEYS = SANDBOX_JSON_OPTIONS;

/** Options of this bridge itself (everything else is refused like sandbox{} does). */
const BRIDGE_KEYS = new Set<string>([
  ...SANDBOX_KEYS,
  "config",
  "apiKey",
  "hostLogin",
  "timeZone",
  "rootCommand",
  "slashCommands",
  "typing",
  "onEvent",
  "library",
  "luaDir",
  "pollIntervalMs",
  "logger",
]);

/** The levels of the engine's operator log (spec/operations.md 2). */
const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
const LOGGER_ERROR = "logger must be a table of functions {debug?, info, warn, error}";

const DEFAULT_CONFIG = fileURLToPath(new URL("./options.conf.lua", import.meta.url));

function hostTimeZone(): string {
  const tz = process.env.TZ?.replace(/^:/, "");
  if (tz) return tz;
  try {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (zone && zone !== "Etc/Unknown") return zone;
  } catch {
    // fall through
  }
  return "UTC";
}

/** The sandbox{} options as JSON; refuses what cannot cross the bridge. */
function sandboxJson(o: SandboxOptions): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of SANDBOX_KEYS) {
    const v = o[k];
    if (v !== undefined) out[k] = v;
  }
  if (o.tools !== undefined) {
    if (!Array.isArray(o.tools)) throw new Error("invalid or duplicate host tool");
    for (const t of o.tools) {
      if (t && typeof t === "object" && typeof (t as { run?: unknown }).run === "function") {
        throw new Error(
          `host tool ${String(t.name)}: a TypeScript run function cannot cross the FFI bridge; ` +
            "define host tools in the Lua config (the config option)",
        );
      }
    }
  }
  if (o.mcp !== undefined) {
    if (!Array.isArray(o.mcp)) throw new Error("invalid or duplicate MCP server/tool");
    for (const s of o.mcp) {
      if (s && typeof s === "object" && s.apiKey !== undefined) {
        throw new Error(
          `MCP server ${String(s.name)}: an apiKey getter cannot cross the FFI bridge; ` +
            "define authenticated MCP servers in the Lua config (the config option)",
        );
      }
    }
  }
  return out;
}

function scopeOf(raw: unknown): SandboxCredentialScope {
  const s = (raw ?? {}) as { channel?: unknown; speaker?: Record<string, unknown> };
  const sp = s.speaker ?? {};
  const speaker: SandboxSpeaker = {
    id: String(sp.id ?? ""),
    name: String(sp.name ?? ""),
    principalId: String(sp.principalId ?? ""),
  };
  // A fresh copy per call: mutating it changes nothing.
  return { channel: String(s.channel ?? ""), speaker };
}

/** runTurn's value: the reply, and the turn's reason (spec/operations.md 1). */
function turnResult(v: unknown): TurnResult {
  const r = (v ?? {}) as Record<string, unknown>;
  const out: TurnResult = {
    ok: r.ok === true,
    text: typeof r.text === "string" ? r.text : "",
    reason: typeof r.reason === "string" ? r.reason : r.ok === true ? "ok" : "worker_failed",
  };
  for (const k of ["turn", "fix", "error", "guest", "route", "code", "type", "param"] as const) {
    if (typeof r[k] === "string") out[k] = r[k] as string;
  }
  if (typeof r.status === "number") out.status = r.status;
  if (r.truncated === true) out.truncated = true;
  return out;
}

function asArray<T>(v: unknown): T[] {
  return Array.isArray(v) ? (v as T[]) : [];
}

/** Disposes a started app's engine that sandbox() will not hand out. */
async function stopEngine(engine: Engine): Promise<void> {
  try {
    await engine.submit({ type: "service", op: "dispose" });
  } catch {
    // the engine stops it anyway
  } finally {
    engine.free();
  }
}

/**
 * Loads the engine and returns the guest plugin. Rejects with the Lua
 * message when the config or an option is refused, and when the daemon
 * lacks the configured image (the message names this installation's build
 * command) or cannot be asked.
 */
export async function sandbox(options: SandboxOptions = {}): Promise<SandboxPlugin> {
  if (options === null || typeof options !== "object") throw new Error("sandbox options must be an object");
  for (const k of Object.keys(options)) {
    if (!BRIDGE_KEYS.has(k)) throw new Error(`unknown sandbox option: ${k}`);
  }
  if (options.apiKey !== undefined && typeof options.apiKey !== "function") {
    throw new Error("apiKey must be a function");
  }
  if (options.hostLogin !== undefined && typeof options.hostLogin !== "function") {
    throw new Error("hostLogin must be a function");
  }
  if (options.config !== undefined && (typeof options.config !== "string" || options.config === "")) {
    throw new Error("config must be the path of a Lua config script");
  }
  const logger = options.logger;
  if (logger !== undefined) {
    if (logger === null || typeof logger !== "object") throw new Error(LOGGER_ERROR);
    for (const k of Object.keys(logger)) {
      if (!(LOG_LEVELS as readonly string[]).includes(k)) throw new Error(LOGGER_ERROR);
    }
    for (const k of ["info", "warn", "error"] as const) {
      if (typeof logger[k] !== "function") throw new Error(LOGGER_ERROR);
    }
    if (logger.debug !== undefined && typeof logger.debug !== "function") throw new Error(LOGGER_ERROR);
  }
  const apiKey = options.apiKey;
  const hostLogin = options.hostLogin;
  const rootCommand = options.rootCommand ?? DEFAULT_ROOT_COMMAND;
  const slashCommands = options.slashCommands ?? true;

  const engineOptions: Record<string, unknown> = {
    sandbox: sandboxJson(options),
    host: { timeZone: options.timeZone ?? hostTimeZone(), rootCommand, slashCommands },
  };
  if (apiKey) engineOptions.apiKey = "host";
  if (hostLogin) engineOptions.hostLogin = true;
  if (options.luaDir) engineOptions.luaDir = options.luaDir;
  if (logger) engineOptions.logger = true;

  const typingStops = new Map<number, () => void>();

  const engine = new Engine({
    library: options.library,
    config: options.config ? resolve(options.config) : DEFAULT_CONFIG,
    options: engineOptions,
    pollIntervalMs: options.pollIntervalMs,
    onKeyRequest: async (req) => {
      // On the JS thread, before every model call; anything but a non-empty
      // string fails that call closed.
      if (req.scope != null && apiKey) {
        const v = await apiKey(scopeOf(req.scope));
        return typeof v === "string" && v !== "" ? v : null;
      }
      if (req.provider != null && hostLogin) {
        const v = await hostLogin(String(req.provider));
        return typeof v === "string" && v !== "" ? v : null;
      }
      return null;
    },
    onEvent: (ev) => options.onEvent?.(ev),
  });
  if (logger) {
    // The engine's operator lines: (message, fields), never a payload.
    engine.registerOwner("logger", (fn, args) => {
      const write = (logger as unknown as Record<string, unknown>)[fn];
      if (typeof write !== "function") return;
      const fields = (args[1] !== null && typeof args[1] === "object" ? args[1] : {}) as Record<string, unknown>;
      (write as (m: string, f: Record<string, unknown>) => void)(String(args[0] ?? ""), fields);
    });
  }

  // spec/operations.md 6: the configured image must exist before the first
  // turn; a driver that cannot tell (a custom one) is not asked.
  type ImageCheck = { checked?: boolean; present?: boolean; error?: string } | null;
  let image: ImageCheck = null;
  try {
    image = await engine.submit<ImageCheck>({ type: "image" });
  } catch (err) {
    await stopEngine(engine);
    throw err;
  }
  if (image?.checked && image.present === false) {
    await stopEngine(engine);
    throw new Error(image.error ?? "the sandbox image is missing");
  }

  // Progress events of one message request: typing on/off (the host's
  // indicator), everything to onEvent.
  const progress = (ev: Output & { type: "event" }, event: SandboxEvent) => {
    if (ev.name === "typing") {
      if (ev.on === true) {
        let stop: (() => void) | void = undefined;
        try {
          if (options.typing && event.type === "message") stop = options.typing(event);
        } catch {
          // the host's indicator never fails a turn
        }
        if (typeof stop === "function") typingStops.set(ev.request, stop);
      } else {
        const stop = typingStops.get(ev.request);
        typingStops.delete(ev.request);
        try {
          stop?.();
        } catch {
          // ignored, as above
        }
      }
    }
    options.onEvent?.(ev as never);
  };

  const service = (op: string, ...args: unknown[]) => engine.submit({ type: "service", op, args });

  const channels: SandboxChannels = {
    has: (channel) => service("has", channel).then(Boolean),
    list: () => service("list").then((v) => asArray<string>(v)),
    enable: (channel) => service("enable", channel).then(() => undefined),
    disable: (channel) => service("disable", channel).then(() => undefined),
  };
  const runtime: SandboxRuntime = {
    runTurn: (channel, speaker, text) =>
      service("runTurn", channel, { id: speaker.id, name: speaker.name, principalId: speaker.principalId }, text).then(
        (v) => turnResult(v),
      ),
    startFresh: (channel) => service("startFresh", channel).then(() => undefined),
    stop: (channel) => service("stop", channel).then((v) => v === true),
    busy: () => service("busy").then((v) => asArray<string>(v)),
    dispose: () => service("dispose").then(() => undefined),
    sweep: () => service("sweep").then((v) => (typeof v === "number" ? v : 0)),
  };
  const SANDBOX: SandboxService = { id: SERVICE_ID, channels, runtime };

  let disposing: Promise<void> | null = null;
  const dispose = (): Promise<void> => {
    if (disposing) return disposing;
    disposing = (async () => {
      if (engine.closed) return;
      try {
        // Through the loop first, so running turns end and their containers
        // are removed while this thread still answers apiKey requests.
        await engine.submit({ type: "service", op: "dispose" });
      } catch {
        // the engine stops it anyway
      } finally {
        engine.free();
        for (const stop of typingStops.values()) stop();
        typingStops.clear();
      }
    })();
    return disposing;
  };

  const lifecycle: SandboxLifecycle = {
    name: LIFECYCLE_NAME,
    busy: runtime.busy,
    stop: dispose,
  };

  const commands: SandboxCommands | null = slashCommands
    ? {
        command: rootCommand,
        group: {
          name: "sandbox",
          description: GROUP_DESCRIPTION,
          subcommands: SUBCOMMANDS.map((s) => ({ name: s.name, description: s.description })),
        },
      }
    : null;

  const plugin: SandboxPlugin = {
    name: CLAIM_NAME,
    priority: CLAIM_PRIORITY,
    claim(event: SandboxEvent, admission?: SandboxAdmission | null): ClaimDecision {
      return engine.callSync<ClaimDecision>({ type: "claim", event, admission: admission ?? null });
    },
    owns(channel: string): boolean {
      return engine.callSync<boolean>({ type: "owns", channel }) === true;
    },
    async handle(event, admission) {
      const value = await engine.submit<{ claim: ClaimDecision; result: HandleResult | CommandResult | null }>(
        { type: "message", event, admission: admission ?? null },
        (ev) => progress(ev, event),
      );
      return value?.result ?? null;
    },
    command(event: SandboxCommandEvent, admission?: SandboxAdmission | null) {
      return engine.submit<CommandResult>({ type: "command", event, admission: admission ?? null });
    },
    commands,
    stop: (channel) => engine.submit({ type: "stop", channel }).then((v) => v === true),
    startFresh: (channel) => engine.submit({ type: "startFresh", channel }).then(() => "sandbox" as const),
    background: (channel) =>
      engine
        .submit<{ skipped: true; reason: string } | null>({ type: "background", channel })
        .then((v) => v ?? null),
    status: () => engine.submit<SandboxStatus>({ type: "status" }),
    metrics: () => engine.submit<string>({ type: "metrics" }).then((v) => String(v)),
    services: { SANDBOX, lifecycle },
    dispose,
    get disposed() {
      return engine.closed;
    },
    [Symbol.asyncDispose]: dispose,
  };
  return plugin;
}

export default sandbox;
