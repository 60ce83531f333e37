// worker_privacy.test.mjs: the worker's private exchanges (spec/rich-mode.md
// 14.2; behaviours 101-104, 106, 108): two principals in one channel, Ann and
// Bo, on the claude-bridge model (real Claude Code) and on a non-bridge model
// (Pi's own anthropic-messages provider, registered by the content module and
// pointed at the forwarder), with private and shared prompt blocks, tagged
// success and error results. The real worker process on the real Pi
// packages, the scripted broker peer, the Anthropic-shaped upstream.
import { describe, test, expect, afterEach } from "bun:test";
import { readFileSync, appendFileSync } from "node:fs";
import { startWorker, turn } from "./harness.mjs";
import { textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });

const REFUSAL = "claude-bridge cannot replay another reader's private-memory turns or private exchanges hidden from this sandbox reader; use another provider or a fresh conversation";
const RECALL = [
  { name: "recall", description: "Recall a private note", parameters: { type: "object", properties: { about: { type: "string" } } } },
  { name: "recall_fail", description: "Recall, failing", parameters: { type: "object", properties: { about: { type: "string" } } } },
];
const ann = (over = {}) => turn({ author: { id: "1", name: "Ann", principalId: "ann" }, ...over });
const bo = (over = {}) => turn({ turnId: "t-bo", author: { id: "2", name: "Bo", principalId: "bo" }, ...over });

// A content module on the bridge, or on Pi's own Anthropic provider through
// the forwarder (a non-bridge model).
const content = (direct) => `
export function workerContent() {
  return {
    model: ${direct ? `{ provider: "spec-direct", id: "spec-model" }` : `{ provider: "claude-bridge", id: "claude-sonnet-4-6" }`},
    prompt: "Spec persona.",
    brokerTools: ${JSON.stringify(RECALL)},
    extensions: () => [(pi) => pi.registerProvider("spec-direct", {
      baseUrl: process.env.ANTHROPIC_BASE_URL, apiKey: "sandbox-dummy-token", api: "anthropic-messages",
      models: [{ id: "spec-model", name: "spec", reasoning: false, input: ["text", "image"],
        cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 200000, maxTokens: 16384 }],
    })],
  };
}`;

const recallTools = {
  recall: (_input, ctx) => ({ ok: true, text: "RESULTSECRET-77", privateTo: ctx.speaker.principalId }),
  recall_fail: (_input, ctx) => ({ ok: false, error: "ERRSECRET-88", privateTo: ctx.speaker.principalId }),
};

function sessionEntries(w) {
  const [file] = [...new Bun.Glob("*.jsonl").scanSync(`${w.ws}/sessions`)];
  return readFileSync(`${w.ws}/sessions/${file}`, "utf8").trim().split("\n").map((l) => JSON.parse(l));
}
const seen = (req) => JSON.stringify(req.body);

describe("the bridge refusal (14.2)", () => {
  test("B101: a private prompt: Ann runs, Bo is refused without a model call, Ann runs again (two model calls)", async () => {
    const w = await worker({ content: content(false), script: [textReply("hi Ann"), textReply("hi again Ann")] });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(ann({ memory: "Ann's PROMPTSECRET-55" }))).text).toBe("hi Ann");
    const calls = w.upstream.messageRequests().length;
    expect(await w.peer.runTurn(bo())).toEqual({ ok: false, error: REFUSAL });
    expect(w.upstream.messageRequests().length).toBe(calls);
    expect((await w.peer.runTurn(ann({ turnId: "t3", memory: "Ann's PROMPTSECRET-55" }))).text).toBe("hi again Ann");
    expect(w.upstream.messageRequests().length).toBe(2);
    const records = sessionEntries(w).filter((e) => e.type === "custom" && e.customType === "roundtable-memory-turn");
    expect(records.map((r) => [r.data.reader, r.data.privateMemory])).toEqual([["ann", true], ["ann", true]]);
    expect(w.peer.readies.at(-1)).toEqual({ capabilities: { privateTo: true, readerRecords: true }, privateHistory: true });
  });

  test("B102: a shared prompt: A -> B -> A all run (three model calls)", async () => {
    const w = await worker({ content: content(false), script: [textReply("one"), textReply("two"), textReply("three")] });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(ann({ memory: "party facts", memoryVisibility: "shared" }))).text).toBe("one");
    expect((await w.peer.runTurn(bo({ memory: "party facts", memoryVisibility: "shared" }))).text).toBe("two");
    expect((await w.peer.runTurn(ann({ turnId: "t3" }))).text).toBe("three");
    expect(w.upstream.messageRequests().length).toBe(3);
    expect(w.peer.readies.at(-1).privateHistory).toBe(false);
  });

  test("B108: a privateTo exchange refuses Bo on the bridge (naming private exchanges), never Ann", async () => {
    const w = await worker({
      content: content(false), tools: recallTools,
      script: [toolReply("mcp__custom-tools__recall", { about: "x" }), textReply("noted"), textReply("Ann again")],
    });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(ann())).text).toBe("noted");
    const refused = await w.peer.runTurn(bo());
    expect(refused.ok).toBe(false);
    expect(refused.error).toContain("private exchanges");
    expect((await w.peer.runTurn(ann({ turnId: "t3" }))).text).toBe("Ann again");
  });

  test("B106: a reader record with privateMemory=true refuses Bo after a compaction; one with false does not", async () => {
    for (const [memory, visibility, refused] of [["Ann's notes", "private", true], ["party facts", "shared", false]]) {
      const w1 = await worker({ content: content(false), script: [textReply("first")] });
      await w1.peer.whenReady();
      expect((await w1.peer.runTurn(ann({ memory, memoryVisibility: visibility }))).ok).toBe(true);
      await w1.kill();
      // A compaction entry after Ann's turn, as Pi writes one: the earlier
      // entries stay on the raw branch.
      const entries = sessionEntries(w1);
      const last = entries.at(-1);
      const [file] = [...new Bun.Glob("*.jsonl").scanSync(`${w1.ws}/sessions`)];
      appendFileSync(`${w1.ws}/sessions/${file}`, JSON.stringify({
        type: "compaction", id: "c0mpact1", parentId: last.id, timestamp: new Date().toISOString(),
        summary: "They greeted each other.", firstKeptEntryId: last.id, tokensBefore: 1000,
      }) + "\n");
      const w2 = await worker({ dir: w1.dir, upstream: w1.upstream });
      await w2.peer.whenReady();
      w1.upstream.push(textReply("hi Bo"));
      const r = await w2.peer.runTurn(bo());
      if (refused) expect(r).toEqual({ ok: false, error: REFUSAL });
      else expect(r.text).toBe("hi Bo");
      await w2.kill();
    }
  }, 120_000);
});

describe("request projection on a non-bridge model (14.2)", () => {
  test("B103/B104/B108: tagged results (success and error) are stored with details.privateTo; Bo (never refused off the bridge) sees placeholders, Ann the original", async () => {
    const w = await worker({
      content: content(true), tools: recallTools,
      script: [
        toolReply("recall", { about: "ARGSECRET-66" }), toolReply("recall_fail", { about: "ARGSECRET-66" }), textReply("noted, Ann"),
        textReply("hello Bo"), textReply("hello again Ann"),
      ],
    });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(ann({ memory: "PROMPTSECRET-55" }))).text).toBe("noted, Ann");
    const results = sessionEntries(w).filter((e) => e.type === "message" && e.message.role === "toolResult").map((e) => e.message);
    expect(results.map((m) => [m.toolName, m.details?.privateTo, m.isError])).toEqual([["recall", "ann", false], ["recall_fail", "ann", true]]);

    expect((await w.peer.runTurn(bo())).text).toBe("hello Bo");
    const boSaw = seen(w.upstream.messageRequests().at(-1));
    for (const secret of ["ARGSECRET-66", "RESULTSECRET-77", "ERRSECRET-88", "PROMPTSECRET-55"]) expect(boSaw).not.toContain(secret);
    expect(boSaw).toContain("private memory, hidden");
    expect(boSaw).toContain("recall_fail");                         // ids and names stay paired

    expect((await w.peer.runTurn(ann({ turnId: "t3" }))).text).toBe("hello again Ann");
    const annSaw = seen(w.upstream.messageRequests().at(-1));
    expect(annSaw).toContain("ARGSECRET-66");
    expect(annSaw).toContain("RESULTSECRET-77");
  });
});
