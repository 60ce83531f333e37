// broker.js: the worker's own HTTP calls to the host broker over the mounted
// Unix socket (spec/rich-mode.md 10, 12, 13.2). Every call has a client
// timeout and a body limit; a body over the limit is refused while it streams,
// never buffered whole. The socket path is SANDBOX_BROKER_SOCKET, default
// /run/sandbox/broker.sock (the run/ bind of section 5.3).
export const BROKER_SOCKET = process.env.SANDBOX_BROKER_SOCKET || "/run/sandbox/broker.sock";

export class BrokerError extends Error {
  constructor(message, status) { super(message); this.name = "BrokerError"; this.status = status; }
}

// readBounded(body, max, signal): the bytes of a ReadableStream, at most max.
export async function readBounded(body, max, signal) {
  if (!body) return new Uint8Array(0);
  const reader = body.getReader();
  const parts = [];
  let total = 0;
  try {
    for (;;) {
      if (signal?.aborted) throw signal.reason ?? new Error("aborted");
      const { done, value } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (total > max) throw new BrokerError(`body over ${max} bytes`);
      parts.push(value);
    }
  } finally {
    reader.releaseLock?.();
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.byteLength; }
  return out;
}

// call(method, path, {body, timeoutMs, max, signal, headers}) -> {status, bytes}
export async function call(method, path, opts = {}) {
  const timeout = AbortSignal.timeout(opts.timeoutMs ?? 15_000);
  const signal = opts.signal ? AbortSignal.any([timeout, opts.signal]) : timeout;
  const init = { method, unix: BROKER_SOCKET, signal, headers: opts.headers ?? {}, decompress: false };
  if (opts.body !== undefined) {
    init.body = typeof opts.body === "string" || opts.body instanceof Uint8Array ? opts.body : JSON.stringify(opts.body);
    init.headers = { "content-type": "application/json", ...init.headers };
  }
  const res = await fetch(`http://localhost${path}`, init);
  const bytes = await readBounded(res.body, opts.max ?? 1024 * 1024, signal);
  return { status: res.status, bytes };
}

export function text(bytes) { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); }

// json(bytes): strict UTF-8 JSON (a decode error or bad JSON throws).
export function json(bytes) { return JSON.parse(text(bytes)); }
