// forwarder.test.mjs: the loopback forwarder of spec/rich-mode.md 17.2, in
// process, against a broker stand-in on a real Unix socket: header rules,
// method/path/query forwarding, streaming, the 96 MiB buffer and the
// "broker call failed" log line.
import { describe, test, expect, beforeAll, afterAll } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { freePort } from "./harness.mjs";

const dir = mkdtempSync(join(tmpdir(), "rich-fwd-"));
const sock = join(dir, "broker.sock");
process.env.SANDBOX_BROKER_SOCKET = sock;
let fwd, brokerServer, base, release;
const seen = [];
const logged = [];

beforeAll(async () => {
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = (s, ...rest) => {
    if (typeof s === "string" && s.includes('"app":"sandbox-worker"')) { logged.push(JSON.parse(s)); return true; }
    return write(s, ...rest);
  };
  brokerServer = Bun.serve({
    unix: sock, idleTimeout: 0, maxRequestBodySize: 200 * 1024 * 1024,
    async fetch(req) {
      const url = new URL(req.url);
      const body = req.method === "GET" || req.method === "HEAD" ? "" : await req.text();
      seen.push({ method: req.method, target: url.pathname + url.search, headers: Object.fromEntries(req.headers), length: body.length });
      if (url.pathname === "/stream") {
        let ctrl;
        const gate = new Promise((r) => { release = r; });
        return new Response(new ReadableStream({
          async start(c) { ctrl = c; c.enqueue(new TextEncoder().encode("first")); await gate; c.enqueue(new TextEncoder().encode("rest")); c.close(); },
        }), { headers: { "content-type": "text/event-stream", "content-encoding": "identity", "x-kept": "yes" } });
      }
      if (url.pathname === "/missing") return new Response("Not found", { status: 404 });
      return new Response(`echo ${body}`, { headers: { "x-kept": "yes" } });
    },
  });
  const { start } = await import("../../worker/pi/lib/forwarder.js");
  const port = freePort();
  fwd = start({ hostname: "127.0.0.1", port });
  base = `http://127.0.0.1:${port}`;
});
afterAll(() => { fwd?.stop(true); brokerServer?.stop(true); rmSync(dir, { recursive: true, force: true }); });

describe("loopback forwarder (17.2)", () => {
  test("forwards method, path and query and drops host, connection, content-length and accept-encoding", async () => {
    const res = await fetch(`${base}/anthropic/v1/messages?beta=true`, {
      method: "POST", body: "hello", decompress: false,
      headers: { "accept-encoding": "gzip", "x-app": "cli", "anthropic-version": "2023-06-01", authorization: "Bearer sandbox-dummy-token" },
    });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("echo hello");
    const got = seen.at(-1);
    expect(got.method).toBe("POST");
    expect(got.target).toBe("/anthropic/v1/messages?beta=true");
    expect(got.headers["x-app"]).toBe("cli");
    expect(got.headers["anthropic-version"]).toBe("2023-06-01");
    expect(got.headers.authorization).toBe("Bearer sandbox-dummy-token");
    expect(got.headers["accept-encoding"]).toBeUndefined();
    expect(got.headers.host).toBe("localhost");   // the socket client's own, not the caller's 127.0.0.1:<port>
    expect(got.length).toBe(5);
  });

  test("streams the response: the first chunk arrives before the rest is sent, and encoding headers are dropped", async () => {
    const res = await fetch(`${base}/stream`, { decompress: false });
    expect(res.headers.get("content-encoding")).toBeNull();
    expect(res.headers.get("content-length")).toBeNull();
    expect(res.headers.get("x-kept")).toBe("yes");
    const reader = res.body.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    expect(first).toBe("first");
    release();
    let rest = "";
    for (;;) { const { done, value } = await reader.read(); if (done) break; rest += new TextDecoder().decode(value); }
    expect(rest).toBe("rest");
  });

  test("a status of 400 or more passes through and logs broker call failed with path and status", async () => {
    const res = await fetch(`${base}/missing?x=1`);
    expect(res.status).toBe(404);
    const line = logged.find((l) => l.msg === "broker call failed" && l.path === "/missing");
    expect(line.status).toBe(404);
    expect(typeof line.latencyMs).toBe("number");
    expect(JSON.stringify(line)).not.toContain("x=1");
  });

  test("a declared body over 96 MiB is refused without reaching the broker", async () => {
    const before = seen.length;
    const big = new Uint8Array(96 * 1024 * 1024 + 1);
    const res = await fetch(`${base}/anthropic/v1/messages`, { method: "POST", body: big });
    expect(res.status).toBe(413);
    expect(seen.length).toBe(before);
    expect(logged.some((l) => l.msg === "broker call failed" && l.status === 413)).toBe(true);
  });

  test("a broker that is gone gives 502 and logs the error", async () => {
    brokerServer.stop(true);
    rmSync(sock, { force: true });
    const res = await fetch(`${base}/mcp/docs`, { method: "POST", body: "{}" });
    expect(res.status).toBe(502);
    expect(logged.some((l) => l.msg === "broker call failed" && l.path === "/mcp/docs" && typeof l.error === "string")).toBe(true);
  });
});
