// files.js: bounded, no-follow reads of trusted-path files (attachments,
// skills). The last path component is opened O_NOFOLLOW|O_NONBLOCK, so a
// planted symlink or FIFO never redirects or stalls the read; the descriptor
// is fstat'ed and must be a regular file within the size bound.
import { openSync, fstatSync, readSync, closeSync, constants } from "node:fs";

export class FileRefused extends Error {
  constructor(reason) { super(reason); this.name = "FileRefused"; this.reason = reason; }
}

// readRegular(path, max) -> Uint8Array. Throws FileRefused("missing" |
// "not-regular" | "too-large" | "changed").
export function readRegular(path, max) {
  let fd;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    throw new FileRefused("missing");
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new FileRefused("not-regular");
    if (st.size > max) throw new FileRefused("too-large");
    const buf = new Uint8Array(st.size);
    let at = 0;
    while (at < st.size) {
      const n = readSync(fd, buf, at, st.size - at, null);
      if (n === 0) break;
      at += n;
    }
    if (at !== st.size) throw new FileRefused("changed");
    return buf;
  } finally {
    closeSync(fd);
  }
}
