// worker_outbox.test.mjs: reply files from the worker outbox (spec/rich-mode.md
// 16.5; behaviour 128 and the worker half of 31): the real worker on Pi's own
// anthropic-messages provider (through the forwarder), a local content tool
// that writes into the turn's outbox the way a contribution does, a host tool
// answering an image, files and links planted by the "guest", and a file
// whose bytes read differ from its size (a sysfs attribute bind-mounted in the
// worker's own user and mount namespace).
import { describe, test, expect, afterEach } from "bun:test";
import { existsSync, readFileSync, writeFileSync, symlinkSync, mkdirSync, readdirSync, statSync } from "node:fs";
import { startWorker, turn } from "./harness.mjs";
import { textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });

// make_files {files:[{name, text}], link?:{name, to}, bind?:{name, from}}
// writes into the turn's outbox; bind mounts \`from\` over the entry \`name\`
// (only in a worker started in its own user and mount namespace).
const CONTENT = `
import { writeFileSync, symlinkSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
export function workerContent() {
  return {
    model: { provider: "spec-direct", id: "spec-model" },
    brokerTools: [{ name: "draw", description: "Draw", parameters: { type: "object", properties: {} } }],
    toolNames: ["make_files"],
    extensions: (turn) => [(pi) => {
      pi.registerProvider("spec-direct", {
        baseUrl: process.env.ANTHROPIC_BASE_URL, apiKey: "sandbox-dummy-token", api: "anthropic-messages",
        models: [{ id: "spec-model", name: "spec", reasoning: false, input: ["text", "image"],
          cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 200000, maxTokens: 16384 }],
      });
      pi.registerTool({
        name: "make_files", label: "make files", description: "Write reply files",
        parameters: { type: "object", properties: { files: { type: "array" }, link: { type: "object" } } },
        async execute(_id, p) {
          for (const f of p.files ?? []) writeFileSync(join(turn.outbox, f.name), f.text);
          if (p.link) symlinkSync(p.link.to, join(turn.outbox, p.link.name));
          if (p.bind) {
            writeFileSync(join(turn.outbox, p.bind.name), "placeholder");
            const m = spawnSync("mount", ["--bind", p.bind.from, join(turn.outbox, p.bind.name)], { encoding: "utf8" });
            if (m.status !== 0) throw new Error("mount --bind failed: " + m.stderr);
          }
          return { content: [{ type: "text", text: "written" }], details: {} };
        },
      });
    }],
  };
}`;
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
const b64 = (s) => Buffer.from(s).toString("base64");

describe("the worker outbox (16.5)", () => {
  test("B31/B128: outbox files and a host tool's image come back as base64 reply files; the empty folder is removed", async () => {
    const w = await worker({
      content: CONTENT, tools: { draw: () => ({ ok: true, text: "drawn", image: { data: PNG, mimeType: "image/png" } }) },
      script: [toolReply("make_files", { files: [{ name: "notes.txt", text: "the notes" }, { name: "image.png", text: "mine" }] }), toolReply("draw", {}), textReply("  here you go  ")],
    });
    await w.peer.whenReady();
    const r = await w.peer.runTurn(turn());
    expect(r).toEqual({ ok: true, text: "here you go", files: [
      { name: "image-2.png", data: PNG }, { name: "image.png", data: b64("mine") }, { name: "notes.txt", data: b64("the notes") },
    ] });
    w.upstream.push(textReply("nothing to send"));
    expect((await w.peer.runTurn(turn({ turnId: "t2" })))).toEqual({ ok: true, text: "nothing to send", files: [] });
    expect(existsSync(`${w.ws}/outbox/t2`)).toBe(false);
  });

  test("B128: more than ten entries, an unsafe name, or a planted link fail the turn's output", async () => {
    const eleven = Array.from({ length: 11 }, (_, i) => ({ name: `f${i}.txt`, text: "x" }));
    const w = await worker({
      content: CONTENT,
      files: { "secret.txt": "outside secret" },
      script: [
        toolReply("make_files", { files: eleven }), textReply("eleven"),
        toolReply("make_files", { files: [{ name: "bad\u0001name.txt", text: "x" }] }), textReply("unsafe"),
        toolReply("make_files", { link: { name: "leak.txt", to: "../../../secret.txt" } }), textReply("link"),
      ],
    });
    await w.peer.whenReady();
    const failed = { ok: false, error: "Worker output failed" };
    expect(await w.peer.runTurn(turn({ turnId: "a1" }))).toEqual(failed);
    expect(await w.peer.runTurn(turn({ turnId: "a2" }))).toEqual(failed);
    // The link points at a file outside the workspace; it is never followed.
    const res = await w.peer.runTurn(turn({ turnId: "a3" }));
    expect(res).toEqual(failed);
    const errors = w.logs().filter((l) => l.msg === "turn output failed").map((l) => l.error);
    expect(errors).toEqual(["Output file bounds exceeded", "Output file bounds exceeded", "Invalid or oversized file"]);
    expect(JSON.stringify(w.peer.results)).not.toContain(b64("outside secret"));
  });

  test("B128: a link planted at the turn's outbox folder is replaced, never followed", async () => {
    const w = await worker({ content: CONTENT, script: [toolReply("make_files", { files: [{ name: "a.txt", text: "A" }] }), textReply("ok")] });
    mkdirSync(`${w.dir}/elsewhere`);
    writeFileSync(`${w.dir}/elsewhere/loot.txt`, "outside");
    mkdirSync(`${w.ws}/outbox`, { recursive: true });
    symlinkSync(`${w.dir}/elsewhere`, `${w.ws}/outbox/t1`);
    await w.peer.whenReady();
    expect(await w.peer.runTurn(turn())).toEqual({ ok: true, text: "ok", files: [{ name: "a.txt", data: b64("A") }] });
    expect(readdirSync(`${w.dir}/elsewhere`)).toEqual(["loot.txt"]);
    expect(readFileSync(`${w.dir}/elsewhere/loot.txt`, "utf8")).toBe("outside");
  });

  // "The bytes read must equal its size": the worker fstats the open
  // descriptor and reads that many bytes. A sysfs attribute is a regular
  // file whose stat size (4096) is never what a read delivers, exactly what
  // the reader sees when a file shrinks between its fstat and its read, with
  // no race to win. It is bind-mounted over an outbox entry during the turn,
  // in the worker's own user and mount namespace (the mount goes with the
  // process; the harness removes the plain file underneath).
  test("B128: a file whose bytes read differ from its size (changed while reading) fails the turn's output", async () => {
    const ATTR = "/sys/kernel/uevent_seqnum";
    expect(statSync(ATTR).isFile() && statSync(ATTR).size > readFileSync(ATTR).byteLength).toBe(true);
    const ns = Bun.spawnSync(["unshare", "--user", "--map-root-user", "--mount", "true"], { stderr: "pipe" });
    if (ns.exitCode !== 0) throw new Error(`this spec needs unprivileged user namespaces (unshare --user --map-root-user --mount): ${ns.stderr}`);
    const w = await worker({
      content: CONTENT, wrap: ["unshare", "--user", "--map-root-user", "--mount"],
      script: [toolReply("make_files", { files: [{ name: "a.txt", text: "A" }], bind: { name: "b.txt", from: ATTR } }), textReply("changed")],
    });
    await w.peer.whenReady();
    expect(await w.peer.runTurn(turn())).toEqual({ ok: false, error: "Worker output failed" });
    expect(w.logs().filter((l) => l.msg === "turn output failed").map((l) => l.error)).toEqual(["File changed while reading"]);
  });
});
