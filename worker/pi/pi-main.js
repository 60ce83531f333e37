// pi-main.js: the rich-mode worker's entry, `bun /app/worker/pi-main.js`
// (spec/rich-mode.md 17.2). Startup, in order:
//   1. create HOME (and the ~/.pi/agent folder the bridge logs into);
//   2. start the loopback forwarder;
//   3. GET /mcp-tools (not 200: "the broker answered N for mcp-tools");
//   4. GET /worker/config (404 from an older broker means {});
//   5. build the Pi session (lib/session.js);
//   6. log "sandbox worker ready" {profile, tools};
//   7. loop over the worker transport (lib/transport.js).
// A startup failure logs "sandbox worker failed" and exits 1 (Docker restarts
// the container). Paths: SANDBOX_WORKSPACE (default /workspace) and
// SANDBOX_BROKER_SOCKET (default /run/sandbox/broker.sock) exist so the same
// program runs outside a container in specs; the image never sets them.
import { mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import * as broker from "./lib/broker.js";
import * as forwarder from "./lib/forwarder.js";
import { loadContent } from "./lib/content.js";
import { buildSession } from "./lib/session.js";
import { loop } from "./lib/transport.js";
import { log, errorText } from "./lib/log.js";
import { SMALL_ANSWER_MAX, STARTUP_CALL_TIMEOUT_MS } from "./lib/limits.js";

const TOOL_NAME = /^[a-zA-Z0-9_-]{1,128}$/;
const SERVER_NAME = /^[a-zA-Z0-9_-]{1,100}$/;

// parseServers(value): the discovery answer {servers:[{name, tools:[...]}]}.
export function parseServers(value) {
  if (!value || !Array.isArray(value.servers)) throw new Error("the broker's mcp-tools answer is malformed");
  return value.servers.map((s) => {
    if (!s || !SERVER_NAME.test(s.name ?? "") || !Array.isArray(s.tools) || !s.tools.every((t) => typeof t === "string" && TOOL_NAME.test(t))) {
      throw new Error("the broker's mcp-tools answer is malformed");
    }
    return { name: s.name, tools: [...s.tools] };
  });
}

async function startup() {
  const home = process.env.HOME || "/tmp/home";
  mkdirSync(join(home, ".pi", "agent"), { recursive: true, mode: 0o700 });
  // The process cwd is the read-only worker directory: the bridge looks for
  // AGENTS.md and its project config from here, never from the workspace.
  process.chdir(dirname(import.meta.path));

  const address = forwarder.listenAddress();
  forwarder.start(address);

  const tools = await broker.call("GET", "/mcp-tools", { timeoutMs: STARTUP_CALL_TIMEOUT_MS, max: SMALL_ANSWER_MAX });
  if (tools.status !== 200) throw new Error(`the broker answered ${tools.status} for mcp-tools`);
  const servers = parseServers(broker.json(tools.bytes));

  const cfg = await broker.call("GET", "/worker/config", { timeoutMs: STARTUP_CALL_TIMEOUT_MS, max: SMALL_ANSWER_MAX });
  let config = {};
  if (cfg.status === 200) config = broker.json(cfg.bytes) ?? {};
  else if (cfg.status !== 404) throw new Error(`the broker answered ${cfg.status} for config`);
  // Section 15: with {"compaction":{"engine":...}} the worker asks the
  // host's compactor first (lib/ext/host_compaction.js); with {} only Pi's
  // own summary runs.
  log("compaction ready", { hostCompactor: typeof config?.compaction?.engine === "string" });

  const profile = process.env.SANDBOX_PROFILE || "";
  const content = await loadContent(profile);
  const state = {
    workspace: process.env.SANDBOX_WORKSPACE || "/workspace",
    turn: undefined,
    skillsRead: new Set(),
    provider: content.model.provider,
    memoryTools: content.memoryTools,
  };
  state.turnView = {
    get turnId() { return state.turn?.turnId; },
    get author() { return state.turn ? { ...state.turn.author } : undefined; },
    get outbox() { return state.outbox; },
  };
  const session = await buildSession(state, content, servers, address.port, config);
  log("sandbox worker ready", { profile, tools: [...state.activeTools] });
  return { state, session };
}

if (import.meta.main) {
  let started;
  try {
    started = await startup();
  } catch (err) {
    log("sandbox worker failed", { error: errorText(err) });
    process.exit(1);
  }
  await loop(started.state, started.session);
}
