// examples.test.ts: the Bun examples stay runnable. guest-bot.ts --offline
// (no Docker: host.lua's stand-in driver) is run in a child process and its
// decisions checked; roundtable.config.ts is parsed (running it would take
// the product's real directories under $HOME and /tmp).
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const EXAMPLES = join(import.meta.dir, "..", "..", "examples", "bun");

describe("examples/bun", () => {
  test(
    "guest-bot.ts --offline prints each decision and reply and cleans up",
    async () => {
      const child = Bun.spawn([process.execPath, join(EXAMPLES, "guest-bot.ts"), "--offline"], {
        cwd: EXAMPLES,
        env: { ...process.env },
        stdout: "pipe",
        stderr: "pipe",
      });
      const killer = setTimeout(() => child.kill(9), 60_000);
      const code = await child.exited;
      clearTimeout(killer);
      const out = await new Response(child.stdout).text();
      const err = await new Response(child.stderr).text();
      expect({ code, err: code === 0 ? "" : err }).toEqual({ code: 0, err: "" });
      const decisions = out.split("\n").filter((l) => l.startsWith("   claim: ")).map((l) => l.slice(10));
      expect(decisions).toEqual([
        "command",
        "answer",
        "answer",
        "drop",
        "drop",
        "drop",
        "command",
        "command",
        "not claimed -> the host routes it to its own agents as usual",
      ]);
      expect(out).toContain("bot: Alice, (offline, no container) you said: @bot what time is it?");
      expect(out).toContain("bot (ephemeral): Sandbox routing is enabled.");
      expect(out).toContain("bot (ephemeral): Sandbox routing is disabled.");
      expect(out).toContain("guest-bot: sandboxed channels now: []");
    },
    90_000,
  );

  test("roundtable.config.ts imports sandbox from the package and exports guestPlugins", () => {
    const code = readFileSync(join(EXAMPLES, "roundtable.config.ts"), "utf8");
    const scan = new Bun.Transpiler({ loader: "ts" }).scan(code);
    expect(scan.exports).toEqual(["guestPlugins"]);
    expect(scan.imports.map((i) => i.path).sort()).toEqual(["node:path", "pi-roundtable-sandbox"]);
  });

  // rich-host.ts needs the Docker daemon and the rich image (`make image-pi`);
  // SANDBOX_DOCKER_TEST=1 makes their absence a failure, as the Docker specs do.
  const PI_IMAGE = process.env.PI_IMAGE ?? "pi-roundtable-sandbox:pi";
  const dockerReady =
    process.platform === "linux" && process.getuid?.() !== 0 &&
    Bun.spawnSync(["docker", "image", "inspect", PI_IMAGE], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
  const richCase = dockerReady || process.env.SANDBOX_DOCKER_TEST === "1" ? test : test.skip;
  richCase(
    "rich-host.ts runs turns in one channel through a real Pi container: continued, a private host result, Bo refused, a reply file",
    async () => {
      const child = Bun.spawn([process.execPath, join(EXAMPLES, "rich-host.ts"), "--log-driver", "local"], {
        cwd: EXAMPLES, env: { ...process.env }, stdout: "pipe", stderr: "pipe",
      });
      const killer = setTimeout(() => child.kill(9), 400_000);
      const code = await child.exited;
      clearTimeout(killer);
      const out = await new Response(child.stdout).text();
      const err = await new Response(child.stderr).text();
      expect({ code, err: code === 0 ? "" : `${out}\n${err}` }).toEqual({ code: 0, err: "" });
      expect(out).toContain("t1 bot: Nice to meet you, Ann.");
      expect(out).toContain("t2 bot: You told me your name is Ann.");
      expect(out).toContain("the second turn's model request carries the first turn: true");
      expect(out).toContain("t3 bot: Your note is private; I found it.");
      expect(out).toContain("t4 bot: (refused) ");
      expect(out).toContain("claude-bridge cannot replay another reader's private-memory turns");
      expect(out).toContain("Bo's turn was refused without a model call: true");
      expect(out).toContain("reply file: image.png (70 bytes)");
      expect(out).toContain("the upstream saw the host token only: true");
      // the operator log (JSON lines on stderr): one `turn finished` per turn with
      // its id as `turn`, and no refusal, so the hostile-traffic alert stays quiet:
      // the worker's own HEAD /anthropic preflight is answered, never audited
      const lines = err.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, unknown>);
      const finished = lines.filter((l) => l.msg === "turn finished");
      expect(finished.map((l) => l.turn)).toEqual(["t1", "t2", "t3", "t4", "t5"]);
      expect(finished.map((l) => l.reason)).toEqual(["ok", "ok", "ok", "worker_failed", "ok"]);
      expect(lines.filter((l) => l.msg === "broker refused")).toEqual([]);
      expect(lines.filter((l) => "turnId" in l)).toEqual([]);
    },
    420_000,
  );
});
