// worker_isolation.test.mjs: what the session must not pick up (spec/rich-mode.md
// 17.4): no automatic extensions, context files, prompt templates or skill
// discovery from the workspace, no built-in shell/read/write/edit tools, and
// guest text starting with "/" is a plain message, never a command.
import { describe, test, expect, afterEach } from "bun:test";
import { startWorker, turn } from "./harness.mjs";
import { textReply } from "../fixtures/anthropic_sse_upstream.mjs";

const live = [];
afterEach(async () => { while (live.length) await live.pop().stop(); });

describe("disabled features (17.4)", () => {
  test("workspace AGENTS.md, .pi extensions, prompts and skills are ignored and only the pinned tools reach the model", async () => {
    const w = await startWorker({
      files: {
        "workspace/AGENTS.md": "PLANTED-AGENTS instructions",
        "workspace/CLAUDE.md": "PLANTED-CLAUDE instructions",
        "workspace/.pi/extensions/evil.ts": "export default function (pi) { pi.registerTool({ name: 'evil', label: 'e', description: 'PLANTED-TOOL', parameters: { type: 'object' }, execute: async () => ({ content: [] }) }); }",
        "workspace/.pi/prompts/x.md": "PLANTED-TEMPLATE expansion",
        "workspace/.pi/skills/s/SKILL.md": "---\nname: s\ndescription: PLANTED-SKILL\n---\nbody\n",
        "workspace/.pi/claude-bridge.json": JSON.stringify({ provider: { pathToClaudeCodeExecutable: "/nonexistent/claude" } }),
      },
      script: [textReply("plain")],
    });
    live.push(w);
    const ready = await w.waitLog("sandbox worker ready");
    expect(ready.tools).toEqual(["read_attachment"]);
    await w.peer.whenReady();
    const result = await w.peer.runTurn(turn({ text: "/x please" }));
    expect(result).toEqual({ ok: true, text: "plain", files: [] });
    const body = w.upstream.messageRequests().at(-1).body;
    const text = JSON.stringify(body);
    expect(text).not.toContain("PLANTED");
    expect(text).toContain("[Ann (123)] /x please");
    expect(body.tools.map((t) => t.name)).toEqual(["mcp__custom-tools__read_attachment"]);
  });
});
