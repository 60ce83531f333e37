// session.js: builds the worker's one Pi session (spec/rich-mode.md 17.4).
//
// - SessionManager.continueRecent(<workspace>, <workspace>/sessions) continues
//   the channel's JSONL files; Pi's agent directory is PI_CODING_AGENT_DIR on
//   the tmpfs, holding only a bridge config that turns AskClaude off.
// - Disabled: automatic extensions, skill discovery, prompt templates, themes,
//   context files and the built-in tools.
// - Extensions, in order: the claude-bridge provider (the model transport,
//   first; its session_before_compact takeover is held back and runs only as
//   host-compaction's fallback, on the redacted preparation),
//   read-attachment, broker-tools, skills (with skillsDir), speaker-memory
//   (with private-exchanges, 14.2), the content's extensions,
//   host-compaction (15, ext/host_compaction.js), the MCP adapter (only with
//   servers) and active-tools last.
// - The compaction tier (15.1) is applied once the model is set.
// - The active tools wait up to 45 s for MCP tools; any still absent fails
//   startup with "tools are not registered: ...". Thinking defaults to low.
import { mkdirSync, writeFileSync, readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { createRequire } from "node:module";
import { createAgentSession, DefaultResourceLoader, SessionManager, SettingsManager } from "@earendil-works/pi-coding-agent";
import { readAttachmentExtension } from "./ext/read_attachment.js";
import { brokerToolsExtension } from "./ext/broker_tools.js";
import { loadSkills, skillsExtension, skillIndex } from "./ext/skills.js";
import { speakerMemoryExtension } from "./ext/speaker_memory.js";
import { privateExchangesExtension } from "./ext/private_exchanges.js";
import { activeToolsExtension } from "./ext/active_tools.js";
import { hostCompactionExtension, withoutTakeover } from "./ext/host_compaction.js";
import { mcpExtension, mcpToolNames } from "./ext/mcp.js";
import { MCP_WAIT_MS, MCP_POLL_MS } from "./limits.js";

const BUILTIN_TOOLS = ["read", "bash", "edit", "write", "grep", "find", "ls"];
const DEFAULT_PROMPT = "You are a helpful assistant in a group chat. Messages start with the speaker as [name (id)].";

// The bridge ships no package entry point; its manifest names its Pi
// extension (package.json "pi.extensions"), which is what Pi itself loads.
async function loadBridge() {
  const require = createRequire(import.meta.url);
  const manifestPath = require.resolve("pi-claude-bridge/package.json");
  const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
  const entry = manifest?.pi?.extensions?.[0];
  if (typeof entry !== "string") throw new Error("pi-claude-bridge declares no Pi extension");
  const mod = await import(join(dirname(manifestPath), entry));
  return mod.default;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// buildSession(state, content, servers, port, config) -> AgentSession
// config: the broker's /worker/config answer ({compaction:{engine}} or {}).
export async function buildSession(state, content, servers, port, config = {}) {
  const agentDir = process.env.PI_CODING_AGENT_DIR || "/tmp/pi-agent";
  mkdirSync(agentDir, { recursive: true, mode: 0o700 });
  writeFileSync(join(agentDir, "claude-bridge.json"), JSON.stringify({ askClaude: { enabled: false } }));

  const tree = content.skillsDir ? loadSkills(content.skillsDir) : undefined;
  state.promptParts = [content.prompt ?? DEFAULT_PROMPT, tree ? skillIndex(tree.skills) : ""].filter(Boolean);

  const settingsManager = SettingsManager.inMemory({});
  const takeover = {};
  const factories = [
    { name: "claude-bridge", factory: withoutTakeover(await loadBridge(), takeover) },
    { name: "read-attachment", factory: readAttachmentExtension(state) },
    { name: "broker-tools", factory: brokerToolsExtension(state, content.brokerTools) },
  ];
  if (tree) factories.push({ name: "skills", factory: skillsExtension(state, tree) });
  factories.push({ name: "speaker-memory", factory: speakerMemoryExtension(state) });
  factories.push({ name: "private-exchanges", factory: privateExchangesExtension(state, content.memoryTools) });
  const own = content.extensions ? await content.extensions(state.turnView) : [];
  for (const [i, f] of (own ?? []).entries()) factories.push(typeof f === "function" ? { name: `content-${i}`, factory: f } : f);
  const engine = typeof config?.compaction?.engine === "string" ? config.compaction.engine : undefined;
  factories.push({ name: "host-compaction", factory: hostCompactionExtension(state, { engine, memoryTools: content.memoryTools, settings: settingsManager, takeover }) });
  if (servers.length > 0) factories.push({ name: "mcp-adapter", factory: mcpExtension(servers, port) });
  factories.push({ name: "active-tools", factory: activeToolsExtension(state) });

  const cwd = state.workspace;
  const loader = new DefaultResourceLoader({
    cwd, agentDir, settingsManager,
    noExtensions: true, noSkills: true, noPromptTemplates: true, noThemes: true, noContextFiles: true,
    systemPrompt: content.prompt ?? DEFAULT_PROMPT,
    extensionFactories: factories,
  });
  await loader.reload();
  const errors = loader.getExtensions().errors ?? [];
  if (errors.length > 0) throw new Error(`extension failed to load: ${errors.map((e) => e.error).join("; ")}`);

  mkdirSync(join(cwd, "sessions"), { recursive: true, mode: 0o700 });
  const { session } = await createAgentSession({
    cwd, agentDir, settingsManager, resourceLoader: loader,
    sessionManager: SessionManager.continueRecent(cwd, join(cwd, "sessions")),
    noTools: "builtin", excludeTools: BUILTIN_TOOLS, thinkingLevel: "low",
  });
  await session.bindExtensions({});

  const model = session.modelRuntime.getModel(content.model.provider, content.model.id);
  if (!model) throw new Error(`model ${content.model.provider}/${content.model.id} is not available`);
  await session.setModel(model);
  session.setThinkingLevel("low");
  state.applyTier(session.model, session.sessionManager.getBranch());

  state.activeTools = [
    "read_attachment",
    ...(tree ? ["read_skill"] : []),
    ...content.brokerTools.map((t) => t.name),
    ...content.toolNames,
    ...mcpToolNames(servers),
  ];
  const deadline = Date.now() + MCP_WAIT_MS;
  let missing = [];
  for (;;) {
    const have = new Set(state.allToolNames());
    missing = state.activeTools.filter((n) => !have.has(n));
    if (missing.length === 0 || servers.length === 0 || Date.now() >= deadline) break;
    await sleep(MCP_POLL_MS);
  }
  if (missing.length > 0) throw new Error(`tools are not registered: ${missing.join(", ")}`);
  state.pinTools();
  return session;
}

// writeBridgePrompt(state): pi-claude-bridge 0.6.3 sends Claude Code its own
// preset system prompt plus an AGENTS.md it finds from the process cwd or
// ~/.pi/agent, never Pi's system prompt. The worker therefore mirrors the
// persona, the skill index and this turn's memory block into
// $HOME/.pi/agent/AGENTS.md (tmpfs) before each prompt; its cwd is the
// read-only worker directory, so no workspace AGENTS.md is ever picked up.
export function writeBridgePrompt(state) {
  const home = process.env.HOME || "/tmp/home";
  const dir = join(home, ".pi", "agent");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const parts = [...state.promptParts];
  if (state.turn?.memory) parts.push(state.turn.memory);
  writeFileSync(join(dir, "AGENTS.md"), parts.join("\n\n"), { mode: 0o600 });
}
