// worker_skills.test.mjs: skills, read_skill and the tool gates of
// spec/rich-mode.md 17.4, and the active-tool check at startup, through a real
// worker process (gate and read_skill answers are read back from what the
// model is sent next).
import { describe, test, expect, afterEach } from "bun:test";
import { startWorker, turn } from "./harness.mjs";
import { textReply, toolReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
async function worker(opts) { const w = await startWorker(opts); live.push(w); return w; }
afterEach(async () => { while (live.length) await live.pop().stop(); });
const seen = (req) => JSON.stringify(req.body);

const SKILL_CONTENT = (extra = "") => `
import { join } from "node:path";
export function workerContent() {
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    skillsDir: join(import.meta.dir, "skills"),
    brokerTools: [{ name: "roll", description: "Roll dice", parameters: { type: "object", properties: {} } }],
    ${extra}
  };
}`;
const skill = (name, body = "Use two dice.", extra = "") => `---\nname: ${name}\ndescription: How ${name} works here.\n${extra}---\n${body}\n`;

describe("skills (17.4)", () => {
  test("a skill whose frontmatter name differs from its directory fails startup", async () => {
    const w = await worker({ content: SKILL_CONTENT(), files: { "skills/dice/SKILL.md": skill("cards") } });
    expect(await w.exited).toBe(1);
    expect(w.logs().find((l) => l.msg === "sandbox worker failed").error).toContain("skill dice needs a matching name and a description");
  });

  test("a skill without a description fails startup", async () => {
    const w = await worker({ content: SKILL_CONTENT(), files: { "skills/dice/SKILL.md": "---\nname: dice\n---\nbody\n" } });
    expect(await w.exited).toBe(1);
    expect(w.logs().find((l) => l.msg === "sandbox worker failed").error).toContain("skill dice needs a matching name and a description");
  });

  test("a gated tool is blocked until its skill is read, then runs; read_skill errors are exact", async () => {
    const big = "x".repeat(50_000);
    const w = await worker({
      content: SKILL_CONTENT(),
      files: {
        "skills/dice/SKILL.md": skill("dice", "Roll with two dice.", "tools: [roll]\n"),
        "skills/dice/long.md": big,
        "skills/dice/huge.md": "y".repeat(256 * 1024 + 1),
        "outside.md": "outside text",
      },
      tools: { roll: () => ({ ok: true, text: "rolled 7" }) },
      script: [
        toolReply("mcp__custom-tools__roll", {}),
        toolReply("mcp__custom-tools__read_skill", { skill: "cards" }),
        toolReply("mcp__custom-tools__read_skill", { skill: "dice", path: "../../outside.md" }),
        toolReply("mcp__custom-tools__read_skill", { skill: "dice", path: "huge.md" }),
        toolReply("mcp__custom-tools__read_skill", { skill: "dice", path: "long.md" }),
        toolReply("mcp__custom-tools__read_skill", { skill: "dice" }),
        toolReply("mcp__custom-tools__roll", {}),
        textReply("seven"),
      ],
    });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(turn())).text).toBe("seven");
    const reqs = w.upstream.messageRequests();
    const after = (i) => seen(reqs[i]);
    expect(after(1)).toContain("Read the dice skill with read_skill first; it sets how roll is used here.");
    expect(after(2)).toContain("there is no skill named cards");
    expect(after(3)).toContain("../../outside.md is not a file of dice");
    expect(after(3)).not.toContain("outside text");
    expect(after(4)).toContain("Skill file too large");
    expect(after(5)).toContain("[truncated at 40000 characters]");
    expect(after(6)).toContain("Roll with two dice.");
    expect(after(7)).toContain("rolled 7");
    expect(w.peer.toolCalls.map((c) => c.name)).toEqual(["roll"]);
  });

  test("a skill directory that links outside the tree is refused by read_skill", async () => {
    const w = await worker({
      content: SKILL_CONTENT(),
      files: { "skills/dice/SKILL.md": skill("dice"), "elsewhere/evil/SKILL.md": skill("evil", "outside body") },
      script: [toolReply("mcp__custom-tools__read_skill", { skill: "evil" }), textReply("ok")],
    });
    const { symlinkSync } = await import("node:fs");
    await w.kill();
    symlinkSync(`${w.dir}/elsewhere/evil`, `${w.dir}/skills/evil`);
    const again = await worker({ dir: w.dir, upstream: w.upstream });
    await again.peer.whenReady();
    expect((await again.peer.runTurn(turn())).text).toBe("ok");
    const last = seen(w.upstream.messageRequests().at(-1));
    expect(last).toContain("Skill directory escapes the content tree");
    expect(last).not.toContain("outside body");
  });
});

describe("active tools (17.4)", () => {
  test("a declared tool that no extension registers fails startup with tools are not registered", async () => {
    const w = await worker({
      content: `export function workerContent() { return { model: { provider: "claude-bridge", id: "claude-sonnet-4-6" }, toolNames: ["dice_roll"] }; }`,
    });
    expect(await w.exited).toBe(1);
    expect(w.logs().find((l) => l.msg === "sandbox worker failed").error).toContain("tools are not registered: dice_roll");
  });

  test("a content extension's tool is active and sees the turn's speaker", async () => {
    const w = await worker({
      content: `
import { Type } from "typebox";
export function workerContent() {
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    toolNames: ["whoami"],
    extensions: (turn) => [(pi) => pi.registerTool({
      name: "whoami", label: "whoami", description: "Who is speaking", parameters: Type.Object({}),
      async execute() { return { content: [{ type: "text", text: "speaker is " + turn.author.name + " in " + turn.turnId }], details: {} }; },
    })],
  };
}`,
      script: [toolReply("mcp__custom-tools__whoami", {}), textReply("ok")],
    });
    await w.peer.whenReady();
    expect((await w.peer.runTurn(turn())).text).toBe("ok");
    expect(w.logs().find((l) => l.msg === "sandbox worker ready").tools).toEqual(["read_attachment", "whoami"]);
    expect(seen(w.upstream.messageRequests().at(-1))).toContain("speaker is Ann in t1");
  });
});
