// examples/bun/precheck.ts: a trusted plugin registering the precheck script
// runner with the chat bot's precheck service, then the service running two
// agent-written prechecks before their scheduled turns: one wakes the agent,
// one skips the turn. Each run is a real sealed container of
// pi-roundtable-sandbox:precheck (`make image`) whose only way out is its
// per-run broker, which forwards granted MCP calls to a real MCP server
// (the official SDK's, spec/fixtures/mcp_server.mjs, on 127.0.0.1).
//
//   runuser -u sbx -- bun examples/bun/precheck.ts        (after `make deps image`)
//   MCP_URL=http://127.0.0.1:PORT/mcp bun examples/bun/precheck.ts   your own server
//
// Run it as a non-root user in the docker group (the engine refuses root).
// Everything it creates (run directories, containers, the server) is removed.
import { chmodSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { type PrecheckContext, type PrecheckScriptRunner, precheckScriptRunner } from "pi-roundtable-sandbox";

if (process.getuid?.() === 0) {
  console.error("precheck: the sandbox refuses root; run it as the service account, e.g. runuser -u sbx -- bun examples/bun/precheck.ts");
  process.exit(1);
}
const ROOT = join(import.meta.dir, "..", "..");

// ---- a loopback MCP server (the SDK fixture) unless MCP_URL names one -------
let mcpUrl = process.env.MCP_URL ?? "";
let server: ReturnType<typeof Bun.spawn> | null = null;
if (mcpUrl === "") {
  server = Bun.spawn(["node", "mcp_server.mjs", "--parent-pid", String(process.pid)], {
    cwd: join(ROOT, "spec", "fixtures"),
    stdout: "pipe",
    stderr: "inherit",
  });
  const reader = server.stdout.getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  const { port } = JSON.parse(new TextDecoder().decode(value).split("\n")[0]) as { port: number };
  mcpUrl = `http://127.0.0.1:${port}/mcp`;
}

// ---- the core's precheck service, as far as this example needs it -----------
const PRECHECKS = {
  runner: null as PrecheckScriptRunner | null,
  useScriptRunner(runner: PrecheckScriptRunner) {
    this.runner = runner;
  },
};

// ---- the trusted plugin ----------------------------------------------------------
const base = mkdtempSync("/tmp/pcx-");
chmodSync(base, 0o700);
const runRoot = join(base, "run");
const runner = precheckScriptRunner({
  config: join(ROOT, "examples", "precheck.conf.lua"),
  options: { runRoot, healthUrl: mcpUrl, allowHttpMcp: true, healthToken: "example-health-token" },
});
PRECHECKS.useScriptRunner(runner);
console.log(`precheck: runner registered (timeoutMs ${runner.timeoutMs}); hold rules know the HRV tool as ${runner.toolName("health", "garmin-get-hrv")}`);

const scope = { channel: "discord:42:health", target: "dm:ada", tier: "member" };
console.log("precheck: what the model reads before writing a script:");
for (const line of (await PRECHECKS.runner!.describe(scope)).split("\n")) console.log(`   ${line}`);

// Two scripts as an agent would write them: wake the agent when HRV is low.
const script = (threshold: number) => `
export default async ({ mcp, today, schedule }) => {
  await mcp.call("health", "garmin-login");
  const { hrv } = await mcp.json("health", "garmin-get-hrv", { date: today });
  if (hrv < ${threshold}) return { wake: true, context: \`#\${schedule.id} \${today}: HRV \${hrv} is under ${threshold}\` };
  return { wake: false, note: \`HRV \${hrv} is fine today\` };
};`;

const context = (id: number): PrecheckContext => ({
  schedule: { id, title: "Morning HRV check", channel: scope.channel, target: scope.target, createdTier: "owner" },
  firedAt: new Date().toISOString(),
  tier: "member",
  timeZone: "Europe/Paris",
  today: new Date().toLocaleDateString("sv-SE", { timeZone: "Europe/Paris" }),
  tools: [
    { server: "health", tool: "garmin-login" },
    { server: "health", tool: "garmin-get-hrv" },
  ],
  signal: AbortSignal.timeout(60_000),
});

let failed = false;
try {
  for (const [id, threshold] of [
    [1, 30],
    [2, 20],
  ] as const) {
    const result = (await PRECHECKS.runner!.run(script(threshold), context(id))) as
      | { wake: true; context: string }
      | { wake: false; note?: string };
    if (result.wake) console.log(`precheck #${id}: wake the agent with "${result.context}"`);
    else console.log(`precheck #${id}: skip the turn (note: ${result.note})`);
  }
  console.log(`precheck: run root left empty: ${readdirSync(runRoot).length === 0}`);
} catch (err) {
  failed = true;
  console.error(`precheck: ${err instanceof Error ? err.message : String(err)}`);
} finally {
  await runner.dispose();
  server?.kill();
  rmSync(base, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
