// worker_mcp.test.mjs: MCP through pi-mcp-adapter (spec/rich-mode.md 13,
// 17.4): the worker connects each server GET /mcp-tools names at
// http://127.0.0.1:<forwarder>/mcp/<name>, waits for its tools, keeps them
// active, and a model call reaches the real MCP server (official SDK, spec
// fixture) through the forwarder and the peer, which adds the MCP bearer.
import { describe, test, expect, afterEach, beforeAll, afterAll } from "bun:test";
import { join } from "node:path";
import { startWorker, turn, ROOT } from "./harness.mjs";
import { textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

let mcp, mcpUrl;
beforeAll(async () => {
  mcp = Bun.spawn(["node", join(ROOT, "spec", "fixtures", "mcp_server.mjs"), "--require-key", "mcp-host-token", "--parent-pid", String(process.pid)], { stdout: "pipe", stderr: "inherit" });
  const reader = mcp.stdout.getReader();
  let line = "";
  // bounded: the server's first line, or a clear failure when it exits first
  // (its npm fixtures missing: `make deps`) or the line grows past 4 KiB
  while (!line.includes("\n")) {
    const { value, done } = await reader.read();
    if (done || line.length > 4096) throw new Error("spec/fixtures/mcp_server.mjs ended before its port line (run `make deps`)");
    line += new TextDecoder().decode(value);
  }
  mcpUrl = `http://127.0.0.1:${JSON.parse(line).port}/mcp`;
});
afterAll(() => mcp?.kill());
const live = [];
afterEach(async () => { while (live.length) await live.pop().stop(); });

async function mcpLog() { return (await fetch(mcpUrl.replace("/mcp", "/__log"), { method: "POST" })).json(); }

describe("MCP tools (13, 17.4)", () => {
  test("connects at startup, activates exactly the discovered tools, and a call reaches the server with the host's bearer", async () => {
    const w = await startWorker({
      servers: [{ name: "docs", url: mcpUrl, tools: ["search"] }],
      script: [toolReply("mcp__custom-tools__docs_search", { query: "kumquat" }), textReply("found it")],
    });
    live.push(w);
    const ready = await w.waitLog("sandbox worker ready");
    expect(ready.tools).toEqual(["read_attachment", "docs_search"]);
    await w.peer.whenReady();
    const before = (await mcpLog()).map((e) => e.body?.method);
    expect(before).toContain("initialize");
    expect(before).toContain("tools/list");
    expect(before).not.toContain("tools/call");
    expect((await w.peer.runTurn(turn())).text).toBe("found it");
    const log = await mcpLog();
    const call = log.find((e) => e.body?.method === "tools/call");
    expect(call.body.params).toEqual({ name: "search", arguments: { query: "kumquat" } });
    expect(log.every((e) => e.authorization === "Bearer mcp-host-token")).toBe(true);
    expect(JSON.stringify(w.upstream.messageRequests().at(-1).body)).toContain("results for kumquat");
    expect(w.peer.mcpCalls.every((c) => c.server === "docs")).toBe(true);
  });

  test("a server whose tools never appear fails startup after the wait with tools are not registered", async () => {
    const w = await startWorker({
      servers: [{ name: "docs", url: mcpUrl, tools: ["search", "summon"] }],
    });
    live.push(w);
    expect(await w.exited).toBe(1);
    expect(w.logs().find((l) => l.msg === "sandbox worker failed").error).toContain("tools are not registered: docs_summon");
  }, 90_000);
});
