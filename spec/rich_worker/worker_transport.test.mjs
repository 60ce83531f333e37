// worker_transport.test.mjs: the worker loop of spec/rich-mode.md 10.7 step 3
// against the scripted peer: ready before every poll, a non-200 poll goes
// back to ready, "broker poll failed" is logged once until the next success,
// and the judged thinking level reaches the model call.
import { describe, test, expect, afterEach } from "bun:test";
import { startWorker, turn, until } from "./harness.mjs";
import { textReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });

describe("worker loop (10.7)", () => {
  test("re-posts ready before every poll and goes back to ready after a 408", async () => {
    const w = await worker({ peerOptions: { pollMs: 100 } });
    await until(() => w.peer.polls >= 3, "three polls");
    const seq = w.peer.events.filter((e) => e === "POST /worker/ready" || e === "GET /worker/next");
    for (let i = 0; i + 1 < seq.length; i += 2) expect(seq.slice(i, i + 2)).toEqual(["POST /worker/ready", "GET /worker/next"]);
    expect(w.peer.readies.every((r) => JSON.stringify(r) === '{"capabilities":{"privateTo":true,"readerRecords":true},"privateHistory":false}')).toBe(true);
  });

  test("a failing broker is logged as broker poll failed once, until the next success", async () => {
    let failing = true;
    const w = await worker({
      peerOptions: { pollMs: 100, overrides: { "POST /worker/ready": () => (failing ? new Response("down", { status: 500 }) : undefined) } },
    });
    await until(() => w.peer.events.filter((e) => e === "POST /worker/ready").length >= 4, "four failed readies");
    expect(w.logs().filter((l) => l.msg === "broker poll failed")).toHaveLength(1);
    failing = false;
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn());
    expect(result.ok).toBe(true);
    failing = true;
    const seen = w.peer.events.length;
    await until(() => w.peer.events.length >= seen + 3, "more failed readies");
    expect(w.logs().filter((l) => l.msg === "broker poll failed")).toHaveLength(2);
  });

  test("the turn's thinking level is the effort of the model call", async () => {
    const w = await worker({ script: [textReply("a"), textReply("b")] });
    await w.peer.whenReady();
    await w.peer.runTurn(turn({ thinking: "high" }));
    await w.peer.runTurn(turn({ turnId: "t2", thinking: "low" }));
    const [first, second] = w.upstream.messageRequests().slice(-2).map((r) => r.body);
    expect(first.output_config?.effort).toBe("high");
    expect(second.output_config?.effort).toBe("low");
  });
});
