// ffi.ts: bun:ffi bindings of core/sbx_ffi.h and the Engine that carries
// JSON requests to the engine thread and results back to the JS thread.
//
// How results cross threads
// -------------------------
// The engine runs its Lua state and libuv loop on a thread of its own. The
// ABI offers two ways out: a result callback called ON THE ENGINE THREAD with
// a `json` pointer valid only during that call, or a queue drained with
// sbx_engine_poll (plus an eventfd). A bun:ffi JSCallback with
// `threadsafe: true` does not run the JS function during the C call: it
// queues the call to the JS thread and returns at once, so by the time JS
// reads `json` the library may have freed it (a use-after-free: a C thread
// calling such a callback with a stack buffer showed garbage in JS). So this
// bridge uses the polling
// mode: sbx_engine_new gets no callback, and while any request is in flight
// a timer on the JS thread drains sbx_engine_poll, copying each output into
// a JS string before sbx_free: 1 ms after a submit or an output, backing off
// (doubling) to `pollIntervalMs` (5 ms by default) while nothing arrives, so
// quick requests answer in about a millisecond and a long turn costs a poll
// call every 5 ms.
// With nothing in flight the timer is cleared, so an idle engine keeps
// neither the CPU nor the process's event loop busy. Every call into the
// library except sbx_engine_new (construction) and sbx_engine_call (the
// synchronous, pure claim) returns after a mutex hand-off.
import { CString, dlopen, FFIType, linkSymbols, ptr, type Pointer } from "bun:ffi";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const ABI_VERSION = 1;
/** SBX_FFI_APIKEY_TIMEOUT_MS: the engine fails an unanswered key request closed after this. */
export const APIKEY_TIMEOUT_MS = 30_000;

/** Negative codes of sbx_engine_submit / sbx_engine_call (core/sbx_ffi.h). */
export const CODES: Record<number, string> = {
  [-1001]: "SBX_EINVAL: invalid request",
  [-1003]: "SBX_ETOOBIG: request over 4 MiB",
  [-1010]: "SBX_ESTOPPED: the engine is stopping or stopped",
  [-1011]: "SBX_EBUSY: too many requests queued",
  [-1012]: "SBX_ETHREAD: blocking call on the engine thread",
  [-1013]: "SBX_ETIMEOUT: no result in time",
  [-12]: "ENOMEM",
};

const SYMBOLS = {
  sbx_ffi_abi_version: { args: [], returns: FFIType.i32 },
  sbx_engine_new: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.ptr],
    returns: FFIType.ptr,
  },
  sbx_engine_submit: { args: [FFIType.ptr, FFIType.ptr, FFIType.u64], returns: FFIType.i64 },
  sbx_engine_poll: { args: [FFIType.ptr], returns: FFIType.ptr },
  sbx_engine_fd: { args: [FFIType.ptr], returns: FFIType.i32 },
  sbx_engine_call: {
    args: [FFIType.ptr, FFIType.ptr, FFIType.u64, FFIType.i32, FFIType.ptr],
    returns: FFIType.ptr,
  },
  sbx_engine_status: { args: [FFIType.ptr], returns: FFIType.ptr },
  sbx_engine_stop: { args: [FFIType.ptr], returns: FFIType.void },
  sbx_engine_free: { args: [FFIType.ptr], returns: FFIType.void },
  sbx_free: { args: [FFIType.ptr], returns: FFIType.void },
} as const;

/** The bound functions of SYMBOLS, as this bridge calls them. */
export interface Lib {
  sbx_ffi_abi_version(): number;
  sbx_engine_new(config: Pointer, options: Pointer, cb: Pointer | null, user: Pointer | null, errorOut: Pointer): Pointer | null;
  sbx_engine_submit(e: Pointer, json: Pointer, len: number): number | bigint;
  sbx_engine_poll(e: Pointer): Pointer | null;
  sbx_engine_fd(e: Pointer): number;
  sbx_engine_call(e: Pointer, json: Pointer, len: number, timeoutMs: number, codeOut: Pointer): Pointer | null;
  sbx_engine_status(e: Pointer): Pointer | null;
  sbx_engine_stop(e: Pointer): void;
  sbx_engine_free(e: Pointer): void;
  sbx_free(p: Pointer | null): void;
}

interface LibC {
  dlopen(path: Pointer, mode: number): Pointer | null;
  dlsym(handle: Pointer, name: Pointer): Pointer | null;
  dlerror(): Pointer | null;
}

// Why not bun:ffi's own dlopen: the bun executable exports ~300 `uv_*`
// symbols of its own (stubs for N-API modules, several of which panic with
// "unsupported uv function", e.g. uv_cond_init). A library opened with the
// default flags binds its libuv calls to those stubs, since the executable
// comes first in the global lookup scope, and the engine thread aborts the
// process. libc's dlopen with RTLD_DEEPBIND puts libsbx.so's own dependency
// chain (the real libuv.so.1, liblua5.4, libcurl) ahead of the executable,
// and the symbols are then bound with linkSymbols.
const RTLD_NOW = 0x2;
const RTLD_DEEPBIND = 0x8;
let libc: LibC | null = null;

/** A dlopen failure (deepOpen), told apart from a wrong library. */
class LoadError extends Error {}

function deepOpen(path: string): Lib {
  const c: LibC = (libc ??= dlopen("libc.so.6", {
    dlopen: { args: [FFIType.ptr, FFIType.i32], returns: FFIType.ptr },
    dlsym: { args: [FFIType.ptr, FFIType.ptr], returns: FFIType.ptr },
    dlerror: { args: [], returns: FFIType.ptr },
  }).symbols as unknown as LibC);
  const h = c.dlopen(ptr(cstr(path)), RTLD_NOW | RTLD_DEEPBIND);
  if (!h) {
    const e = c.dlerror();
    throw new LoadError(`cannot load ${path}: ${e ? new CString(e).toString() : "dlopen failed"}`);
  }
  const defs: Record<string, unknown> = {};
  for (const [name, def] of Object.entries(SYMBOLS)) {
    const p = c.dlsym(h, ptr(cstr(name)));
    if (!p) throw new Error(`${path} lacks ${name}: not an sbx_ffi engine library`);
    defs[name] = { ...def, ptr: p };
  }
  // The handle stays open for the life of the process (engines may outlive any one caller).
  return linkSymbols(defs as never).symbols as unknown as Lib;
}

/** The system library path's name of the engine library (its SONAME). */
export const SYSTEM_LIBRARY = "libsbx.so.0";

/** This package's root directory (the one holding package.json, src/, native/). */
export const PACKAGE_ROOT = dirname(dirname(fileURLToPath(import.meta.url)));

/** One place libsbx.so is looked for (libraryCandidates). */
export interface LibraryCandidate {
  /** What the place is, for the error that lists them. */
  where: string;
  /** A path, or SYSTEM_LIBRARY for the system library path. */
  path: string;
}

/**
 * Where libsbx.so is looked for, in order (spec/operations.md 6): $SBX_LIB;
 * the package's own native/libsbx.so (filled by `bun run build` or the
 * install script: scripts/build.ts); inside the engine's checkout, its
 * build/libsbx.so (what `make` built, so the checkout needs no copy); then
 * the system library path (libsbx.so.0, `make install` and ldconfig).
 */
export function libraryCandidates(): LibraryCandidate[] {
  const out: LibraryCandidate[] = [];
  const env = process.env.SBX_LIB;
  if (env) out.push({ where: "SBX_LIB", path: env });
  out.push({ where: "the package's native/", path: join(PACKAGE_ROOT, "native", "libsbx.so") });
  const checkout = join(PACKAGE_ROOT, "..");
  if (existsSync(join(checkout, "core", "sbx_ffi.h")) && existsSync(join(checkout, "Makefile"))) {
    out.push({ where: "the engine checkout's build/", path: join(checkout, "build", "libsbx.so") });
  }
  out.push({ where: "the system library path", path: SYSTEM_LIBRARY });
  return out;
}

/**
 * The library a load would open: the option; else $SBX_LIB when set; else
 * the first candidate that exists, or SYSTEM_LIBRARY (resolved by dlopen).
 */
export function libraryPath(explicit?: string): string {
  if (explicit) return explicit;
  const env = process.env.SBX_LIB;
  if (env) return env;
  for (const c of libraryCandidates()) {
    if (c.path === SYSTEM_LIBRARY || existsSync(c.path)) return c.path;
  }
  return SYSTEM_LIBRARY;
}

const loaded = new Map<string, Lib>();

/** The error of a failed lookup: every place tried, and the fixes. */
function notFound(tried: string[]): Error {
  return new Error(
    `libsbx.so not found; looked in ${tried.join(", ")}; ` +
      `run \`bun run build\` in ${PACKAGE_ROOT} (copies an installed or built libsbx.so into native/), ` +
      "install the engine (`make install` in its checkout), or set SBX_LIB",
  );
}

/** dlopens libsbx.so once per path and checks its ABI version. */
export function loadLibrary(explicit?: string): Lib {
  if (explicit) {
    if (!existsSync(explicit)) {
      throw new Error(`libsbx.so not found at ${explicit}; run \`make\` in the engine checkout or set SBX_LIB`);
    }
    return openChecked(explicit);
  }
  const env = process.env.SBX_LIB;
  if (env) {
    if (!existsSync(env)) {
      throw new Error(
        `libsbx.so not found at ${env} (SBX_LIB); fix SBX_LIB, or unset it to use the package's native/ or the system library`,
      );
    }
    return openChecked(env);
  }
  const tried: string[] = ["SBX_LIB (not set)"];
  for (const c of libraryCandidates()) {
    if (c.path !== SYSTEM_LIBRARY) {
      if (existsSync(c.path)) return openChecked(c.path);
      tried.push(`${c.path} (${c.where}: missing)`);
      continue;
    }
    try {
      return openChecked(c.path);
    } catch (err) {
      if (!(err instanceof LoadError)) throw err;
      tried.push(`${c.where} (${err.message})`);
    }
  }
  throw notFound(tried);
}

function openChecked(path: string): Lib {
  const cached = loaded.get(path);
  if (cached) return cached;
  const lib = deepOpen(path);
  const abi = lib.sbx_ffi_abi_version();
  if (abi !== ABI_VERSION) {
    throw new Error(`${path} speaks sbx_ffi ABI ${abi}; this bridge needs ${ABI_VERSION}`);
  }
  loaded.set(path, lib);
  return lib;
}

const encoder = new TextEncoder();

/** NUL-terminated UTF-8 copy of s (kept alive by the caller during the call). */
function cstr(s: string): Uint8Array {
  const bytes = encoder.encode(s);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** Copies a library-owned string into JS and frees it. */
function take(lib: Lib, p: Pointer | null): string | null {
  if (!p) return null;
  try {
    return new CString(p).toString();
  } finally {
    lib.sbx_free(p);
  }
}

function codeError(code: number | bigint): Error {
  const n = Number(code);
  return new Error(CODES[n] ?? `sbx error ${n}`);
}

/** One output of the engine (core/sbx_ffi.h "Output JSON"). */
export type Output =
  | { type: "result"; request: number; ok: true; value: unknown }
  | { type: "result"; request: number; ok: false; error: string }
  | { type: "result"; request: number; ok: false; error: string; errorInfo?: ErrorInfo }
  | { type: "apiKey.request"; request: 0; id: number; provider?: string; scope?: unknown }
  | { type: "callback.request"; request: 0; id: number; owner: string; fn: string; args: unknown[] }
  | { type: "callback.abort"; request: 0; id: number; owner: string; reason: string; abandoned?: boolean }
  | { type: "event"; request: number; name: string; [key: string]: unknown };

/** A structured Lua error (safe fetch's catalogue, DelegationError). */
export interface ErrorInfo {
  name?: string;
  message: string;
  code?: string;
  status?: number;
  headers?: Record<string, string>;
}

/** An engine error: the Lua message, plus errorInfo when the error was structured. */
export class EngineError extends Error {
  readonly info?: ErrorInfo;
  constructor(message: string, info?: ErrorInfo) {
    super(message);
    this.info = info;
  }
}

/**
 * Rethrows an engine error as the class registered for its errorInfo name
 * (DelegationError, ResearchError, ...), any other engine error as a plain
 * Error with the Lua message, and anything else unchanged.
 */
export function rethrowAs(err: unknown, classes: Record<string, new (message: string) => Error>): never {
  if (err instanceof EngineError) {
    const cls = err.info?.name !== undefined ? classes[err.info.name] : undefined;
    throw cls ? new cls(err.message) : new Error(err.message);
  }
  throw err;
}

/**
 * The host functions of one owner (a safe fetch's seams, a delegator's
 * callbacks), called by callback.request events. args are the JSON
 * arguments; signal aborts on callback.abort. A one-way call (a logger
 * line) gets a signal that never aborts and its result is ignored.
 */
export type HostCallHandler = (fn: string, args: unknown[], signal: AbortSignal) => unknown;

/** What an error thrown by a host function becomes on the Lua side. */
function callError(err: unknown): { name: string; message: string; code?: string } {
  if (err !== null && typeof err === "object" && typeof (err as { message?: unknown }).message === "string") {
    const e = err as { name?: unknown; message: string; code?: unknown };
    const out: { name: string; message: string; code?: string } = {
      name: typeof e.name === "string" ? e.name : "Error",
      message: e.message,
    };
    if (typeof e.code === "string") out.code = e.code;
    return out;
  }
  return { name: "Error", message: String(err) };
}

interface Pending {
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
  onEvent?: (ev: Output & { type: "event" }) => void;
}

export interface EngineInit {
  library?: string;
  /** The Lua config script; null makes a utility engine without an app (host facilities only). */
  config: string | null;
  options: Record<string, unknown>;
  pollIntervalMs?: number;
  /** apiKey.request events (request 0): the answer's key, or null to fail closed. */
  onKeyRequest: (req: Output & { type: "apiKey.request" }) => Promise<string | null>;
  /** Events of no pending request (or whose request has no listener). */
  onEvent?: (ev: Output & { type: "event" }) => void;
}

/** Live engines, for tests that look for leaks and for the exit hook. */
export const liveEngines = new Set<Engine>();

// A process that exits without dispose() still stops its engines: running
// turns end and their exact containers are removed before the process goes
// (sbx_engine_stop blocks until then). Registered once, on the first engine.
let exitHook = false;
function hookExit(): void {
  if (exitHook) return;
  exitHook = true;
  process.once("exit", () => {
    for (const e of [...liveEngines]) e.free();
  });
}

/**
 * One sbx_engine: submit JSON requests, get a promise of their result. The
 * constructor blocks while the config script runs and the app starts, and
 * throws the Lua error message when that fails.
 */
export class Engine {
  private lib: Lib;
  private handle: Pointer | null;
  private pending = new Map<number, Pending>();
  private timer: ReturnType<typeof setTimeout> | null = null;
  private readonly interval: number;
  private delay = 1;
  private readonly onKeyRequest: EngineInit["onKeyRequest"];
  private readonly onEvent?: EngineInit["onEvent"];
  /** apiKey answers still being computed on the JS side. */
  private keysInFlight = 0;
  /** Ends the wait for each of them (free() gives up on all). */
  private keyWaits = new Set<() => void>();
  /** Host-call handlers by owner name, and the host calls still running. */
  private owners = new Map<string, HostCallHandler>();
  private calls = new Map<number, { ac: AbortController; release: () => void }>();

  constructor(init: EngineInit) {
    this.lib = loadLibrary(init.library);
    this.interval = Math.max(1, Math.floor(init.pollIntervalMs ?? 5));
    this.onKeyRequest = init.onKeyRequest;
    this.onEvent = init.onEvent;
    const config = init.config === null ? null : cstr(init.config);
    const options = cstr(JSON.stringify(init.options));
    const errOut = new BigUint64Array(1);
    const h = this.lib.sbx_engine_new(
      (config ? ptr(config) : null) as Pointer,
      ptr(options),
      null,
      null,
      ptr(errOut),
    );
    if (!h) {
      const msg = errOut[0] ? take(this.lib, Number(errOut[0]) as Pointer) : null;
      throw new Error(msg ?? "the sandbox engine could not start");
    }
    this.handle = h;
    liveEngines.add(this);
    hookExit();
  }

  get closed(): boolean {
    return this.handle === null;
  }

  /** The engine's eventfd (readable while outputs are queued); -1 once freed. */
  fd(): number {
    return this.handle ? this.lib.sbx_engine_fd(this.handle) : -1;
  }

  /** Host calls (callback.request) still waiting for this process's answer. */
  get hostCalls(): number {
    return this.calls.size;
  }

  /** Number of requests still waiting for their result. */
  get inFlight(): number {
    return this.pending.size;
  }

  private live(): Pointer {
    if (!this.handle) throw new Error("sandbox is disposed");
    return this.handle;
  }

  /** Queues a request; resolves with its value, rejects with an EngineError (the Lua message). */
  submit<T = unknown>(request: Record<string, unknown>, onEvent?: Pending["onEvent"]): Promise<T> {
    return this.send<T>(request, onEvent).result;
  }

  /** submit(), also giving the request id (for a later {"type":"cancel","target":id}). */
  send<T = unknown>(request: Record<string, unknown>, onEvent?: Pending["onEvent"]): { id: number; result: Promise<T> } {
    let id: number;
    try {
      const h = this.live();
      const bytes = encoder.encode(JSON.stringify(request));
      id = Number(this.lib.sbx_engine_submit(h, ptr(bytes), bytes.length));
    } catch (err) {
      return { id: 0, result: Promise.reject(err) };
    }
    if (id <= 0) return { id: 0, result: Promise.reject(codeError(id)) };
    const result = new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, onEvent });
      this.arm();
    });
    return { id, result };
  }

  /** Routes callback.request events of `owner` to handler (until unregistered). */
  registerOwner(owner: string, handler: HostCallHandler): void {
    this.owners.set(owner, handler);
  }

  unregisterOwner(owner: string): void {
    this.owners.delete(owner);
  }

  /**
   * Submits a request and blocks the JS thread until its result (for pure,
   * non-yielding requests such as claim). Throws the Lua error message.
   */
  callSync<T = unknown>(request: Record<string, unknown>, timeoutMs = 5000): T {
    const h = this.live();
    const bytes = encoder.encode(JSON.stringify(request));
    const code = new Int32Array(1);
    const p = this.lib.sbx_engine_call(h, ptr(bytes), bytes.length, timeoutMs, ptr(code));
    const text = take(this.lib, p);
    if (text === null) throw codeError(code[0] ?? -1001);
    const out = JSON.parse(text) as Output;
    if (out.type !== "result") throw new Error("sandbox engine: unexpected output");
    if (!out.ok) throw new EngineError(out.error, "errorInfo" in out ? out.errorInfo : undefined);
    return out.value as T;
  }

  /** Polls soon (1 ms): called on submit and whenever outputs arrived. */
  private arm(): void {
    if (!this.handle || (this.timer !== null && this.delay === 1)) return;
    this.delay = 1;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.tick(), this.delay);
  }

  private tick(): void {
    this.timer = null;
    const got = this.pump();
    if (!this.handle || (this.pending.size === 0 && this.keysInFlight === 0)) return;
    this.delay = got > 0 ? 1 : Math.min(this.delay * 2, this.interval);
    this.timer = setTimeout(() => this.tick(), this.delay);
  }

  private disarm(): void {
    if (this.timer !== null && this.pending.size === 0 && this.keysInFlight === 0) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Drains every queued output on the JS thread; returns how many there were. */
  pump(): number {
    let n = 0;
    if (this.handle) {
      for (;;) {
        const text = take(this.lib, this.lib.sbx_engine_poll(this.handle));
        if (text === null) break;
        n++;
        let out: Output;
        try {
          out = JSON.parse(text) as Output;
        } catch {
          continue;
        }
        this.dispatch(out);
      }
    }
    this.disarm();
    return n;
  }

  private dispatch(out: Output): void {
    if (out.type === "result") {
      const p = this.pending.get(out.request);
      if (!p) return;
      this.pending.delete(out.request);
      if (out.ok) p.resolve(out.value ?? null);
      else p.reject(new EngineError(out.error, "errorInfo" in out ? out.errorInfo : undefined));
    } else if (out.type === "apiKey.request") {
      this.answerKey(out);
    } else if (out.type === "callback.request") {
      this.answerCall(out);
    } else if (out.type === "callback.abort") {
      const c = this.calls.get(out.id);
      c?.ac.abort(out.reason);
      // Abandoned: the work it served is over; its answer is not wanted.
      if (out.abandoned) c?.release();
    } else if (out.type === "event") {
      const p = this.pending.get(out.request);
      try {
        if (p?.onEvent) p.onEvent(out);
        else this.onEvent?.(out);
      } catch {
        // a listener's failure never breaks the bridge
      }
    }
  }

  /** Runs a host function for the engine and submits its answer (callback.result). */
  private answerCall(req: Output & { type: "callback.request" }): void {
    const handler = this.owners.get(req.owner);
    const args = Array.isArray(req.args) ? req.args : [];
    if (req.id === 0) {
      try {
        const r = handler?.(req.fn, args, new AbortController().signal);
        if (r instanceof Promise) r.catch(() => undefined);
      } catch {
        // a one-way call's failure is the host's own (a logger)
      }
      return;
    }
    const ac = new AbortController();
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      this.calls.delete(req.id);
      this.keysInFlight--;
      this.disarm();
    };
    this.calls.set(req.id, { ac, release });
    this.keysInFlight++;
    this.arm();
    let answer: Promise<unknown>;
    try {
      if (!handler) throw new Error(`no host function for ${req.owner}`);
      answer = Promise.resolve(handler(req.fn, args, ac.signal));
    } catch (err) {
      answer = Promise.reject(err);
    }
    answer
      .then(
        (value) => ({ type: "callback.result", id: req.id, ok: true, value: value === undefined ? null : value }),
        (err: unknown) => ({ type: "callback.result", id: req.id, ok: false, error: callError(err) }),
      )
      .then((msg) => {
        if (released || !this.handle) return;
        return this.submit(msg).then(
          () => undefined,
          () => undefined,
        );
      })
      .finally(release);
  }

  private answerKey(req: Output & { type: "apiKey.request" }): void {
    this.keysInFlight++;
    this.arm();
    let answered: Promise<string | null>;
    try {
      answered = Promise.resolve(this.onKeyRequest(req));
    } catch {
      answered = Promise.resolve(null);
    }
    // A getter that never settles must not keep the poll timer (and the
    // process) alive: the engine has failed the call closed by then anyway.
    let timeout: ReturnType<typeof setTimeout> | undefined;
    let giveUp = () => {};
    const expired = new Promise<null>((resolve) => {
      giveUp = () => resolve(null);
      timeout = setTimeout(giveUp, APIKEY_TIMEOUT_MS);
    });
    this.keyWaits.add(giveUp);
    Promise.race([answered.catch(() => null), expired])
      .then((key) => {
        clearTimeout(timeout);
        this.keyWaits.delete(giveUp);
        if (!this.handle) return;
        const k = typeof key === "string" && key !== "" ? key : null;
        // The result of apiKey.result (true if K was waiting) is not needed.
        return this.submit({ type: "apiKey.result", id: req.id, key: k }).then(
          () => undefined,
          () => undefined,
        );
      })
      .finally(() => {
        this.keysInFlight--;
        this.disarm();
      });
  }

  /**
   * Stops the engine (running turns end and their containers are removed;
   * requests still without a result fail with "engine stopped"), delivers
   * what is left and frees it. Blocks while the engine thread finishes, so
   * callers dispose the app through a request first. Idempotent.
   */
  free(): void {
    const h = this.handle;
    if (!h) return;
    this.lib.sbx_engine_stop(h);
    this.pump();
    this.handle = null;
    this.lib.sbx_engine_free(h);
    liveEngines.delete(this);
    for (const [, p] of this.pending) p.reject(new Error("engine stopped"));
    this.pending.clear();
    for (const giveUp of [...this.keyWaits]) giveUp();
    for (const c of [...this.calls.values()]) {
      c.ac.abort(new Error("engine stopped"));
      c.release();
    }
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }
}
