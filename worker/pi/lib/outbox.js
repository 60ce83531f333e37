// outbox.js: the worker outbox (spec/rich-mode.md 16.5). Each turn writes its
// reply files to <workspace>/outbox/<turnId>/; at the end they are read back
// without following links and sent as base64, and the folder is removed when
// it ends up empty.
//   prepare(workspace, turnId) -> dir      both levels replaced when they are
//                                          not real directories (a planted link
//                                          is unlinked, never followed)
//   save(dir, stem, ext, bytes) -> name    exclusive creation; a taken name
//                                          gets -2, -3, ... on the stem
//   collect(dir) -> [{name, data}]         the bounds below, else OutputError
//   finish(dir)                            rmdir when empty
import { lstatSync, mkdirSync, unlinkSync, readdirSync, rmdirSync, openSync, writeSync, closeSync, constants } from "node:fs";
import { join } from "node:path";
import { readRegular, FileRefused } from "./files.js";
import { safeName } from "./names.js";
import { OUTBOX_FILES_MAX, OUTBOX_FILE_MAX, OUTBOX_TOTAL_MAX } from "./limits.js";

export class OutputError extends Error {
  constructor(message) { super(message); this.name = "OutputError"; }
}

const EXT = /^[a-z0-9]{1,10}$/;

function ownDirectory(path) {
  let st;
  try { st = lstatSync(path); } catch { st = undefined; }
  if (st && !st.isDirectory()) unlinkSync(path);
  if (!st || !st.isDirectory()) mkdirSync(path, { mode: 0o700 });
}

export function prepare(workspace, turnId) {
  const root = join(workspace, "outbox");
  ownDirectory(root);
  const dir = join(root, turnId);
  ownDirectory(dir);
  return dir;
}

export function save(dir, stem, ext, bytes) {
  if (!safeName(stem) || typeof ext !== "string" || !EXT.test(ext) || !(bytes instanceof Uint8Array)
      || bytes.byteLength < 1 || bytes.byteLength > OUTBOX_FILE_MAX || !safeName(`${stem}.${ext}`)) {
    throw new OutputError("Invalid output file");
  }
  for (let n = 1; ; n++) {
    const name = n === 1 ? `${stem}.${ext}` : `${stem}-${n}.${ext}`;
    if (!safeName(name)) throw new OutputError("Invalid output file");
    let fd;
    try {
      fd = openSync(join(dir, name), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    } catch (err) {
      if (err.code === "EEXIST") continue;
      throw err;
    }
    try {
      let at = 0;
      while (at < bytes.byteLength) at += writeSync(fd, bytes, at, bytes.byteLength - at);
    } finally {
      closeSync(fd);
    }
    return name;
  }
}

export function collect(dir) {
  const names = readdirSync(dir);
  if (names.length > OUTBOX_FILES_MAX || names.some((n) => !safeName(n))) throw new OutputError("Output file bounds exceeded");
  names.sort();
  const files = [];
  let total = 0;
  for (const name of names) {
    let bytes;
    try {
      bytes = readRegular(join(dir, name), OUTBOX_FILE_MAX);
    } catch (err) {
      if (err instanceof FileRefused && err.reason === "changed") throw new OutputError("File changed while reading");
      throw new OutputError("Invalid or oversized file");
    }
    if (bytes.byteLength < 1) throw new OutputError("Invalid or oversized file");
    total += bytes.byteLength;
    if (total > OUTBOX_TOTAL_MAX) throw new OutputError("Reply byte budget exceeded");
    files.push({ name, data: Buffer.from(bytes).toString("base64") });
  }
  return files;
}

export function finish(dir) {
  try { if (readdirSync(dir).length === 0) rmdirSync(dir); } catch { /* gone already */ }
}


