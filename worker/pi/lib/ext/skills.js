// skills.js: the content's skill tree (spec/rich-mode.md 17.4). Every
// <skillsDir>/<skill>/SKILL.md opens with YAML frontmatter whose name equals
// its directory and which has a description; the index of names and
// descriptions joins the system prompt. read_skill {skill, path?} reads a file
// of one skill, confined by real path to that skill's directory (256 KiB per
// file, 40,000 characters returned). Tools a skill's frontmatter lists under
// `tools` stay blocked until that skill has been read.
import { readdirSync, realpathSync, statSync, lstatSync } from "node:fs";
import { join, sep } from "node:path";
import { Type } from "typebox";
import { readRegular } from "../files.js";
import { SKILL_FILE_MAX, SKILL_OUTPUT_MAX } from "../limits.js";

function frontmatter(text) {
  const m = /^---\r?\n([\s\S]*?)\r?\n---(\r?\n|$)/.exec(text);
  if (!m) return undefined;
  try {
    const v = Bun.YAML.parse(m[1]);
    return v && typeof v === "object" && !Array.isArray(v) ? v : undefined;
  } catch {
    return undefined;
  }
}

function inside(root, path) { return path === root || path.startsWith(root + sep); }

// loadSkills(dir) -> {root, skills: [{name, description, tools}]}; throws the
// startup error of 17.4 for a skill without a matching name and a description.
export function loadSkills(dir) {
  const root = realpathSync(dir);
  const skills = [];
  for (const entry of readdirSync(root, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const name = entry.name;
    let isDir = false;
    try { isDir = statSync(join(root, name)).isDirectory(); } catch { isDir = false; }
    if (!isDir) continue;
    let meta;
    try {
      meta = frontmatter(new TextDecoder().decode(readRegular(join(root, name, "SKILL.md"), SKILL_FILE_MAX)));
    } catch {
      meta = undefined;
    }
    if (!meta || meta.name !== name || typeof meta.description !== "string" || !meta.description.trim()) {
      throw new Error(`skill ${name} needs a matching name and a description`);
    }
    const tools = Array.isArray(meta.tools) ? meta.tools.filter((t) => typeof t === "string") : [];
    skills.push({ name, description: meta.description.trim(), tools });
  }
  return { root, skills };
}

export function skillIndex(skills) {
  if (skills.length === 0) return "";
  const lines = skills.map((s) => `- ${s.name}: ${s.description}`);
  return `Skills (read one with read_skill before doing what it covers):\n${lines.join("\n")}`;
}

// readSkill(tree, skill, path) -> text; throws the exact errors of 17.4.
export function readSkill(tree, skill, path = "SKILL.md") {
  if (typeof skill !== "string" || !tree.skills.some((s) => s.name === skill)) throw new Error(`there is no skill named ${skill}`);
  let dir;
  try {
    dir = realpathSync(join(tree.root, skill));
  } catch {
    throw new Error(`there is no skill named ${skill}`);
  }
  if (!inside(tree.root, dir) || dir === tree.root) throw new Error("Skill directory escapes the content tree");
  const notFile = () => new Error(`${path} is not a file of ${skill}`);
  if (typeof path !== "string" || path === "" || path.includes("\0")) throw notFile();
  let file;
  try {
    file = realpathSync(join(dir, path));
  } catch {
    throw notFile();
  }
  if (!inside(dir, file) || file === dir) throw notFile();
  let st;
  try { st = statSync(file); lstatSync(file); } catch { throw notFile(); }
  if (!st.isFile()) throw notFile();
  if (st.size > SKILL_FILE_MAX) throw new Error("Skill file too large");
  let bytes;
  try {
    bytes = readRegular(file, SKILL_FILE_MAX);
  } catch (err) {
    if (err.reason === "too-large") throw new Error("Skill file too large");
    throw notFile();
  }
  const text = new TextDecoder().decode(bytes);
  return text.length > SKILL_OUTPUT_MAX ? `${text.slice(0, SKILL_OUTPUT_MAX)}\n\n[truncated at ${SKILL_OUTPUT_MAX} characters]` : text;
}

export function skillsExtension(state, tree) {
  const gates = new Map(); // tool name -> skill that must be read first
  for (const s of tree.skills) for (const t of s.tools) if (!gates.has(t)) gates.set(t, s.name);
  return (pi) => {
    pi.registerTool({
      name: "read_skill",
      label: "Read skill",
      description: "Read a skill's instructions (SKILL.md by default) or another file of that skill.",
      parameters: Type.Object({
        skill: Type.String({ description: "The skill's name" }),
        path: Type.Optional(Type.String({ description: "A file inside the skill; default SKILL.md" })),
      }),
      async execute(_id, params) {
        const text = readSkill(tree, params.skill, params.path ?? "SKILL.md");
        state.skillsRead.add(params.skill);
        return { content: [{ type: "text", text }], details: {} };
      },
    });
    pi.on("tool_call", (event) => {
      const skill = gates.get(event.toolName);
      if (skill && !state.skillsRead.has(skill)) {
        return { block: true, reason: `Read the ${skill} skill with read_skill first; it sets how ${event.toolName} is used here.` };
      }
      return undefined;
    });
    pi.on("before_agent_start", (event) => {
      const index = skillIndex(tree.skills);
      return index ? { systemPrompt: `${event.systemPrompt}\n\n${index}` } : undefined;
    });
  };
}
