// types.test.ts: the package's TypeScript type-checks under its own
// tsconfig.json (strict, noUncheckedIndexedAccess, bun init's flags) with the
// devDependency's tsc (`bun install` here; make deps runs it): src/, test/
// and scripts/. The declarations the tarball ships are made from src/ at
// prepack, and spec/install/install_test.sh checks them in a bun init project.
import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";

const PKG = join(import.meta.dir, "..");
const TSC = join(PKG, "node_modules", ".bin", "tsc");

test(
  "tsc --noEmit -p . reports no error",
  () => {
    if (!existsSync(TSC)) throw new Error(`no ${TSC}: run \`bun install\` in ${PKG} (make deps does)`);
    const r = Bun.spawnSync([TSC, "--noEmit", "-p", PKG], { cwd: PKG, stdout: "pipe", stderr: "pipe", timeout: 240_000 });
    expect(r.stdout.toString() + r.stderr.toString()).toBe("");
    expect(r.exitCode).toBe(0);
  },
  300_000,
);
