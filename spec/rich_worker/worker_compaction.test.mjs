// worker_compaction.test.mjs: the worker side of compaction (spec/rich-mode.md
// 15.1-15.2 and 14.2's compaction privacy; behaviours 105, 107, 109, 112,
// 114-117 and the worker halves of 110 and 111). The real worker process on
// the real Pi packages, on Pi's own anthropic-messages provider (a 1M-token
// model registered by the content module, pointed at the forwarder), and for
// 107 also on the claude-bridge model (real Claude Code, 200,000 tokens); the
// scripted broker peer answers /compaction/compact with a spec compactor and
// records /compaction/report; the Anthropic-shaped upstream reports the
// context sizes (message_start usage) Pi's threshold reads. Every turn text
// is 90,000 characters (about 22,500 tokens, more than Pi keeps unsummarized)
// so each compaction has an older turn to summarize.
import { describe, test, expect, afterEach } from "bun:test";
import { readFileSync } from "node:fs";
import { startWorker, turn } from "./harness.mjs";
import { message, text, thinking, textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });

const ENGINE = { compaction: { engine: "my-compaction" } };
const SECRETS = ["ARGSECRET-66", "RESULTSECRET-77", "ERRSECRET-88", "PROMPTSECRET-55", "THINKSECRET-99"];
const TOOLS = [
  { name: "recall", description: "Recall a private note", parameters: { type: "object", properties: { about: { type: "string" } } } },
  { name: "recall_fail", description: "Recall, failing", parameters: { type: "object", properties: { about: { type: "string" } } } },
];
const hostTools = {
  recall: (_input, ctx) => ({ ok: true, text: "RESULTSECRET-77", privateTo: ctx.speaker.principalId }),
  recall_fail: (_input, ctx) => ({ ok: false, error: "ERRSECRET-88", privateTo: ctx.speaker.principalId }),
};

// abortAfterMs: a content extension of the operator's that aborts the agent
// (Pi's ctx.abort(), which aborts a running compaction) that long after a
// compaction starts. bridge: the claude-bridge model (real Claude Code, a
// 200,000-token window) instead of the 1M one.
const content = ({ abortAfterMs, bridge } = {}) => `
export function workerContent() {
  return {
    model: ${bridge ? `{ provider: "claude-bridge", id: "claude-sonnet-4-6" }` : `{ provider: "spec-direct", id: "spec-model" }`},
    prompt: "Spec persona.",
    brokerTools: ${JSON.stringify(TOOLS)},
    extensions: () => [(pi) => {
      pi.registerProvider("spec-direct", {
        baseUrl: process.env.ANTHROPIC_BASE_URL, apiKey: "sandbox-dummy-token", api: "anthropic-messages",
        models: [{ id: "spec-model", name: "spec", reasoning: false, input: ["text", "image"],
          cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 1000000, maxTokens: 16384 }],
      });
      ${abortAfterMs ? `pi.on("session_before_compact", (_e, ctx) => { setTimeout(() => ctx.abort(), ${abortAfterMs}); });` : ""}
    }],
  };
}`;

const big = (tag) => `${tag} ` + "lorem ipsum ".repeat(7_500);      // 90,000 characters
const ann = (id, t, over = {}) => turn({ turnId: id, author: { id: "1", name: "Ann", principalId: "ann" }, text: t, memory: "PROMPTSECRET-55", ...over });
const reply = (t, inputTokens) => ({ events: message([text(t)], { inputTokens }) });

function sessionEntries(w) {
  const [file] = [...new Bun.Glob("*.jsonl").scanSync(`${w.ws}/sessions`)];
  return readFileSync(`${w.ws}/sessions/${file}`, "utf8").trim().split("\n").map((l) => JSON.parse(l));
}
const compactions = (w) => sessionEntries(w).filter((e) => e.type === "compaction");
const summaryCalls = (w) => w.upstream.messageRequests().filter((r) => JSON.stringify(r.body).includes("<conversation>"));

// Two turns: the first holds an error-tagged private exchange and reasoning
// (summarized later); the second a tagged success (kept) and ends at
// `secondContext` tokens. The first ends at 290,000: under the 300,000 trigger.
function twoTurns(secondContext, extra = []) {
  return [
    toolReply("recall_fail", { about: "ARGSECRET-66" }),
    { events: message([thinking("THINKSECRET-99"), text("noted")], { inputTokens: 290_000 }) },
    toolReply("recall", { about: "ARGSECRET-66" }),
    reply("second", secondContext),
    ...extra,
  ];
}

describe("compaction in the worker (15.1, 15.2)", () => {
  test("B105/B109/B110/B112: a 1M model compacts at 300,000 through the host compactor; no secret in the request; stored, reported, read back after a restart", async () => {
    let asked;
    const w = await worker({
      content: content(), tools: hostTools, config: ENGINE, script: twoTurns(310_000),
      peerOptions: {
        compactor: (req) => {
          asked = req;
          return { summary: "They planned a trip.", firstKeptEntryId: req.firstKeptEntryId, tokensBefore: req.tokensBefore, estimatedTokensAfter: 12_000, details: { decisions: 3 } };
        },
      },
    });
    await w.peer.whenReady();
    expect((await w.waitLog("compaction ready")).hostCompactor).toBe(true);
    expect((await w.peer.runTurn(ann("t1", big("first")))).text).toBe("noted");
    expect(w.peer.compactions.length).toBe(0);                      // 290,000 stays under the trigger
    expect((await w.peer.runTurn(ann("t2", big("second")))).text).toBe("second");

    expect(w.peer.compactions.length).toBe(1);
    expect(asked.reason).toBe("threshold");
    expect(asked.tokensBefore).toBeGreaterThan(300_000);
    expect(typeof asked.isSplitTurn).toBe("boolean");
    const whole = JSON.stringify(asked);
    for (const s of SECRETS) expect(whole).not.toContain(s);
    expect(JSON.stringify(asked.keptMessages)).toContain("(another person's private memory, hidden)");
    expect(JSON.stringify([asked.messagesToSummarize, asked.turnPrefixMessages])).toContain("first lorem");
    expect(asked.keptMessages[0].role).toBe("user");
    expect(asked).toMatchObject({ readFiles: [], modifiedFiles: [] });
    expect(summaryCalls(w).length).toBe(0);                         // no Pi summary ran

    const [entry] = compactions(w);
    expect(entry.summary).toBe("They planned a trip.");
    expect(entry.details).toEqual({ decisions: 3, engine: "my-compaction" });
    expect(entry.firstKeptEntryId).toBe(asked.firstKeptEntryId);
    expect(sessionEntries(w).some((e) => e.id === entry.firstKeptEntryId)).toBe(true);

    expect(w.peer.reports).toHaveLength(1);
    const r = w.peer.reports[0];
    expect(r).toMatchObject({ type: "end", reason: "threshold", aborted: false, willRetry: false, engine: "extension", tokensAfter: 12_000, nextCompactionAt: 300_000 });
    expect(r.tokensBefore).toBe(asked.tokensBefore);
    expect(Number.isInteger(r.contextAfter) && r.contextAfter > 0).toBe(true);
    const ev = w.peer.events;
    expect(ev.lastIndexOf("POST /compaction/report")).toBeLessThan(ev.lastIndexOf("POST /worker/result"));

    // A restart (the container removed, the workspace kept): the next request
    // carries the stored summary, not the summarized turn.
    await w.kill();
    const w2 = await worker({ dir: w.dir, upstream: w.upstream, tools: hostTools, config: ENGINE });
    await w2.peer.whenReady();
    w.upstream.push(reply("after restart", 40_000));
    expect((await w2.peer.runTurn(ann("t3", "hello again"))).text).toBe("after restart");
    const sent = JSON.stringify(w.upstream.messageRequests().at(-1).body);
    expect(sent).toContain("They planned a trip.");
    expect(sent).not.toContain("first lorem");
    expect(sent).toContain("second lorem");
  }, 120_000);

  test("B107/B117: without a compactor no host request is made, Pi's own summary runs at 300,000 and never sees a private exchange, prompt memory or reasoning", async () => {
    const w = await worker({ content: content(), tools: hostTools, config: {}, script: twoTurns(310_000, [textReply("## Goal\nPi's summary")]) });
    await w.peer.whenReady();
    expect((await w.waitLog("compaction ready")).hostCompactor).toBe(false);
    await w.peer.runTurn(ann("t1", big("first")));
    expect(summaryCalls(w).length).toBe(0);
    expect((await w.peer.runTurn(ann("t2", big("second")))).text).toBe("second");
    expect(w.peer.events).not.toContain("POST /compaction/compact");
    const calls = summaryCalls(w);
    expect(calls.length).toBe(1);
    const sent = JSON.stringify(calls[0].body);
    expect(sent).toContain("first lorem");
    for (const s of SECRETS) expect(sent).not.toContain(s);
    expect(sent).not.toContain("recall_fail");
    expect(compactions(w)[0].summary).toContain("Pi's summary");
    expect(w.peer.reports).toEqual([expect.objectContaining({ type: "end", reason: "threshold", engine: "pi", nextCompactionAt: 300_000 })]);
  }, 120_000);

  test("B107 (claude-bridge): the bridge's own summary through Claude Code is fed the redacted preparation: no private exchange, prompt memory or reasoning", async () => {
    // A 200,000-token window is at or under SOFT, so Pi's own threshold
    // (200,000 - 16,384) applies: 100,000 stays under it, 190,000 compacts
    // (Claude Code itself refuses a prompt it counts near its window, so the
    // first turn stays well under). Bridge tools reach Claude Code as
    // mcp__custom-tools__<name>.
    const w = await worker({
      content: content({ bridge: true }), tools: hostTools, config: {},
      script: [
        toolReply("mcp__custom-tools__recall_fail", { about: "ARGSECRET-66" }),
        { events: message([thinking("THINKSECRET-99"), text("noted")], { inputTokens: 100_000 }) },
        toolReply("mcp__custom-tools__recall", { about: "ARGSECRET-66" }),
        reply("second", 190_000),
        textReply("## Goal\nThe bridge's summary"),
      ],
    });
    await w.peer.whenReady();
    expect((await w.waitLog("compaction ready")).hostCompactor).toBe(false);
    expect((await w.peer.runTurn(ann("t1", big("first")))).text).toBe("noted");
    const stored = JSON.stringify(sessionEntries(w));                // the raw session keeps what the summary must not get
    expect(["ARGSECRET-66", "ERRSECRET-88", "THINKSECRET-99"].filter((s) => !stored.includes(s))).toEqual([]);
    expect(summaryCalls(w).length).toBe(0);
    expect((await w.peer.runTurn(ann("t2", big("second")))).text).toBe("second");
    expect(w.peer.events).not.toContain("POST /compaction/compact");
    const calls = summaryCalls(w);
    expect(calls.length).toBe(1);
    // Claude Code's isolated summary query (the bridge's takeover: no tools),
    // not one of the turns' requests.
    expect(calls[0].headers["user-agent"]).toStartWith("claude-cli/");
    expect(calls[0].body.tools ?? []).toEqual([]);
    const sent = JSON.stringify(calls[0].body);
    expect(sent.includes("first lorem")).toBe(true);
    expect([...SECRETS, "recall_fail"].filter((s) => sent.includes(s))).toEqual([]);
    const [entry] = compactions(w);
    expect(entry.summary).toContain("The bridge's summary");
    expect(w.peer.reports).toEqual([expect.objectContaining({ type: "end", reason: "threshold", engine: "pi" })]);
  }, 120_000);

  test("B111 (worker half): a declining compactor falls back to Pi's summary with the host's reason logged", async () => {
    const w = await worker({
      content: content(), tools: hostTools, config: ENGINE, script: twoTurns(310_000, [textReply("Pi wrote this")]),
      peerOptions: { compactor: () => undefined },
    });
    await w.peer.whenReady();
    await w.peer.runTurn(ann("t1", big("first")));
    expect((await w.peer.runTurn(ann("t2", big("second")))).text).toBe("second");
    expect(w.peer.compactions.length).toBe(1);
    expect(w.logs().find((l) => l.msg === "compaction falls back to Pi's summary").fallback).toBe("the compactor declined");
    expect(summaryCalls(w).length).toBe(1);
    expect(compactions(w)[0].summary).toContain("Pi wrote this");
    expect(w.peer.reports[0]).toMatchObject({ type: "end", engine: "pi" });
  }, 120_000);

  test("B114/B115: a host compaction that left about 280,000 tokens moves the trigger to 500,000; past 500,000 the host compactor is skipped", async () => {
    const w = await worker({
      content: content(), tools: hostTools, config: ENGINE,
      script: [...twoTurns(310_000), reply("third", 480_000), reply("fourth", 520_000), textReply("Pi's summary above the ceiling")],
      peerOptions: {
        compactor: (req) => ({ summary: "s".repeat(1_120_000), firstKeptEntryId: req.firstKeptEntryId, tokensBefore: req.tokensBefore }),
      },
    });
    await w.peer.whenReady();
    await w.peer.runTurn(ann("t1", big("first")));
    await w.peer.runTurn(ann("t2", big("second")));
    expect(w.peer.reports[0]).toMatchObject({ engine: "extension", nextCompactionAt: 500_000 });
    expect((await w.peer.runTurn(ann("t3", big("third")))).text).toBe("third");
    expect(compactions(w).length).toBe(1);                          // 480,000 < 500,000
    const fourth = await w.peer.runTurn(ann("t4", big("fourth")));
    expect(fourth).toEqual({ ok: true, text: "fourth", files: [] });
    expect(w.peer.compactions.length).toBe(1);                      // skipped, not asked
    const bypass = w.peer.reports.find((r) => r.type === "bypass");
    expect(bypass.reason).toBe("above the hard ceiling");
    expect(bypass.tokensBefore).toBeGreaterThan(500_000);
    expect(w.logs().some((l) => l.msg === "compaction skips the host compactor" && l.reason === "above the hard ceiling")).toBe(true);
    expect(compactions(w).length).toBe(2);
    expect(compactions(w)[1].summary).toContain("Pi's summary above the ceiling");
    expect(w.peer.reports.at(-1)).toMatchObject({ type: "end", engine: "pi" });
  }, 180_000);

  test("B116: aborting a compaction aborts the host compactor's request, falls back, and records an aborted compaction", async () => {
    const w = await worker({
      content: content({ abortAfterMs: 500 }), tools: hostTools, config: ENGINE, script: twoTurns(310_000),
      peerOptions: { compactor: (_req, { signal }) => new Promise((resolve) => signal.addEventListener("abort", () => resolve(undefined), { once: true })) },
    });
    await w.peer.whenReady();
    await w.peer.runTurn(ann("t1", big("first")));
    expect((await w.peer.runTurn(ann("t2", big("second")))).ok).toBe(true);
    expect(w.peer.compactions.length).toBe(1);
    expect(w.peer.compactorAborts).toBe(1);
    expect(w.logs().some((l) => l.msg === "compaction falls back to Pi's summary")).toBe(true);
    expect(summaryCalls(w).length).toBe(0);
    expect(compactions(w).length).toBe(0);
    expect(w.peer.reports).toEqual([expect.objectContaining({ type: "end", reason: "threshold", aborted: true })]);
  }, 120_000);
});
