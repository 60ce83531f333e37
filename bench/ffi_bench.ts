// ffi_bench.ts: the embedding ABI's round trips as a Bun host sees them
// (bun:ffi through build/libsbx_ffi.so, the RTLD_DEEPBIND loader).
//   cd <repo> && bun bench/ffi_bench.ts [N]      (as a non-root user)
// Cases: status (sbx_engine_status, synchronous), ping through a threadsafe
// JSCallback (submit, await the callback), ping through polling (submit,
// sbx_engine_poll until the result is there), pipelined pings by callback.
import { dlopen, FFIType, CString, JSCallback, ptr } from "bun:ffi";
import { mkdtempSync, rmSync } from "node:fs";

const N = Number(process.argv[2] ?? 20000);
const root = new URL("..", import.meta.url).pathname;
const lib = dlopen(root + "build/libsbx_ffi.so", {
  sbx_engine_new: { args: [FFIType.cstring, FFIType.cstring, FFIType.ptr, FFIType.ptr, FFIType.ptr], returns: FFIType.ptr },
  sbx_engine_submit: { args: [FFIType.ptr, FFIType.ptr, FFIType.u64], returns: FFIType.i64 },
  sbx_engine_status: { args: [FFIType.ptr], returns: FFIType.ptr },
  sbx_engine_poll: { args: [FFIType.ptr], returns: FFIType.ptr },
  sbx_engine_free: { args: [FFIType.ptr], returns: FFIType.void },
  sbx_free: { args: [FFIType.ptr], returns: FFIType.void },
}).symbols;

const z = (s: string) => Buffer.from(s + "\0");
const tmp = mkdtempSync("/tmp/sbx-ffi-bench-");
const opts = z(JSON.stringify({ luaDir: root + "lua", apiKey: "host", root: tmp }));
const config = z(root + "spec/c/ffi/real_app.lua");
const ping = Buffer.from('{"type":"ping"}');

let waiting: (() => void) | null = null;
let got = 0;
const cb = new JSCallback(
  (_u, _id, json) => { new CString(json).toString(); got++; const w = waiting; waiting = null; w?.(); },
  { args: [FFIType.ptr, FFIType.i64, FFIType.ptr, FFIType.u64], returns: FFIType.void, threadsafe: true },
);

function report(name: string, lat: number[], totalMs: number) {
  lat.sort((a, b) => a - b);
  const us = (x: number) => (x * 1000).toFixed(1).padStart(7);
  console.log(`${name.padEnd(26)} p50 ${us(lat[lat.length >> 1])} us  p99 ${us(lat[Math.floor(lat.length * 0.99)])} us  ${Math.round(lat.length / (totalMs / 1000)).toString().padStart(8)} calls/s`);
}

let e = lib.sbx_engine_new(config, opts, cb.ptr, null, null);
if (!e) throw new Error("sbx_engine_new failed");
for (let i = 0; i < 200; i++) lib.sbx_free(lib.sbx_engine_status(e));

let lat: number[] = [];
let t0 = performance.now();
for (let i = 0; i < N; i++) {
  const s = performance.now();
  const r = lib.sbx_engine_status(e);
  new CString(r!).toString();
  lib.sbx_free(r);
  lat.push(performance.now() - s);
}
report("status (sync)", lat, performance.now() - t0);

lat = [];
got = 0;
t0 = performance.now();
for (let i = 0; i < N; i++) {
  const s = performance.now();
  const done = new Promise<void>((res) => { waiting = res; });
  lib.sbx_engine_submit(e, ptr(ping), ping.length);
  await done;
  lat.push(performance.now() - s);
}
report("ping (threadsafe cb)", lat, performance.now() - t0);

got = 0;
t0 = performance.now();
const all = new Promise<void>((res) => {
  const check = () => (got >= N ? res() : setTimeout(check, 1));
  check();
});
for (let i = 0; i < N; i++) {
  // SBX_EBUSY (-1011): SBX_FFI_MAX_PENDING requests not yet taken by the loop.
  while (Number(lib.sbx_engine_submit(e, ptr(ping), ping.length)) === -1011) await Bun.sleep(0);
}
await all;
console.log(`${"ping (cb, pipelined)".padEnd(26)} ${Math.round(N / ((performance.now() - t0) / 1000))} calls/s`);
lib.sbx_engine_free(e);

e = lib.sbx_engine_new(config, opts, null, null, null);
lat = [];
t0 = performance.now();
for (let i = 0; i < N; i++) {
  const s = performance.now();
  lib.sbx_engine_submit(e, ptr(ping), ping.length);
  let r = lib.sbx_engine_poll(e);
  while (!r) { await null; r = lib.sbx_engine_poll(e); }
  lib.sbx_free(r);
  lat.push(performance.now() - s);
}
report("ping (poll, spin)", lat, performance.now() - t0);
lib.sbx_engine_free(e);
cb.close();
rmSync(tmp, { recursive: true, force: true });
