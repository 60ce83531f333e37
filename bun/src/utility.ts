// utility.ts: the engine behind the standalone host facilities (safeFetch,
// assertPublicUrl, pinnedTransport, ScopedSandboxDelegator): one engine per
// library path made without a config script (a "utility engine": no app,
// only the requests of lua/sandbox/embed/_utilities.lua), created on first
// use and stopped at process exit or by disposeUtilityEngine(). It costs a
// thread and an idle libuv loop; with nothing in flight it keeps neither the
// CPU nor the process's event loop busy.
import { Engine } from "./ffi.ts";

const engines = new Map<string, Engine>();
let counter = 0;

/** The shared utility engine of `library` (default: the bridge's libsbx.so). */
export function utilityEngine(library?: string): Engine {
  const key = library ?? "";
  let e = engines.get(key);
  if (e && !e.closed) return e;
  e = new Engine({ library, config: null, options: {}, onKeyRequest: async () => null });
  engines.set(key, e);
  return e;
}

/** A fresh owner name for host calls ("f12", "d3"). */
export function ownerName(prefix: string): string {
  counter += 1;
  return `${prefix}${counter}`;
}

/**
 * Stops the utility engines: running fetches fail with "engine stopped",
 * delegators are disposed. The next facility call makes a new one. Blocks
 * while the engine thread finishes.
 */
export function disposeUtilityEngine(): void {
  for (const e of engines.values()) e.free();
  engines.clear();
}

/** JSON has no non-finite numbers: they travel as these strings (embed_utilities.lua). */
export function wireNumber(v: unknown): unknown {
  if (typeof v !== "number" || Number.isFinite(v)) return v;
  if (Number.isNaN(v)) return "NaN";
  return v > 0 ? "Infinity" : "-Infinity";
}
