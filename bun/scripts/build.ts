// scripts/build.ts: fills the parts of the package that are not TypeScript
// (spec/operations.md 6): native/libsbx.so (the engine library the bridge
// loads), lua/ (the engine's host Lua tree, found by the library beside
// native/) and worker/ (the worker image's build context: Dockerfile,
// seccomp.json, sbx-worker, lua/, image_lib.sh, build-image, which builds
// pi-roundtable-sandbox:local).
//
//   bun run build        in the engine's checkout (this package is its bun/):
//                        `make` there (the library, the worker, and
//                        src/options.generated.ts, the option list and types
//                        generated from lua/sandbox/rich/_option_table.lua),
//                        then copies build/libsbx.so, lua/ and
//                        the worker context (what `bun pm pack` packs: the
//                        prepack script). Elsewhere (an installed package):
//                        copies an installed libsbx.so.0 into native/ when
//                        native/ has none.
//                        Then (prepack) dist/*.d.ts, the declaration files
//                        the package's "types" name (tsc -p tsconfig.build.json,
//                        the devDependency `bun install` put in node_modules/:
//                        a consumer's checker reads them, under its
//                        skipLibCheck, while Bun runs src/*.ts), and LICENSE
//                        copied from the checkout's root.
//   --install            the install script (postinstall): as `build` outside
//                        a checkout, and it never fails the install (the
//                        bridge also falls back to the system library path)
//   --clean              the postpack script: in a checkout, removes what
//                        build copied or made (the checkout's bridge loads
//                        build/ directly)
// An installed library is looked for at $SBX_LIB, pkg-config's libdir of
// sbx, the loader's cache (ldconfig -p), then /usr/local/lib and /usr/lib.
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const PKG = dirname(dirname(fileURLToPath(import.meta.url)));
const CHECKOUT = dirname(PKG);
const inCheckout = existsSync(join(CHECKOUT, "core", "sbx_ffi.h")) && existsSync(join(CHECKOUT, "Makefile"));
const mode = process.argv[2] ?? "--build";

function say(msg: string): void {
  console.error(`pi-roundtable-sandbox: ${msg}`);
}

/** Every file under dir whose name ends with ext, as paths relative to dir. */
function filesUnder(dir: string, ext: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile() && e.name.endsWith(ext)) out.push(relative(dir, p));
    }
  };
  walk(dir);
  return out.sort();
}

function copy(from: string, to: string, mode = 0o644): void {
  mkdirSync(dirname(to), { recursive: true });
  copyFileSync(from, to);
  chmodSync(to, mode);
}

function copyTree(from: string, to: string): number {
  rmSync(to, { recursive: true, force: true });
  const files = filesUnder(from, ".lua");
  for (const f of files) copy(join(from, f), join(to, f));
  return files.length;
}

function run(argv: string[]): { ok: boolean; out: string } {
  try {
    const r = Bun.spawnSync(argv, { stdout: "pipe", stderr: "pipe" });
    return { ok: r.exitCode === 0, out: r.stdout.toString().trim() };
  } catch {
    return { ok: false, out: "" };
  }
}

/** An installed libsbx.so.0 (see the header), or null. */
function installedLibrary(): string | null {
  const candidates: string[] = [];
  if (process.env.SBX_LIB) candidates.push(process.env.SBX_LIB);
  const pc = run(["pkg-config", "--variable=libdir", "sbx"]);
  if (pc.ok && pc.out) candidates.push(join(pc.out, "libsbx.so.0"));
  const cache = run(["ldconfig", "-p"]);
  if (cache.ok) {
    const m = cache.out.match(/^\s*libsbx\.so\.0 \(.*\) => (\S+)$/m);
    if (m?.[1]) candidates.push(m[1]);
  }
  candidates.push("/usr/local/lib/libsbx.so.0", "/usr/lib/libsbx.so.0");
  return candidates.find((p) => existsSync(p) && statSync(p).isFile()) ?? null;
}

function buildFromCheckout(): void {
  const make = Bun.spawnSync(["make", "-C", CHECKOUT, "--no-print-directory", "build/libsbx.so", "build/worker/sbx-worker", "bun/src/options.generated.ts"], {
    stdout: "inherit",
    stderr: "inherit",
  });
  if (make.exitCode !== 0) throw new Error(`make in ${CHECKOUT} failed (exit ${make.exitCode})`);
  copy(join(CHECKOUT, "build", "libsbx.so"), join(PKG, "native", "libsbx.so"), 0o755);
  const lua = copyTree(join(CHECKOUT, "lua"), join(PKG, "lua"));
  const worker = join(PKG, "worker");
  const workerLua = copyTree(join(CHECKOUT, "worker", "lua"), join(worker, "lua"));
  copy(join(CHECKOUT, "worker", "Dockerfile"), join(worker, "Dockerfile"));
  copy(join(CHECKOUT, "worker", "seccomp.json"), join(worker, "seccomp.json"));
  // the rich and precheck images' profiles (rich/docker.lua, precheck/_docker.lua read them at startup)
  copy(join(CHECKOUT, "worker", "pi", "seccomp.json"), join(worker, "pi", "seccomp.json"));
  copy(join(CHECKOUT, "worker", "precheck", "seccomp.json"), join(worker, "precheck", "seccomp.json"));
  copy(join(CHECKOUT, "build", "worker", "sbx-worker"), join(worker, "sbx-worker"), 0o755);
  copy(join(CHECKOUT, "worker", "image.sh"), join(worker, "build-image"), 0o755);
  copy(join(CHECKOUT, "scripts", "image_lib.sh"), join(worker, "image_lib.sh"));
  say(`native/libsbx.so, lua/ (${lua} modules) and worker/ (${workerLua} worker modules) copied from ${CHECKOUT}`);
}

/** dist/*.d.ts from src/ (see the header) and LICENSE; throws naming the fix. */
function emitTypes(): void {
  const tsc = join(PKG, "node_modules", ".bin", "tsc");
  if (!existsSync(tsc)) throw new Error(`no TypeScript compiler at ${tsc}: run \`bun install\` in ${PKG} (make deps does)`);
  rmSync(join(PKG, "dist"), { recursive: true, force: true });
  const r = Bun.spawnSync([tsc, "-p", join(PKG, "tsconfig.build.json")], { cwd: PKG, stdout: "inherit", stderr: "inherit", timeout: 300_000 });
  if (r.exitCode !== 0) throw new Error(`tsc -p tsconfig.build.json failed (exit ${r.exitCode ?? r.signalCode}): fix the type errors above`);
  copy(join(CHECKOUT, "LICENSE"), join(PKG, "LICENSE"));
  say(`dist/ (${filesUnder(join(PKG, "dist"), ".d.ts").length} declaration files) and LICENSE made`);
}

function fillNative(strict: boolean): void {
  const target = join(PKG, "native", "libsbx.so");
  if (existsSync(target)) return;
  const lib = installedLibrary();
  if (lib === null) {
    const msg =
      "no libsbx.so for native/: none installed (SBX_LIB, pkg-config sbx, ldconfig -p, /usr/local/lib, /usr/lib); " +
      "`make install` the engine, then `bun run build` here (or set SBX_LIB)";
    if (strict) throw new Error(msg);
    say(`${msg}; the bridge will try the system library path at run time`);
    return;
  }
  copy(lib, target, 0o755);
  say(`native/libsbx.so copied from ${lib}`);
}

try {
  if (mode === "--clean") {
    if (inCheckout) for (const d of ["native", "lua", "worker", "dist", "LICENSE"]) rmSync(join(PKG, d), { recursive: true, force: true });
  } else if (mode === "--install") {
    if (!inCheckout) fillNative(false);
  } else if (mode === "--build") {
    if (inCheckout) {
      buildFromCheckout();
      emitTypes();
    } else fillNative(true);
  } else {
    throw new Error(`unknown mode ${mode} (--build, --install, --clean)`);
  }
} catch (err) {
  say((err as Error).message);
  process.exit(mode === "--install" ? 0 : 1);
}
