// content.js: loads the operator's content module (spec/rich-mode.md 17.3),
// SANDBOX_CONTENT (default /app/worker/content.ts; bun loads TypeScript or
// JavaScript), and checks the shape of workerContent(profile):
// {model:{provider,id}, prompt?, skillsDir?, brokerTools?, toolNames?, memoryTools?, extensions?(turn)}.
const TOOL_NAME = /^[a-zA-Z0-9_-]{1,128}$/;

function bad(what) { return new Error(`content module: ${what}`); }

export async function loadContent(profile, path = process.env.SANDBOX_CONTENT || "/app/worker/content.ts") {
  const mod = await import(path);
  if (typeof mod.workerContent !== "function") throw bad("workerContent(profile) is not exported");
  const c = await mod.workerContent(profile);
  if (!c || typeof c !== "object") throw bad("workerContent returned no object");
  const m = c.model;
  if (!m || typeof m.provider !== "string" || typeof m.id !== "string") throw bad("model {provider, id} is required");
  if (c.prompt !== undefined && typeof c.prompt !== "string") throw bad("prompt must be a string");
  if (c.skillsDir !== undefined && typeof c.skillsDir !== "string") throw bad("skillsDir must be a path");
  const brokerTools = c.brokerTools ?? [];
  if (!Array.isArray(brokerTools)) throw bad("brokerTools must be an array");
  for (const t of brokerTools) {
    if (!t || !TOOL_NAME.test(t.name ?? "")) throw bad("a broker tool needs a valid name");
  }
  const toolNames = c.toolNames ?? [];
  if (!Array.isArray(toolNames) || !toolNames.every((n) => typeof n === "string")) throw bad("toolNames must be names");
  if (c.extensions !== undefined && typeof c.extensions !== "function") throw bad("extensions must be a function of the turn");
  return {
    model: { provider: m.provider, id: m.id },
    prompt: c.prompt,
    skillsDir: c.skillsDir,
    brokerTools,
    toolNames,
    memoryTools: Array.isArray(c.memoryTools) ? c.memoryTools : [],
    extensions: c.extensions,
  };
}
