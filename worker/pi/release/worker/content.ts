// content.ts: the default application content of the rich image (spec/rich-mode.md
// 17.3): trusted, operator-owned, baked into /app/worker/content.ts. An
// operator replaces this release tree (make image-pi PI_RELEASE=<dir>) with
// its own persona, skills, host tool descriptions and extensions.
import { readFileSync } from "node:fs";
import { join } from "node:path";

const here = import.meta.dir;

export function workerContent(profile: string) {
  const persona = readFileSync(join(here, "..", "persona", "default.md"), "utf8").trim();
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    prompt: persona,
    skillsDir: join(here, "skills"),
    brokerTools: [],
    toolNames: [],
    memoryTools: [],
  };
}
