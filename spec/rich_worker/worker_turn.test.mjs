// worker_turn.test.mjs: the rich worker end to end (spec/rich-mode.md 10.7,
// 17.2, 17.4, 17.5): a real bun worker process on the real Pi packages and
// Claude Code, driven by the scripted broker peer over its Unix socket, the
// model served by the Anthropic-shaped SSE upstream. Run as a non-root user
// (Claude Code refuses to run as root).
import { describe, test, expect, afterEach } from "bun:test";
import { startWorker, turn, until } from "./harness.mjs";
import { textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });

// All text the model saw in one upstream request (system + messages).
function seen(req) { return JSON.stringify(req.body); }

const TOOL_CONTENT = (tools) => `
export function workerContent() {
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    prompt: "Spec persona.",
    brokerTools: ${JSON.stringify(tools)},
  };
}`;

describe("startup (17.2, 10.7)", () => {
  test("asks for /mcp-tools, then /worker/config, then posts ready with no privacy capabilities before its first poll", async () => {
    const w = await worker();
    await w.waitLog("sandbox worker ready");
    await w.peer.whenReady();
    await until(() => w.peer.polls > 0, "the first poll");
    const order = w.peer.events.filter((e) => !e.startsWith("POST /anthropic") && e !== "HEAD /anthropic");
    expect(order.slice(0, 4)).toEqual(["GET /mcp-tools", "GET /worker/config", "POST /worker/ready", "GET /worker/next"]);
    expect(w.peer.readies[0]).toEqual({ capabilities: { privateTo: true, readerRecords: true }, privateHistory: false });
    const ready = w.logs().find((l) => l.msg === "sandbox worker ready");
    expect(ready.app).toBe("sandbox-worker");
    expect(ready.profile).toBe("spec");
    expect(ready.tools).toEqual(["read_attachment"]);
    expect(typeof ready.time).toBe("string");
  });

  test("a non-200 /mcp-tools fails startup with the broker's status and exit 1", async () => {
    const w = await worker({ peerOptions: { overrides: { "GET /mcp-tools": () => new Response("no", { status: 503 }) } } });
    expect(await w.exited).toBe(1);
    const failed = w.logs().find((l) => l.msg === "sandbox worker failed");
    expect(failed.error).toContain("the broker answered 503 for mcp-tools");
  });

  test("an older broker's 404 for /worker/config means {}", async () => {
    const w = await worker({ peerOptions: { overrides: { "GET /worker/config": () => new Response("Not found", { status: 404 }) } } });
    await w.waitLog("sandbox worker ready");
    expect(w.logs().find((l) => l.msg === "compaction ready").hostCompactor).toBe(false);
  });

  test("a model the content names but Pi does not have fails startup", async () => {
    const w = await worker({ content: `export function workerContent() { return { model: { provider: "claude-bridge", id: "no-such-model" } }; }` });
    expect(await w.exited).toBe(1);
    expect(w.logs().find((l) => l.msg === "sandbox worker failed").error).toContain("model claude-bridge/no-such-model is not available");
  });
});

describe("one turn (17.5)", () => {
  test("prompts [name (id)] text through the forwarder and answers the reply text", async () => {
    const w = await worker({ script: [textReply("Hello Ann, welcome.")] });
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn({ text: "good morning" }));
    expect(result).toEqual({ ok: true, text: "Hello Ann, welcome.", files: [] });
    const req = w.upstream.messageRequests().at(-1);
    expect(seen(req)).toContain("[Ann (123)] good morning");
    expect(req.search).toBe("?beta=true");
    expect(req.headers.authorization).toBe("Bearer host-secret-token");   // the peer's bearer; the worker only ever sent the dummy
    expect(w.peer.modelCalls.at(-1).headers.authorization).toBe("Bearer sandbox-dummy-token");
    expect(w.peer.modelCalls.at(-1).headers["accept-encoding"]).toBeUndefined();
    const done = w.logs().find((l) => l.msg === "turn finished");
    expect(done).toMatchObject({ turnId: "t1", thinking: "low", toolCalls: 0 });
  });

  test("the memory block and the persona reach the model", async () => {
    const w = await worker({ script: [textReply("noted")] });
    await w.peer.whenReady();
    await w.peer.runTurn(turn({ memory: "Ann likes green tea." }));
    const body = seen(w.upstream.messageRequests().at(-1));
    expect(body).toContain("Ann likes green tea.");
    expect(body).toContain("You are the spec persona for spec.");
  });

  test("the turn's images reach the model as base64 image blocks", async () => {
    const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    const w = await worker({ script: [textReply("a red dot")] });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(turn({ images: [{ data: png, mimeType: "image/png" }] }))).text).toBe("a red dot");
    const user = w.upstream.messageRequests().at(-1).body.messages[0];
    expect(user.content.find((c) => c.type === "image").source).toEqual({ type: "base64", media_type: "image/png", data: png });
  });

  test("an unknown thinking level fails the turn without a model call", async () => {
    const w = await worker();
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn({ thinking: "max" }));
    expect(result).toEqual({ ok: false, error: "unknown thinking level max" });
    expect(w.upstream.messageRequests().length).toBe(0);
  });

  test("a turn that fails the worker-side check is answered Invalid turn", async () => {
    const w = await worker();
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn({ author: { id: "1", name: "x".repeat(257) } }));
    expect(result).toEqual({ ok: false, error: "Invalid turn" });
  });

  test("an upstream error ends the turn with prompt failed", async () => {
    const overloaded = { json: { type: "error", error: { type: "invalid_request_error", message: "prompt is too long" } }, status: 400 };
    const w = await worker({ script: [overloaded, overloaded, overloaded, overloaded] });
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn());
    expect(result.ok).toBe(false);
    expect(result.error.startsWith("prompt failed: ")).toBe(true);
    expect(w.logs().some((l) => l.msg === "model call failed")).toBe(true);
  });

  test("a second turn continues the same Pi session, also after a worker restart", async () => {
    const w1 = await worker({ script: [textReply("first answer")] });
    await w1.peer.whenReady();
    expect((await w1.peer.runTurn(turn({ text: "remember the word kumquat" }))).ok).toBe(true);
    const jsonl = [...new Bun.Glob("*.jsonl").scanSync(`${w1.ws}/sessions`)];
    expect(jsonl.length).toBe(1);
    await w1.kill();
    const w3 = await worker({ dir: w1.dir, upstream: w1.upstream });
    await w3.peer.whenReady();
    w1.upstream.push(textReply("second answer"));
    expect((await w3.peer.runTurn(turn({ turnId: "t2", text: "what was the word?" }))).text).toBe("second answer");
    expect(seen(w1.upstream.messageRequests().at(-1))).toContain("kumquat");
    expect([...new Bun.Glob("*.jsonl").scanSync(`${w1.ws}/sessions`)]).toEqual(jsonl);
  });
});

describe("broker tools (12, 17.4)", () => {
  const lookup = [{ name: "lookup", description: "Look a word up", parameters: { type: "object", properties: { word: { type: "string" } }, required: ["word"] } }];

  test("a model tool call posts {input} to /tools/<name> and the answer goes back to the model", async () => {
    const w = await worker({
      content: TOOL_CONTENT(lookup),
      tools: { lookup: (input) => ({ ok: true, text: `definition of ${input.word}` }) },
      script: [toolReply("mcp__custom-tools__lookup", { word: "kumquat" }), textReply("It is a fruit.")],
    });
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn({ text: "what is a kumquat?" }));
    expect(result).toEqual({ ok: true, text: "It is a fruit.", files: [] });
    expect(w.peer.toolCalls).toHaveLength(1);
    expect(w.peer.toolCalls[0].body).toEqual({ input: { word: "kumquat" } });
    expect(seen(w.upstream.messageRequests().at(-1))).toContain("definition of kumquat");
    expect(w.logs().find((l) => l.msg === "turn finished").toolCalls).toBe(1);
  });

  test("a non-200 answer is Broker answered <status>, an ok=false answer its error, both logged as tool failed", async () => {
    let n = 0;
    const w = await worker({
      content: TOOL_CONTENT(lookup),
      tools: { lookup: () => (++n === 1 ? new Response("Broker budget exhausted", { status: 429 }) : { ok: false, error: "no such word" }) },
      script: [
        toolReply("mcp__custom-tools__lookup", { word: "a" }),
        toolReply("mcp__custom-tools__lookup", { word: "b" }),
        textReply("gave up"),
      ],
    });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(turn())).text).toBe("gave up");
    const failures = w.logs().filter((l) => l.msg === "tool failed");
    expect(failures.map((f) => f.error)).toEqual(["Error: Broker answered 429", "Error: no such word"]);
    expect(failures[0]).toMatchObject({ turnId: "t1", tool: "lookup" });
    const last = seen(w.upstream.messageRequests().at(-1));
    expect(last).toContain("Broker answered 429");
    expect(last).toContain("no such word");
  });
});

describe("read_attachment (17.4)", () => {
  test("reads a regular file directly inside attachments and refuses a planted symlink", async () => {
    const w = await worker({
      files: { "workspace/attachments/note.txt": "the note says 42", "secret.txt": "outside secret" },
      script: [
        toolReply("mcp__custom-tools__read_attachment", { name: "note.txt" }),
        toolReply("mcp__custom-tools__read_attachment", { name: "link.txt" }),
        toolReply("mcp__custom-tools__read_attachment", { name: "../secret.txt" }),
        textReply("done"),
      ],
    });
    const { symlinkSync } = await import("node:fs");
    symlinkSync(`${w.dir}/secret.txt`, `${w.ws}/attachments/link.txt`);
    await w.peer.whenReady();
    expect((await w.peer.runTurn(turn())).text).toBe("done");
    const last = seen(w.upstream.messageRequests().at(-1));
    expect(last).toContain("the note says 42");
    expect(last).not.toContain("outside secret");
    expect(last).toContain("there is no attachment named link.txt");
    expect(last).toContain("Invalid attachment name");
  });
});
