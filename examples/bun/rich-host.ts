// examples/bun/rich-host.ts: two turns in one rich-mode channel through a
// real Pi container (shared/spec/rich-mode.md), the second continuing the
// first's Pi session. The runtime is examples/rich.conf.lua, loaded by the
// Bun bridge's PiSandboxRuntime; the model is a scripted Anthropic-shaped
// upstream on 127.0.0.1 (spec/fixtures/anthropic_sse_upstream.mjs), reached
// only by the host's broker through the config's fetchImpl seam, with the
// host's token. The container has no network and only the dummy token.
//
//   make image-pi && runuser -u sbx -- bun examples/bun/rich-host.ts
//
// Run it as a non-root user in the docker group (the engine refuses root).
// On a host whose Docker daemon has no journald, pass --log-driver local.
// Everything it creates (the channel's container, the party directory) is
// removed at the end.
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PiSandboxRuntime, disposeUtilityEngine } from "pi-roundtable-sandbox";
import { startAnthropicUpstream, textReply } from "../../spec/fixtures/anthropic_sse_upstream.mjs";

if (process.getuid?.() === 0) {
  console.error("rich-host: the sandbox refuses root; run it as the service account, e.g. runuser -u sbx -- bun examples/bun/rich-host.ts");
  process.exit(1);
}
const at = process.argv.indexOf("--log-driver");
const logDriver = at > 0 ? process.argv[at + 1] : undefined;

const upstream = await startAnthropicUpstream({
  script: [textReply("Nice to meet you, Ann."), textReply("You told me your name is Ann.")],
});
const partyDir = mkdtempSync(join(tmpdir(), "rich-example-"));
chmodSync(partyDir, 0o700);
const channel = `example:rich-${process.pid}`;
const rt = new PiSandboxRuntime({
  config: join(import.meta.dir, "..", "rich.conf.lua"),
  options: { partyDir: join(partyDir, "party"), scriptedUpstream: upstream.url, logDriver },
});
const author = { id: "123", name: "Ann", principalId: "ann" };
let code = 0;
try {
  for (const [turnId, text] of [["t1", "Hello, my name is Ann."], ["t2", "What is my name?"]]) {
    const r = await rt.runTurn({ channel, profile: "default", turnId, author, text });
    if (!r.ok) throw new Error(`${turnId}: ${r.error}`);
    console.log(`${turnId} guest: ${text}\n${turnId} bot:   ${r.text}`);
  }
  const calls = upstream.messageRequests();
  const last = JSON.stringify(calls[calls.length - 1].body.messages);
  const continued = last.includes("Hello, my name is Ann.") && last.includes("Nice to meet you, Ann.");
  console.log(`the second turn's model request carries the first turn: ${continued}`);
  console.log(`the upstream saw the host token only: ${calls.every((c) => c.headers.authorization === `Bearer example-host-token-${channel}`)}`);
  console.log(`Pi session files: ${(await Array.fromAsync(new Bun.Glob("*.jsonl").scan(await rt.sessionsDir(channel)))).length}`);
  if (!continued) code = 1;
} catch (err) {
  console.error(`rich-host: ${(err as Error).message}`);
  code = 1;
} finally {
  await rt.stop(channel).catch(() => undefined);
  await rt.dispose().catch(() => undefined);
  disposeUtilityEngine();
  upstream.stop();
  rmSync(partyDir, { recursive: true, force: true });
}
process.exit(code);
