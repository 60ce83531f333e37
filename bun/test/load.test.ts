// load.test.ts: finding and loading libsbx.so, and construction errors
// surfaced as thrown Errors carrying the engine's (Lua's) exact message.
import { afterEach, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ABI_VERSION, libraryPath, loadLibrary } from "../src/ffi.ts";
import { sandbox } from "../src/index.ts";
import { baseOptions, fixture, makeRoots, type Roots } from "./helpers.ts";

let roots: Roots | null = null;
afterEach(() => {
  roots?.cleanup();
  roots = null;
});

describe("loading libsbx.so", () => {
  // The default lookup order (SBX_LIB, native/, the checkout's build/, the
  // system library path) and its error are package.test.ts's.
  test("in the checkout (no native/ copy) the default is ../build/libsbx.so relative to the package", () => {
    const saved = process.env.SBX_LIB;
    delete process.env.SBX_LIB;
    try {
      const native = join(import.meta.dir, "..", "native", "libsbx.so");
      const p = libraryPath();
      expect(p).toBe(existsSync(native) ? native : join(import.meta.dir, "..", "..", "build", "libsbx.so"));
      expect(existsSync(p)).toBe(true);
    } finally {
      if (saved !== undefined) process.env.SBX_LIB = saved;
    }
  });

  test("an explicit option wins over SBX_LIB, which wins over the default", () => {
    const saved = process.env.SBX_LIB;
    process.env.SBX_LIB = "/from/env/libsbx.so";
    try {
      expect(libraryPath()).toBe("/from/env/libsbx.so");
      expect(libraryPath("/explicit/libsbx.so")).toBe("/explicit/libsbx.so");
    } finally {
      if (saved === undefined) delete process.env.SBX_LIB;
      else process.env.SBX_LIB = saved;
    }
  });

  test("loads the library and checks its ABI version", () => {
    const lib = loadLibrary();
    expect(lib.sbx_ffi_abi_version()).toBe(ABI_VERSION);
  });

  const shim = join(import.meta.dir, "..", "..", "build", "libsbx_ffi.so");
  test.skipIf(!existsSync(shim))("the loader shim build/libsbx_ffi.so (same ABI) works through the library option", async () => {
    roots = makeRoots();
    const plugin = await sandbox({ ...baseOptions(roots), library: shim, apiKey: () => "k", initialChannels: ["discord:1"] });
    expect(plugin.owns("discord:1")).toBe(true);
    expect(await plugin.services.SANDBOX.channels.list()).toEqual(["discord:1"]);
    await plugin.dispose();
  });

  test("a missing library is an Error naming the path and the fix", async () => {
    await expect(sandbox({ library: "/nonexistent/libsbx.so", model: "m" })).rejects.toThrow(
      "libsbx.so not found at /nonexistent/libsbx.so; run `make` in the engine checkout or set SBX_LIB",
    );
  });
});

describe("construction errors carry the Lua message", () => {
  test("an option sandbox{} refuses (turnTimeoutMs)", async () => {
    roots = makeRoots();
    await expect(sandbox({ ...baseOptions(roots), turnTimeoutMs: 5 })).rejects.toThrow(
      /^turnTimeoutMs must be 1000 to 600000$/,
    );
  });

  test("a relative runRoot", async () => {
    roots = makeRoots();
    await expect(sandbox({ ...baseOptions(roots), runRoot: "relative/run", apiKey: () => "k" })).rejects.toThrow(
      /^sandbox roots must be absolute dedicated directories$/,
    );
  });

  test("an https-only modelUrl without allowHttp", async () => {
    roots = makeRoots();
    await expect(
      sandbox({ ...baseOptions(roots), allowHttp: false, modelUrl: "http://127.0.0.1:9/v1", apiKey: () => "k" }),
    ).rejects.toThrow(/^broker endpoints must be credential-free HTTPS URLs$/);
  });

  test("a missing model", async () => {
    roots = makeRoots();
    const { model: _m, ...rest } = baseOptions(roots);
    await expect(sandbox({ ...rest, apiKey: () => "k" })).rejects.toThrow(/^model is required$/);
  });

  test("no apiKey anywhere and no host login", async () => {
    roots = makeRoots();
    await expect(sandbox(baseOptions(roots))).rejects.toThrow(/^apiKey is required when no host login is available$/);
  });

  test("an unknown option in the Lua config", async () => {
    await expect(sandbox({ config: fixture("unknown-option.conf.lua") })).rejects.toThrow(
      /^unknown sandbox option: bogus$/,
    );
  });

  test("an unknown time zone (the host setting the worker gets)", async () => {
    roots = makeRoots();
    await expect(sandbox({ ...baseOptions(roots), timeZone: "not-a-zone", apiKey: () => "k" })).rejects.toThrow(
      /^invalid time zone$/,
    );
  });

  test("resource limits sandbox{} refuses", async () => {
    roots = makeRoots();
    await expect(sandbox({ ...baseOptions(roots), limits: { cpus: 0 }, apiKey: () => "k" })).rejects.toThrow(
      /^invalid resource limits$/,
    );
    await expect(sandbox({ ...baseOptions(roots), limits: { pids: 8.5 }, apiKey: () => "k" })).rejects.toThrow(
      /^invalid resource limits$/,
    );
  });

  test("warm settings sandbox{} refuses (spec/warm-turns.md 2)", async () => {
    roots = makeRoots();
    for (const warm of [{ channels: 1025 }, { channels: -1 }, { idleMs: 999 }, { idleMs: 1.5e3 + 0.5 }, { bogus: 1 }]) {
      await expect(
        sandbox({ ...baseOptions(roots), warm: warm as never, apiKey: () => "k" }),
      ).rejects.toThrow(/^invalid warm settings$/);
    }
    const plugin = await sandbox({ ...baseOptions(roots), warm: { channels: 0, idleMs: 1000 }, apiKey: () => "k" });
    expect((await plugin.status()).started).toBe(true);
    await plugin.dispose();
  });

  test("a container runtime sandbox{} refuses (warm-turns.md 2)", async () => {
    roots = makeRoots();
    for (const runtime of ["gVisor", "", "-runsc", "a".repeat(65)]) {
      await expect(sandbox({ ...baseOptions(roots), runtime, apiKey: () => "k" })).rejects.toThrow(
        /^invalid container runtime$/,
      );
    }
  });

  test("a valid container runtime starts an engine (it is asked of the daemon only per turn)", async () => {
    roots = makeRoots();
    const plugin = await sandbox({ ...baseOptions(roots), runtime: "runsc", apiKey: () => "k" });
    expect((await plugin.status()).started).toBe(true);
    await plugin.dispose();
  });

  test("the default time zone is this process's, and valid options start an engine", async () => {
    roots = makeRoots();
    const { timeZone: _tz, ...rest } = baseOptions(roots);
    const plugin = await sandbox({ ...rest, limits: { memoryMb: 256, cpus: 0.5, pids: 32 }, apiKey: () => "k" });
    expect((await plugin.status()).started).toBe(true);
    await plugin.dispose();
  });

  test("a config script that raises", async () => {
    await expect(sandbox({ config: fixture("raises.conf.lua") })).rejects.toThrow(/^HOME is required$/);
  });

  test("a config script that does not parse", async () => {
    await expect(sandbox({ config: fixture("bad-syntax.conf.lua") })).rejects.toThrow(/^cannot load config: .*bad-syntax\.conf\.lua/);
  });

  test("a config path that does not exist", async () => {
    await expect(sandbox({ config: "/nonexistent/sandbox.conf.lua" })).rejects.toThrow(/^cannot load config: /);
  });

  test("an unknown TypeScript option", async () => {
    await expect(sandbox({ model: "m", bogus: 1 } as never)).rejects.toThrow(/^unknown sandbox option: bogus$/);
  });

  test("apiKey that is not a function", async () => {
    await expect(sandbox({ model: "m", apiKey: "sk-literal" as never })).rejects.toThrow(/^apiKey must be a function$/);
  });

  test("a TypeScript host tool run function is refused with the fix", async () => {
    roots = makeRoots();
    await expect(
      sandbox({
        ...baseOptions(roots),
        apiKey: () => "k",
        tools: [{ name: "clock", description: "c", parameters: { type: "object" }, run: () => "now" }],
      }),
    ).rejects.toThrow(/^host tool clock: a TypeScript run function cannot cross the FFI bridge; define host tools in the Lua config/);
  });

  test("an invalid MCP allow-list reaches Lua's check", async () => {
    roots = makeRoots();
    await expect(
      sandbox({
        ...baseOptions(roots),
        apiKey: () => "k",
        mcp: [{ name: "Bad Name", url: "http://127.0.0.1:9/rpc", tools: [] }],
      }),
    ).rejects.toThrow(/^invalid or duplicate MCP server\/tool$/);
  });

  test("a failed construction leaves the roots reusable (the lock is released)", async () => {
    roots = makeRoots();
    await expect(sandbox({ ...baseOptions(roots), stateFile: join(roots.runRoot, "state.json"), apiKey: () => "k" })).rejects.toThrow(
      /^routing state must stay outside sandbox mounts$/,
    );
    const plugin = await sandbox({ ...baseOptions(roots), apiKey: () => "k" });
    await plugin.dispose();
  });
});
