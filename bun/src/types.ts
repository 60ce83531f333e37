// types.ts: the public TypeScript shapes of pi-roundtable-sandbox's Bun
// bridge. Option names follow the product README (`sandbox()` options) and
// spec/runtime.md section 2; event and admission shapes are those of
// lua/sandbox/app.lua, the app the engine runs.

/** The speaker a turn is bound to. `principalId` never reaches the worker. */
export interface SandboxSpeaker {
  id: string;
  name: string;
  principalId: string;
}

/** What `apiKey` receives before every model call. */
export interface SandboxCredentialScope {
  channel: string;
  speaker: SandboxSpeaker;
}

type MaybePromise<T> = T | Promise<T>;

/**
 * Host-side key getter, called on the JS thread before every model call.
 * `undefined`, `null`, `""`, a non-string, a throw or a rejection fails that
 * model call closed (the broker answers 502); there is never a fallback.
 * A zero-argument function works unchanged.
 */
export type SandboxApiKey = (scope: SandboxCredentialScope) => MaybePromise<string | undefined | null>;

/** The host login reader (`context.apiKey(provider)` in the product), used when no apiKey is set. */
export type SandboxHostLogin = (provider: string) => MaybePromise<string | undefined | null>;

/** Warm turns (spec/warm-turns.md 2). */
export interface SandboxWarm {
  /** Warm containers at most, one per channel (0-1024; 0 turns warm turns off). Default 16. */
  channels?: number;
  /** A warm container idle this long is removed (1000-86400000 ms). Default 600000. */
  idleMs?: number;
}

/** Per-container resource limits (spec/runtime.md 2.3). */
export interface SandboxLimits {
  memoryMb?: number;
  cpus?: number;
  pids?: number;
}

/** A JSON-schema object (model guidance, not a host-side validator). */
export type JsonSchema = { type: "object"; [key: string]: unknown };

/** What a host tool callback receives besides the guest's input. */
export interface HostToolContext {
  channel: string;
  speaker: SandboxSpeaker;
  signal: AbortSignal;
}

/**
 * A host tool. Host tools run as coroutines on the engine's loop, so their
 * `run` is Lua: define them in the Lua config (`config`). A `run` function
 * given here cannot cross the FFI bridge and is refused with a clear error.
 */
export interface HostTool {
  name: string;
  description: string;
  parameters: JsonSchema;
  run?: (input: unknown, context: HostToolContext) => MaybePromise<string>;
}

export interface McpToolSpec {
  name: string;
  description: string;
  parameters: JsonSchema;
}

/**
 * An MCP allow-list entry. An `apiKey` getter for the server lives in the Lua
 * config; servers given here are unauthenticated (no apiKey).
 */
export interface McpServer {
  name: string;
  url: string;
  tools: McpToolSpec[];
  apiKey?: (scope: SandboxCredentialScope) => MaybePromise<string | undefined>;
}

/** A message as the host's router sees it (lua/sandbox/app.lua EVENT SHAPE). */
export interface SandboxMessageEvent {
  type: "message";
  id?: string;
  /** Channel-key prefix; default "discord". */
  surface?: string;
  channelId: string;
  /** Absent or "" = a direct message. */
  guildId?: string | null;
  /** Informational only: threads are their own channel keys. */
  threadParentId?: string | null;
  author: { id: string; name: string; bot?: boolean; integration?: boolean };
  /** Set when an integration or webhook posted the message. */
  webhookId?: string | null;
  mentionsBot?: boolean;
  replyToBot?: boolean;
  text: string;
  /** The replied-to message's text, if any. */
  quoted?: string | null;
  /** Only counted, never fetched. */
  attachments?: unknown[] | null;
}

/** A slash command `/<rootCommand> sandbox on|off|status`. */
export interface SandboxCommandEvent {
  type: "command";
  surface?: string;
  channelId: string;
  guildId?: string | null;
  author: { id: string; name: string; bot?: boolean };
  command?: string;
  group?: "sandbox" | string;
  subcommand: "on" | "off" | "status" | string;
}

export type SandboxEvent = SandboxMessageEvent | SandboxCommandEvent;

/** The host's access rules for the author; null/undefined = not served (dropped). */
export interface SandboxAdmission {
  tier: string;
  principalId?: string;
  [key: string]: unknown;
}

/** The routing decision of the claim (pure, no side effect). */
export interface ClaimDecision {
  claim: boolean;
  priority: number;
  action?: "answer" | "drop" | "command";
}

/**
 * What `handle` returns for an answered message: the reply pieces (2,000
 * characters at most each). The text is the worker's, unchanged but for the
 * mention neutralising of `mentions = "neutral"` (a zero-width space after the
 * `@` of @everyone/@here and after the `<` of <@…>, <@&…>, <#…>): the chat
 * adapter renders it, and passes `allowedMentions` (then `{ parse: [] }`) to
 * Discord with every piece, so nothing in a reply pings anyone.
 */
export interface HandleResult {
  replies: string[];
  allowedMentions?: { parse: string[] };
}

/** What `command` returns: one ephemeral panel. */
export interface CommandResult {
  replies: string[];
  ephemeral: boolean;
}

export interface SandboxSubcommand {
  name: "on" | "off" | "status";
  description: string;
}

/** The `sandbox` subcommand group the host registers under its root command. */
export interface SandboxCommands {
  command: string;
  group: { name: "sandbox"; description: string; subcommands: SandboxSubcommand[] };
}

/**
 * The closed set of turn reasons (spec/operations.md 1; lua/sandbox/errors.lua
 * is the catalogue). Operator-facing only: guests see the generic texts.
 */
export type TurnReason =
  | "ok"
  | "upstream_status"
  | "upstream_unreachable"
  | "upstream_timeout"
  | "upstream_invalid"
  | "reflection"
  | "credential_missing"
  | "credential_error"
  | "budget_exhausted"
  | "tool_failed"
  | "model_no_text"
  | "model_filtered"
  | "context_budget"
  | "invalid_turn"
  | "memory_store"
  | "history"
  | "worker_failed"
  | "worker_oom"
  | "invalid_reply"
  | "deadline"
  | "stopped"
  | "cleanup_failed"
  | "daemon_unavailable"
  | "image_missing"
  // the hostile-guest bounds (README "Hardening against a hostile guest")
  | "workspace_quota"
  | "disk_low"
  | "host_descriptors"
  | "queue_full"
  | "state_write_failed"
  | (string & {});

/** `runtime.runTurn`'s result: the reply, or why the turn failed. */
export interface TurnResult {
  ok: boolean;
  /** The worker's text (its reply, or its own ok=false text), else the guest's failure text. */
  text: string;
  /** Decided by the host from what it observed; "ok" when the reply was delivered. */
  reason: TurnReason;
  /** The turn's id in the operator log. */
  turn?: string;
  /** What the operator does about it. */
  fix?: string;
  /** The catalogue message the turn ended with, when one was raised. */
  error?: string;
  /** The text a guest is shown for this outcome. */
  guest?: string;
  /** upstream_status: the route, the provider's status and its error tokens (never its message). */
  route?: string;
  status?: number;
  code?: string;
  type?: string;
  param?: string;
  /** The provider cut the reply at its length limit (spec/providers.md 3). */
  truncated?: boolean;
}

/** `SANDBOX.channels`: the channel state store (spec/runtime.md 7). */
export interface SandboxChannels {
  has(channel: string): Promise<boolean>;
  list(): Promise<string[]>;
  enable(channel: string): Promise<void>;
  disable(channel: string): Promise<void>;
}

/** `SANDBOX.runtime`: the sealed runtime (spec/runtime.md 5, 6). */
export interface SandboxRuntime {
  runTurn(channel: string, speaker: SandboxSpeaker, text: string): Promise<TurnResult>;
  startFresh(channel: string): Promise<void>;
  stop(channel: string): Promise<boolean>;
  busy(): Promise<string[]>;
  dispose(): Promise<void>;
  sweep(): Promise<number>;
}

/** The service other trusted plugins receive (id `sandbox.channels`). */
export interface SandboxService {
  id: "sandbox.channels";
  channels: SandboxChannels;
  runtime: SandboxRuntime;
}

export interface SandboxLifecycle {
  name: "sandbox-runtime";
  busy(): Promise<string[]>;
  stop(): Promise<void>;
}

export interface SandboxStatus {
  started: boolean;
  disposed: boolean;
  channels: string[];
  busy: string[];
  queued: Record<string, number>;
  engine: { abi: number; pending: number; submitted: number; queued: number; dropped: number; stopping: boolean };
}

/** A progress event of a message request, as the engine emits it. */
export interface SandboxProgressEvent {
  type: "event";
  request: number;
  name: string;
  [key: string]: unknown;
}

export interface SandboxOptions {
  /** Path of a trusted host Lua config script returning `sandbox { ... }` (host tools, MCP allow-lists, apiKey). */
  config?: string;

  image?: string;
  runRoot?: string;
  workspaceRoot?: string;
  stateFile?: string;
  provider?: string;
  model?: string;
  modelUrl?: string;
  /** Overrides the config's apiKey: answered on the JS thread before every model call. */
  apiKey?: SandboxApiKey;
  tools?: HostTool[];
  mcp?: McpServer[];
  limits?: SandboxLimits;
  turnTimeoutMs?: number;
  initialChannels?: string[];
  prompt?: string;
  uid?: number;
  gid?: number;
  /** Lets modelUrl and MCP urls use http: (offline tests only). */
  allowHttp?: boolean;
  /** How the model credential travels (spec/providers.md 1): Authorization: Bearer (default), `api-key` (Azure resource keys), or none at all (a local server; then no apiKey). */
  modelAuth?: "bearer" | "api-key" | "none";
  /** The output-token limit forced on every model call (1-200,000; default 4096). */
  maxOutputTokens?: number;
  /** The member that carries it: "max_tokens" (default) or "max_completion_tokens" (OpenAI/Azure reasoning models). */
  outputTokensField?: "max_tokens" | "max_completion_tokens";
  /** How many more times a model call answered 429/5xx, or never sent, is tried (0-5; default 2), after Retry-After or a jittered backoff. */
  upstreamRetries?: number;
  /** Further endpoints of the same wire format, tried in order once the one before is exhausted (at most 4). */
  modelFallbacks?: { modelUrl: string; model: string }[];
  /** The operator log's format on stderr (default "text"); ignored with `logger`. */
  logFormat?: "text" | "json";
  /** The lowest level logged (default "info"). */
  logLevel?: "debug" | "info" | "warn" | "error";
  /** One payload-free audit line per broker request (default true). */
  audit?: boolean;
  /** The engine's operator lines go here instead of stderr: each (message, fields); debug is optional. */
  logger?: SandboxLogger;
  /** The sealed containers' seccomp profile (absolute path); default: the shipped worker/seccomp.json. */
  seccompProfile?: string;
  /** A channel workspace's quota in MiB (default 256, 1-1048576): its turns are refused above it. */
  workspaceQuotaMb?: number;
  /** Free space kept on the roots' filesystems in MiB (default 1024, 0-1048576): below it every turn is refused. */
  diskReserveMb?: number;
  /** Guest turns waiting per channel (default 8, 1-1000); 2 per speaker. Beyond: the busy text. */
  maxQueuedTurns?: number;
  /** "neutral" (default): mentions in replies are made inert and allowedMentions is { parse: [] }; "allow": as written. */
  mentions?: "neutral" | "allow";
  /** The longest reply in characters (default and at most 100,000); a longer one fails the turn. */
  maxReplyChars?: number;
  /** Serve the Prometheus metrics on GET /metrics at this loopback address, e.g. "127.0.0.1:9464" (127.0.0.0/8 or [::1] only; spec/operations.md 4). */
  metricsListen?: string;
  /** Warm turns (spec/warm-turns.md): each channel's next container waits, fresh and unbound, for its next turn.
   *  Default { channels: 16, idleMs: 600000 }; channels 0-1024 (0: off), idleMs 1000-86400000. */
  warm?: SandboxWarm;
  /** The container runtime every sealed container runs under: a runtime the Docker daemon has registered, e.g. "runsc" (gVisor; `make deps RUNSC=1` registers it) or "crun"; default: the daemon's default runtime. A name outside ^[a-z][a-z0-9_.-]{0,63}$ rejects with `invalid container runtime`. */
  runtime?: string;

  // ---- the embedding host (not sandbox{} options) ----
  /** The host login reader used when neither this nor the config sets apiKey. */
  hostLogin?: SandboxHostLogin;
  /** The worker's time zone; default: this process's zone. */
  timeZone?: string;
  /** The host's root command (discord.rootCommand); default "roundtable". */
  rootCommand?: string;
  /** Whether a surface with slash commands is present (default true). */
  slashCommands?: boolean;
  /** Typing indicator for answered messages: called when a turn starts; the returned function when it ends. */
  typing?: (event: SandboxMessageEvent) => (() => void) | void;
  /** Every progress event of a message request (claim, typing, ...). */
  onEvent?: (event: SandboxProgressEvent) => void;

  // ---- where the engine comes from ----
  /** Path of libsbx.so; default $SBX_LIB, the package's native/, the checkout's build/, then libsbx.so.0. */
  library?: string;
  /** Directory of the engine's Lua tree; default $SBX_LUA_DIR, else next to libsbx.so. */
  luaDir?: string;
  /** The longest poll interval while requests are in flight (ms, default 5; 1 ms right after activity). */
  pollIntervalMs?: number;
}

/** Where the engine's operator log lines go (spec/operations.md 2). */
export interface SandboxLogger {
  debug?: (message: string, fields: Record<string, unknown>) => void;
  info: (message: string, fields: Record<string, unknown>) => void;
  warn: (message: string, fields: Record<string, unknown>) => void;
  error: (message: string, fields: Record<string, unknown>) => void;
}

/** The guest plugin object `sandbox()` resolves to. */
export interface SandboxPlugin {
  readonly name: "sandbox";
  readonly priority: 200;
  /** Pure routing decision (synchronous). */
  claim(event: SandboxEvent, admission?: SandboxAdmission | null): ClaimDecision;
  /** Whether the channel key is sandboxed (synchronous). */
  owns(channel: string): boolean;
  /** Runs the decided action: answers (a sealed turn), drops (null) or runs a command. */
  handle(event: SandboxEvent, admission?: SandboxAdmission | null): Promise<HandleResult | CommandResult | null>;
  /** `/<root> sandbox on|off|status`, owner-only, guild-only. */
  command(event: SandboxCommandEvent, admission?: SandboxAdmission | null): Promise<CommandResult>;
  /** The subcommand group to register (null without slash commands). */
  readonly commands: SandboxCommands | null;
  stop(channel: string): Promise<boolean>;
  startFresh(channel: string): Promise<"sandbox">;
  /** A background host turn in a sandbox channel is skipped with the fixed reason. */
  background(channel: string): Promise<{ skipped: true; reason: string } | null>;
  status(): Promise<SandboxStatus>;
  /** The Prometheus text exposition (format 0.0.4): turns by reason, phase histograms, broker and upstream counters, container gauges. */
  metrics(): Promise<string>;
  readonly services: { SANDBOX: SandboxService; lifecycle: SandboxLifecycle };
  /** Stops every turn, removes its containers and frees the engine. Idempotent. */
  dispose(): Promise<void>;
  readonly disposed: boolean;
  [Symbol.asyncDispose](): Promise<void>;
}
