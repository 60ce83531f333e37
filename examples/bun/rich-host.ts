// examples/bun/rich-host.ts: turns in one rich-mode channel through a real
// Pi container (shared/spec/rich-mode.md): the second continues the first's
// Pi session; the third calls the private host tool `note` for Ann; Bo's
// turn is then refused (the claude-bridge model cannot replay Ann's private
// exchange to him, section 14); Ann's last turn calls `draw` and gets the
// reply file image.png (16.5). The runtime is examples/rich.conf.lua, loaded
// by the Bun bridge's PiSandboxRuntime, on an image derived from
// pi-roundtable-sandbox:pi with examples/rich-content.ts as its content
// module (built here, removed at the end); the model is a scripted
// Anthropic-shaped upstream on 127.0.0.1
// (spec/fixtures/anthropic_sse_upstream.mjs), reached only by the host's
// broker through the config's fetchImpl seam, with the host's token. The
// container has no network and only the dummy token.
//
//   make image-pi && runuser -u sbx -- bun examples/bun/rich-host.ts
//
// (PI_IMAGE names another base image than pi-roundtable-sandbox:pi.)
//
// Run it as a non-root user in the docker group (the engine refuses root).
// On a host whose Docker daemon has no journald, pass --log-driver local.
// Everything it creates (the channel's container, the derived image, the
// party directory) is removed at the end.
import { chmodSync, copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PiSandboxRuntime, disposeUtilityEngine } from "pi-roundtable-sandbox";
import { startAnthropicUpstream, textReply, toolReply } from "../../spec/fixtures/anthropic_sse_upstream.mjs";

if (process.getuid?.() === 0) {
  console.error("rich-host: the sandbox refuses root; run it as the service account, e.g. runuser -u sbx -- bun examples/bun/rich-host.ts");
  process.exit(1);
}
const at = process.argv.indexOf("--log-driver");
const logDriver = at > 0 ? process.argv[at + 1] : undefined;

// Claude Code names the worker's host tools mcp__custom-tools__<name>.
const tool = (name: string, input: object) => toolReply(`mcp__custom-tools__${name}`, input);
const upstream = await startAnthropicUpstream({
  script: [
    textReply("Nice to meet you, Ann."), textReply("You told me your name is Ann."),
    tool("note", {}), textReply("Your note is private; I found it."),
    tool("draw", { subject: "a dot" }), textReply("Here is your picture."),
  ],
});
const partyDir = mkdtempSync(join(tmpdir(), "rich-example-"));
chmodSync(partyDir, 0o700);
const base = process.env.PI_IMAGE ?? "pi-roundtable-sandbox:pi";
const image = `pi-roundtable-sandbox-example/rich:${process.pid}`;
const ctx = join(partyDir, "image");
await Bun.$`mkdir -p ${ctx}`;
copyFileSync(join(import.meta.dir, "..", "rich-content.ts"), join(ctx, "content.ts"));
writeFileSync(join(ctx, "Dockerfile"), `FROM ${base}\nCOPY content.ts /app/worker/content.ts\n`);
await Bun.$`chmod -R a+rX ${ctx}`;
await Bun.$`docker build -q -t ${image} ${ctx}`.env({ ...process.env, DOCKER_BUILDKIT: "0" }).quiet();
const channel = `example:rich-${process.pid}`;
const rt = new PiSandboxRuntime({
  config: join(import.meta.dir, "..", "rich.conf.lua"),
  options: { partyDir: join(partyDir, "party"), image, scriptedUpstream: upstream.url, logDriver },
});
const ann = { id: "123", name: "Ann", principalId: "ann" };
const bo = { id: "456", name: "Bo", principalId: "bo" };
let code = 0;
try {
  const say = async (turnId: string, author: typeof ann, text: string) => {
    const r = await rt.runTurn({ channel, profile: "default", turnId, author, text });
    console.log(`${turnId} ${author.name}: ${text}\n${turnId} bot: ${r.ok ? r.text : `(refused) ${r.error}`}`);
    return r;
  };
  for (const [turnId, text] of [["t1", "Hello, my name is Ann."], ["t2", "What is my name?"]]) {
    const r = await say(turnId, ann, text);
    if (!r.ok) throw new Error(`${turnId}: ${r.error}`);
  }
  let calls = upstream.messageRequests();
  const last = JSON.stringify(calls[calls.length - 1].body.messages);
  const continued = last.includes("Hello, my name is Ann.") && last.includes("Nice to meet you, Ann.");
  console.log(`the second turn's model request carries the first turn: ${continued}`);

  const noted = await say("t3", ann, "What does my note say?");
  const before = upstream.messageRequests().length;
  const refused = await say("t4", bo, "What did Ann's note say?");
  const boRefused = !refused.ok && upstream.messageRequests().length === before;
  console.log(`Bo's turn was refused without a model call: ${boRefused}`);
  const drawn = await say("t5", ann, "Draw me a dot.");
  const files = drawn.ok ? drawn.files ?? [] : [];
  for (const f of files) console.log(`reply file: ${f.name} (${f.data.length} bytes)`);

  calls = upstream.messageRequests();
  console.log(`the upstream saw the host token only: ${calls.every((c) => c.headers.authorization === `Bearer example-host-token-${channel}`)}`);
  console.log(`Pi session files: ${(await Array.fromAsync(new Bun.Glob("*.jsonl").scan(await rt.sessionsDir(channel)))).length}`);
  if (!continued || !noted.ok || !boRefused || files.length !== 1) code = 1;
} catch (err) {
  console.error(`rich-host: ${(err as Error).message}`);
  code = 1;
} finally {
  await rt.stop(channel).catch(() => undefined);
  await rt.dispose().catch(() => undefined);
  disposeUtilityEngine();
  upstream.stop();
  await Bun.$`docker image rm -f ${image}`.quiet().nothrow();
  rmSync(partyDir, { recursive: true, force: true });
}
process.exit(code);
