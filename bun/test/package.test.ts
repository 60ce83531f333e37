// package.test.ts: the package as a user gets it (spec/operations.md 6): the
// order libsbx.so is looked for in (SBX_LIB, the package's native/, the
// checkout's build/, the system library path) and the error that lists the
// places, each in a copy of the package outside the checkout run by a child
// bun (the package root is where its src/ is); and sandbox()'s check at
// start that the daemon has the configured image. The packed tarball itself
// is spec/install/install_test.sh's (bun pm pack, bun add, a real turn).
import { afterEach, describe, expect, test } from "bun:test";
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { libraryCandidates, libraryPath, PACKAGE_ROOT, SYSTEM_LIBRARY } from "../src/ffi.ts";
import { sandbox } from "../src/index.ts";
import { baseOptions, fixture, makeRoots, type Roots } from "./helpers.ts";

const CHECKOUT = join(PACKAGE_ROOT, "..");
const BUILT = join(CHECKOUT, "build", "libsbx.so");

let dirs: string[] = [];
let roots: Roots | null = null;
afterEach(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  dirs = [];
  roots?.cleanup();
  roots = null;
});

/** A copy of this package (src/ and package.json) outside the checkout. */
function copyPackage(): string {
  const dir = mkdtempSync(join(tmpdir(), "sbx-pkg-"));
  dirs.push(dir);
  cpSync(join(PACKAGE_ROOT, "src"), join(dir, "src"), { recursive: true });
  copyFileSync(join(PACKAGE_ROOT, "package.json"), join(dir, "package.json"));
  return dir;
}

/** Runs code as a module inside dir (imports "./src/..."), env without SBX_LIB unless given. */
function inPackage(dir: string, code: string, env: Record<string, string> = {}): { code: number; out: string } {
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (k !== "SBX_LIB" && v !== undefined) clean[k] = v;
  const r = Bun.spawnSync(["bun", "-e", code], { cwd: dir, env: { ...clean, ...env }, stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode ?? -1, out: `${r.stdout.toString()}${r.stderr.toString()}`.trim() };
}

const systemHasLibrary = (): boolean => {
  const r = Bun.spawnSync(["ldconfig", "-p"], { stdout: "pipe" });
  return r.stdout.toString().includes(`${SYSTEM_LIBRARY} `);
};

describe("where libsbx.so is looked for", () => {
  test("in the checkout: SBX_LIB, native/, the checkout's build/, then the system library path", () => {
    const saved = process.env.SBX_LIB;
    process.env.SBX_LIB = "/from/env/libsbx.so";
    try {
      expect(libraryCandidates()).toEqual([
        { where: "SBX_LIB", path: "/from/env/libsbx.so" },
        { where: "the package's native/", path: join(PACKAGE_ROOT, "native", "libsbx.so") },
        { where: "the engine checkout's build/", path: BUILT },
        { where: "the system library path", path: SYSTEM_LIBRARY },
      ]);
      expect(libraryPath()).toBe("/from/env/libsbx.so");
      delete process.env.SBX_LIB;
      const native = join(PACKAGE_ROOT, "native", "libsbx.so");
      expect(libraryPath()).toBe(existsSync(native) ? native : BUILT);
    } finally {
      if (saved === undefined) delete process.env.SBX_LIB;
      else process.env.SBX_LIB = saved;
    }
  });

  test("a package's native/libsbx.so comes before the system, and the engine finds the package's lua/ beside it", () => {
    const dir = copyPackage();
    mkdirSync(join(dir, "native"));
    copyFileSync(BUILT, join(dir, "native", "libsbx.so"));
    cpSync(join(CHECKOUT, "lua"), join(dir, "lua"), { recursive: true });
    const r = inPackage(
      dir,
      `import { libraryPath, isPublicAddress, disposeUtilityEngine } from "./src/index.ts";
       console.log(libraryPath(), await isPublicAddress("93.184.216.34"));
       await disposeUtilityEngine();`,
    );
    expect(r.out).toBe(`${join(dir, "native", "libsbx.so")} true`);
    expect(r.code).toBe(0);
  });

  test("a native/libsbx.so without a Lua tree beside it is a construction error naming SBX_LUA_DIR", () => {
    const dir = copyPackage();
    mkdirSync(join(dir, "native"));
    copyFileSync(BUILT, join(dir, "native", "libsbx.so"));
    const r = inPackage(
      dir,
      `import { isPublicAddress } from "./src/index.ts";
       try { await isPublicAddress("93.184.216.34"); console.log("loaded"); }
       catch (e) { console.log(e.message); }`,
    );
    expect(r.out).toStartWith(`no Lua tree next to ${join(dir, "native")} (looked in ../lua, ../share/lua/5.4 and lua/ there)`);
    expect(r.out).toContain("set SBX_LUA_DIR or options luaDir");
  });

  test.skipIf(systemHasLibrary())("nothing found: the error lists SBX_LIB, the package's native/ and the system library path", () => {
    const dir = copyPackage();
    const r = inPackage(
      dir,
      `import { sandbox } from "./src/index.ts";
       try { await sandbox({ model: "m" }); console.log("loaded"); } catch (e) { console.log(e.message); }`,
    );
    expect(r.out).toStartWith(
      `libsbx.so not found; looked in SBX_LIB (not set), ${join(dir, "native", "libsbx.so")} (the package's native/: missing), ` +
        `the system library path (cannot load ${SYSTEM_LIBRARY}: `,
    );
    expect(r.out).toEndWith(
      `; run \`bun run build\` in ${dir} (copies an installed or built libsbx.so into native/), ` +
        "install the engine (`make install` in its checkout), or set SBX_LIB",
    );
  });

  test("SBX_LIB naming a missing file is an error, not a silent fallback", () => {
    const dir = copyPackage();
    const r = inPackage(
      dir,
      `import { sandbox } from "./src/index.ts";
       try { await sandbox({ model: "m" }); console.log("loaded"); } catch (e) { console.log(e.message); }`,
      { SBX_LIB: "/nonexistent/libsbx.so" },
    );
    expect(r.out).toBe(
      "libsbx.so not found at /nonexistent/libsbx.so (SBX_LIB); fix SBX_LIB, or unset it to use the package's native/ or the system library",
    );
  });
});

// The daemon is asked through the app's driver; a fake driver is not asked.
const dockerAnswers = (() => {
  try {
    return Bun.spawnSync(["docker", "info", "--format", "{{.ServerVersion}}"], { stdout: "pipe", stderr: "pipe" }).exitCode === 0;
  } catch {
    return false;
  }
})();
const REQUIRED = process.env.SANDBOX_DOCKER_TEST === "1";

describe("sandbox() checks the image at start", () => {
  test.skipIf(!dockerAnswers && !REQUIRED)("a missing image refuses to start, naming the image and this checkout's build command", async () => {
    roots = makeRoots();
    const image = "roundtable-install-test-absent:1";
    let err: Error | null = null;
    try {
      await sandbox({ ...baseOptions(roots), image, apiKey: () => "k" });
    } catch (e) {
      err = e as Error;
    }
    expect(err?.message).toBe(
      `the sandbox image ${image} is missing (every turn would fail); fix: build it with make -C ${CHECKOUT} image SBX_IMAGE=${image}`,
    );
    // the refused engine released its installation lock: the same roots start again
    const plugin = await sandbox({ ...baseOptions(roots), config: fixture("fake-driver.conf.lua"), apiKey: () => "k" });
    await plugin.dispose();
  });

  test("a driver that cannot inspect images (a fake one) is not asked", async () => {
    roots = makeRoots();
    const plugin = await sandbox({
      ...baseOptions(roots),
      image: "roundtable-install-test-absent:1",
      config: fixture("fake-driver.conf.lua"),
      apiKey: () => "k",
    });
    expect(plugin.disposed).toBe(false);
    await plugin.dispose();
  });
});
