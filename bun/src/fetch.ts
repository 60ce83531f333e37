// fetch.ts: safe fetch for Bun hosts (shared/spec/fetch-and-delegation.md
// section 1): safeFetch, assertPublicUrl, isPublicAddress, pinnedTransport,
// scrubDiagnostic and the error classes. Every operation runs in the engine
// (lua/sandbox/fetch.lua over the C core: admission, vetting, pinned
// libcurl attempts, bounds and decoding), so the options, results and
// messages are the Lua API's; this file only carries them across the FFI
// bridge (src/utility.ts's utility engine) and turns bytes and errors into
// their JavaScript forms.
//
//   const page = await safeFetch(modelUrl, { signal, maxBytes: 2 * 1024 * 1024 });
//   const html = new TextDecoder().decode(page.data);   // hand the bytes to a parser
//
// The resolve / transport / localAddresses options are trusted test seams:
// JavaScript functions the engine calls back (callback.request); never build
// them, headers or bounds from guest input.
import { EngineError, type ErrorInfo } from "./ffi.ts";
import { ownerName, utilityEngine, wireNumber } from "./utility.ts";

/** One resolver answer. `port` (pinnedTransport only) is a trusted loopback override for tests. */
export interface LookupAddress {
  address: string;
  family: 4 | 6;
  port?: number;
}

export interface SafeFetchResult {
  /** Canonical URL of the hop that produced this result, fragment removed. */
  url: string;
  status: number;
  /** The server's reason phrase; undefined when it sent none. */
  statusText?: string;
  /** Lower-case names; repeated fields joined with ", ". */
  headers: Record<string, string>;
  /** Body bytes, decoded when a content encoding was used. */
  data: Uint8Array;
}

/** What a transport seam may return (data as bytes or a UTF-8 string). */
export interface TransportResult {
  url?: string;
  status: number;
  statusText?: string;
  headers?: Record<string, string>;
  data?: Uint8Array | string;
}

export type ResolveSeam = (hostname: string) => LookupAddress[] | Promise<LookupAddress[]>;
export type TransportSeam = (
  url: string,
  address: LookupAddress,
  signal: AbortSignal,
  maxBytes: number,
  headers: Record<string, string>,
) => TransportResult | Promise<TransportResult>;
export type LocalAddressesSeam = () => string[] | Promise<string[]>;

export interface SafeFetchOptions {
  signal?: AbortSignal;
  /** 1 … 33,554,432 (default 5 MiB), applied to wire and decoded bytes separately. */
  maxBytes?: number;
  /** Whole-call deadline, 1 … 120,000 ms (default 60,000). */
  timeoutMs?: number;
  /** Longest silence on an established connection, 1 … 120,000 ms (default 30,000). */
  idleTimeoutMs?: number;
  /** 0 … 10 (default 5). */
  maxRedirects?: number;
  /** false returns a redirect instead of following it. */
  followRedirects?: boolean;
  /** Trusted host request headers (accept-encoding stays identity). */
  headers?: Record<string, string>;
  /** Test seams (trusted code only). */
  resolve?: ResolveSeam;
  transport?: TransportSeam;
  localAddresses?: LocalAddressesSeam;
  /** Path of libsbx.so (default: the bridge's, or $SBX_LIB). */
  library?: string;
}

export interface AssertPublicUrlOptions {
  signal?: AbortSignal;
  /** 1 … 120,000 ms (default 10,000). */
  timeoutMs?: number;
  resolve?: ResolveSeam;
  localAddresses?: LocalAddressesSeam;
  library?: string;
}

// ---- errors (spec 1.15) ------------------------------------------------------

export class UnsafeUrlError extends Error {
  override name = "UnsafeUrlError";
}
/** A declared Content-Length above maxBytes; carries the response's status and headers. */
export class ResponseTooLargeError extends UnsafeUrlError {
  override name = "ResponseTooLargeError";
  constructor(
    message: string,
    readonly status?: number,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}
/** "Fetch deadline exceeded" / "URL check deadline exceeded". */
export class FetchTimeoutError extends Error {
  override name = "TimeoutError";
}
export class TransportError extends Error {
  override name = "TransportError";
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}
export class DecodeError extends Error {
  override name = "DecodeError";
}
export class ResolveError extends Error {
  override name = "ResolveError";
}

/** true for UnsafeUrlError and ResponseTooLargeError. */
export function isUnsafeUrlError(err: unknown): boolean {
  return err instanceof UnsafeUrlError;
}

function fromInfo(info: ErrorInfo): Error {
  switch (info.name) {
    case "UnsafeUrlError":
      return new UnsafeUrlError(info.message);
    case "ResponseTooLargeError":
      return new ResponseTooLargeError(info.message, info.status, info.headers ?? {});
    case "TimeoutError":
      return new FetchTimeoutError(info.message);
    case "TransportError":
      return new TransportError(info.message, info.code);
    case "DecodeError":
      return new DecodeError(info.message);
    case "ResolveError":
      return new ResolveError(info.message);
    default: {
      const e = new Error(info.message);
      if (info.name) e.name = info.name;
      if (info.code) (e as Error & { code?: string }).code = info.code;
      return e;
    }
  }
}

/**
 * The engine's error as the caller sees it: the seam's own error object when
 * one of this call's seams threw it and it ended the call, else the
 * catalogue class.
 */
function toError(err: unknown, thrown: Error[]): unknown {
  if (!(err instanceof EngineError) || !err.info) return err;
  const info = err.info;
  const own = thrown.find((t) => t.message === info.message && (t.name ?? "Error") === (info.name ?? "Error"));
  return own ?? fromInfo(info);
}

// ---- conversions --------------------------------------------------------------

/** A safe fetch result as it crosses the bridge (bytes as base64). */
export interface WireResult {
  url: string;
  status: number;
  statusText?: string;
  headers?: Record<string, string>;
  dataBase64?: string;
}

/** The bridge's form of a result -> SafeFetchResult (bytes decoded). */
export function fromWire(v: WireResult): SafeFetchResult {
  const out: SafeFetchResult = {
    url: v.url,
    status: v.status,
    headers: { ...(v.headers ?? {}) },
    data: new Uint8Array(Buffer.from(v.dataBase64 ?? "", "base64")),
  };
  if (typeof v.statusText === "string") out.statusText = v.statusText;
  return out;
}

function toWire(r: TransportResult): unknown {
  if (r === null || typeof r !== "object") return r;
  const data = r.data === undefined ? new Uint8Array() : typeof r.data === "string" ? Buffer.from(r.data) : r.data;
  if (!(data instanceof Uint8Array)) throw new TransportError("transport returned invalid data");
  return {
    url: r.url,
    status: r.status,
    statusText: r.statusText,
    headers: r.headers ?? {},
    dataBase64: Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64"),
  };
}

const BOUND_NAMES = ["maxBytes", "timeoutMs", "idleTimeoutMs", "maxRedirects"] as const;

function wireOptions(o: SafeFetchOptions | AssertPublicUrlOptions, names: readonly string[]): Record<string, unknown> {
  const src = o as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const k of names) if (src[k] !== undefined) out[k] = wireNumber(src[k]);
  return out;
}

// ---- one engine request with seams and the caller's signal -------------------

type Seams = Pick<SafeFetchOptions, "resolve" | "transport" | "localAddresses">;

async function run<T>(
  type: string,
  body: Record<string, unknown>,
  seams: Seams,
  signal: AbortSignal | undefined,
  library: string | undefined,
): Promise<T> {
  if (signal?.aborted) throw signal.reason;
  const engine = utilityEngine(library);
  const owner = ownerName("f");
  const thrown: Error[] = [];
  // Runs a seam, remembering an Error it throws (sync or async) so that the
  // caller gets that very object back when it ends the call.
  const call = async <R>(f: () => R | Promise<R>): Promise<R> => {
    try {
      return await f();
    } catch (err) {
      if (err instanceof Error) thrown.push(err);
      throw err;
    }
  };
  const handler = async (fn: string, args: unknown[], callSignal: AbortSignal): Promise<unknown> => {
    const { resolve, localAddresses, transport } = seams;
    if (fn === "resolve" && resolve) return call(() => resolve(String(args[0])));
    if (fn === "localAddresses" && localAddresses) return call(() => localAddresses());
    if (fn === "transport" && transport) {
      const [url, address, maxBytes, headers] = args as [string, LookupAddress, number, Record<string, string>];
      return toWire(await call(() => transport(url, address, callSignal, maxBytes, headers ?? {})));
    }
    throw new Error(`no ${fn} seam`);
  };
  const used = {
    resolve: typeof seams.resolve === "function",
    transport: typeof seams.transport === "function",
    localAddresses: typeof seams.localAddresses === "function",
  };
  if (used.resolve || used.transport || used.localAddresses) engine.registerOwner(owner, handler);
  const { id, result } = engine.send<T>({ type, ...body, owner, seams: used });
  result.then(
    () => engine.unregisterOwner(owner),
    () => engine.unregisterOwner(owner),
  );
  if (!signal) return result.catch((err: unknown) => Promise.reject(toError(err, thrown)));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      // The caller's reason, exactly; the engine cancels its work.
      reject(signal.reason);
      if (id > 0 && !engine.closed) engine.submit({ type: "cancel", target: id }).catch(() => undefined);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    result.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(toError(err, thrown));
      },
    );
  });
}

// ---- the public functions -----------------------------------------------------

/**
 * Fetches one credential-free HTTP(S) resource with every hop admitted,
 * vetted (public addresses only, never the host's own) and pinned; see the
 * README. Rejects with the catalogue's errors or the signal's reason.
 */
export async function safeFetch(url: string, options: SafeFetchOptions = {}): Promise<SafeFetchResult> {
  const o = options ?? {};
  const opts: Record<string, unknown> = wireOptions(o, BOUND_NAMES);
  if (o.followRedirects !== undefined) opts.followRedirects = o.followRedirects;
  if (o.headers !== undefined) opts.headers = o.headers;
  const v = await run<WireResult>("fetch", { url, options: opts }, o, o.signal, o.library);
  return fromWire(v);
}

/** Admits and vets url (no connection); resolves to the canonical URL without fragment. */
export async function assertPublicUrl(url: string, options: AssertPublicUrlOptions = {}): Promise<string> {
  const o = options ?? {};
  const seams = { resolve: o.resolve, localAddresses: o.localAddresses };
  return run<string>("assertPublicUrl", { url, options: wireOptions(o, ["timeoutMs"]) }, seams, o.signal, o.library);
}

/**
 * One attempt against one ALREADY VETTED address (the default transport; a
 * transport seam uses it to reach a loopback test server). It vets nothing.
 */
export async function pinnedTransport(
  url: string,
  address: LookupAddress,
  signal?: AbortSignal,
  maxBytes?: number,
  headers?: Record<string, string>,
  library?: string,
): Promise<SafeFetchResult> {
  const body = { url, address, maxBytes: wireNumber(maxBytes), headers: headers ?? {} };
  const v = await run<WireResult>("pinnedTransport", body, {}, signal, library);
  return fromWire(v);
}

/** true only for a strict IP literal in public space (pure; no lookup). */
export function isPublicAddress(text: string, library?: string): boolean {
  if (typeof text !== "string") return false;
  return utilityEngine(library).callSync<boolean>({ type: "isPublicAddress", text }) === true;
}

/**
 * A failure reason safe to post into a guest channel: credentials masked,
 * controls removed, at most `max` code points (default 600; a whole number
 * of at least 1, or Infinity). Throws "Invalid diagnostic limit".
 */
export function scrubDiagnostic(text: unknown, max?: number, library?: string): string {
  return utilityEngine(library).callSync<string>({
    type: "scrubDiagnostic",
    text: typeof text === "string" ? text : String(text),
    max: wireNumber(max),
  });
}
