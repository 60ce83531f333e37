// forwarder.js: the loopback forwarder (spec/rich-mode.md 17.2). Claude Code
// speaks only TCP, so the worker listens on the host:port of
// ANTHROPIC_BASE_URL (the container's http://127.0.0.1:8080/anthropic) and
// forwards method, path and query to the broker socket. Request headers lose
// host, connection, content-length and accept-encoding; bodies are buffered up
// to 96 MiB; response headers lose content-encoding, content-length and
// transfer-encoding and the body streams through as it arrives. A status >= 400
// or an exception logs "broker call failed" {path, status|error, latencyMs}.
import { BROKER_SOCKET, readBounded } from "./broker.js";
import { FORWARD_BODY_MAX } from "./limits.js";
import { log, errorText } from "./log.js";

const DROP_REQUEST = new Set(["host", "connection", "content-length", "accept-encoding"]);
const DROP_RESPONSE = new Set(["content-encoding", "content-length", "transfer-encoding"]);

// listenAddress(baseUrl): {hostname, port} of a loopback http base URL.
export function listenAddress(baseUrl = process.env.ANTHROPIC_BASE_URL || "http://127.0.0.1:8080/anthropic") {
  const u = new URL(baseUrl);
  if (u.protocol !== "http:" || u.hostname !== "127.0.0.1" || u.pathname !== "/anthropic") {
    throw new Error("ANTHROPIC_BASE_URL must be http://127.0.0.1:<port>/anthropic");
  }
  return { hostname: "127.0.0.1", port: Number(u.port || 80) };
}

async function forward(req) {
  const started = Date.now();
  const url = new URL(req.url);
  const path = url.pathname;
  try {
    const headers = new Headers();
    for (const [k, v] of req.headers) if (!DROP_REQUEST.has(k.toLowerCase())) headers.append(k, v);
    let body;
    if (req.method !== "GET" && req.method !== "HEAD") {
      const declared = Number(req.headers.get("content-length") ?? "0");
      if (declared > FORWARD_BODY_MAX) {
        log("broker call failed", { path, status: 413, latencyMs: Date.now() - started });
        return new Response("Request too large", { status: 413 });
      }
      body = await readBounded(req.body, FORWARD_BODY_MAX);
    }
    const res = await fetch(`http://localhost${path}${url.search}`, {
      method: req.method, headers, body, unix: BROKER_SOCKET, signal: req.signal, timeout: false,
      // Without decompress:false bun would add its own accept-encoding; the
      // broker is asked for identity bodies only.
      decompress: false,
    });
    if (res.status >= 400) log("broker call failed", { path, status: res.status, latencyMs: Date.now() - started });
    const out = new Headers();
    for (const [k, v] of res.headers) if (!DROP_RESPONSE.has(k.toLowerCase())) out.append(k, v);
    return new Response(req.method === "HEAD" ? null : res.body, { status: res.status, headers: out });
  } catch (err) {
    log("broker call failed", { path, error: errorText(err), latencyMs: Date.now() - started });
    return new Response("Broker call failed", { status: 502 });
  }
}

// start(): the listening server (Bun.serve); idle connections are never cut
// here, since a model stream may pause for as long as the broker allows.
export function start(address = listenAddress()) {
  return Bun.serve({
    hostname: address.hostname,
    port: address.port,
    idleTimeout: 0,
    maxRequestBodySize: FORWARD_BODY_MAX + 1,
    fetch: forward,
  });
}
