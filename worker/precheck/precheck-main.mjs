// precheck-main.mjs: the precheck image's entry script (shared/spec/precheck.md
// section 7). Plain JavaScript, no dependencies: Bun's built-in modules only.
//
// It reads one input document from stdin, runs the agent-written script in
// it as an ES module, and writes exactly one answer on stdout:
//   {"ok":true,"result":<value>}  or  {"ok":false,"error":"<message>"}
// then exits with status 0 every time (even with timers or sockets left
// open). Console output goes to stderr, which the host discards. The only
// way out of the container is mcp.call / mcp.json: one HTTP/1.1 request per
// connection to the precheck broker on /broker/broker.sock, with exactly the
// sealed worker's four headers and the dummy credential.
import { randomUUID } from "node:crypto";
import { unlinkSync, writeFileSync, writeSync } from "node:fs";
import net from "node:net";
import { pathToFileURL } from "node:url";
import { format } from "node:util";

const MAX_INPUT = 65536;                 // stdin, bytes (7.1 step 1)
const MAX_ERROR_CHARS = 1000;            // error messages, characters (7.1 step 6)
const CALL_DEADLINE_MS = 65000;          // one broker call (7.2 step 3)
const MAX_HEAD = 16384;                  // broker reply head, bytes
const MAX_BODY = 1048576;                // broker reply body, bytes
const DUMMY = "Bearer sandbox-dummy-key";

const REASONS = {
  403: "that server or tool is not granted to this script",
  404: "that server is not granted to this script",
  409: "the script made two MCP calls at once; await each before the next",
  410: "the run ended",
  429: "the script made too many MCP calls",
};

// The first `max` characters (code points, so a pair is never split).
function cut(text, max = MAX_ERROR_CHARS) {
  if (text.length <= max) return text;
  let out = "";
  let n = 0;
  for (const ch of text) {
    if (n === max) break;
    out += ch;
    n += 1;
  }
  return out;
}

function errorText(err) {
  if (err instanceof Error) return cut(String(err.message));
  try {
    return cut(String(err));
  } catch {
    return "the script failed";
  }
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function isPlainObject(v) {
  if (!isObject(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

// stdin, at most MAX_INPUT bytes.
async function readInput() {
  const chunks = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    size += chunk.length;
    if (size > MAX_INPUT) throw new Error("body too large");
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}

function parseInput(text) {
  const bad = () => new Error("invalid precheck input");
  let v;
  try {
    v = JSON.parse(text);
  } catch {
    throw bad();
  }
  if (!isObject(v)) throw bad();
  for (const k of ["script", "firedAt", "timeZone", "today"]) if (typeof v[k] !== "string") throw bad();
  if (!isObject(v.schedule) || !Array.isArray(v.servers)) throw bad();
  for (const s of v.servers) {
    if (!isObject(s) || typeof s.name !== "string" || !Array.isArray(s.tools)) throw bad();
    for (const t of s.tools) if (typeof t !== "string") throw bad();
  }
  return v;
}

// Every console method writes to stderr; stdout is the answer's.
function quietConsole() {
  const toStderr = (...args) => {
    try {
      process.stderr.write(format(...args) + "\n");
    } catch {
      // a closed stderr loses the noise, nothing else
    }
  };
  for (const k of Object.keys(console)) {
    if (typeof console[k] === "function") console[k] = toStderr;
  }
  for (const k of ["log", "info", "debug", "warn", "error", "trace", "dir", "dirxml", "table"]) console[k] = toStderr;
}

// ---- the broker client (the sealed worker's contract) ----------------------

function brokerSocket() {
  const s = process.env.PRECHECK_BROKER_SOCKET;
  return s !== undefined && s !== "" ? s : "/broker/broker.sock";
}

// Splits one HTTP/1.1 reply read until the broker closed: {status, body}.
function parseReply(buf) {
  const end = buf.indexOf("\r\n\r\n");
  if (end < 0) {
    if (buf.length > MAX_HEAD) throw new Error("broker response too large");
    return { status: 502, body: Buffer.alloc(0) };
  }
  if (end + 4 > MAX_HEAD) throw new Error("broker response too large");
  const head = buf.subarray(0, end).toString("latin1").split("\r\n");
  const m = /^HTTP\/1\.[01] (\d{3})(?: |$)/.exec(head[0]);
  if (!m) return { status: 502, body: Buffer.alloc(0) };
  let body = buf.subarray(end + 4);
  for (const line of head.slice(1)) {
    const c = line.indexOf(":");
    if (c > 0 && line.slice(0, c).trim().toLowerCase() === "content-length") {
      const n = Number(line.slice(c + 1).trim());
      if (Number.isInteger(n) && n >= 0 && n < body.length) body = body.subarray(0, n);
    }
  }
  if (body.length > MAX_BODY) throw new Error("broker response too large");
  return { status: Number(m[1]), body };
}

// One POST on its own connection, read until the broker closes it.
function brokerPost(path, body) {
  const payload = Buffer.from(body, "utf8");
  const head =
    `POST ${path} HTTP/1.1\r\n` +
    "host: broker\r\n" +
    "content-type: application/json\r\n" +
    `content-length: ${payload.length}\r\n` +
    `authorization: ${DUMMY}\r\n\r\n`;
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let settled = false;
    const sock = net.createConnection({ path: brokerSocket() });
    const finish = (fn, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      fn(value);
    };
    const timer = setTimeout(() => finish(reject, new Error("broker call timed out")), CALL_DEADLINE_MS);
    sock.on("connect", () => {
      sock.write(head);
      sock.write(payload);
    });
    sock.on("data", (chunk) => {
      size += chunk.length;
      if (size > MAX_HEAD + MAX_BODY) {
        finish(reject, new Error("broker response too large"));
        return;
      }
      chunks.push(chunk);
    });
    sock.on("end", () => {
      try {
        finish(resolve, parseReply(Buffer.concat(chunks)));
      } catch (err) {
        finish(reject, err);
      }
    });
    sock.on("error", (err) => finish(reject, err));
  });
}

function firstText(result) {
  if (!Array.isArray(result.content)) return undefined;
  for (const item of result.content) {
    if (isObject(item) && item.type === "text" && typeof item.text === "string") return item.text;
  }
  return undefined;
}

function makeMcp(servers) {
  const granted = new Set();
  for (const s of servers) for (const t of s.tools) granted.add(`${s.name}\u0000${t}`);

  async function call(server, tool, args = {}) {
    const label = `${server}/${tool}`;
    if (typeof server !== "string" || typeof tool !== "string" || !granted.has(`${server}\u0000${tool}`)) {
      throw new Error(`${label} is not granted to this script`);
    }
    if (!isPlainObject(args)) throw new Error(`${label}: arguments must be a JSON object`);
    const body = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: tool, arguments: args } });
    const reply = await brokerPost(`/mcp/${server}`, body);
    if (reply.status !== 200) throw new Error(`${label}: ${REASONS[reply.status] ?? "the broker call failed"}`);
    let message;
    try {
      message = JSON.parse(reply.body.toString("utf8"));
    } catch {
      throw new Error("broker returned no JSON");
    }
    if (!isObject(message)) throw new Error(`${label}: no answer`);
    if (message.error !== null && typeof message.error === "object") {
      throw new Error(`${label}: ${String(message.error.message)}`);
    }
    const result = message.result;
    if (!isObject(result)) throw new Error(`${label}: no result`);
    if (result.isError === true) throw new Error(`${label}: ${firstText(result) ?? "failed"}`);
    return result;
  }

  async function json(server, tool, args = {}) {
    const result = await call(server, tool, args);
    if (Object.prototype.hasOwnProperty.call(result, "structuredContent")) return result.structuredContent;
    const text = firstText(result);
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }

  return Object.freeze({ call, json });
}

// ---- the run -----------------------------------------------------------------

async function runScript(input) {
  const dir = process.env.TMPDIR !== undefined && process.env.TMPDIR !== "" ? process.env.TMPDIR : "/tmp";
  const file = `${dir.replace(/\/+$/, "") || ""}/precheck-${randomUUID()}.mjs`;
  writeFileSync(file, input.script, { mode: 0o600, flag: "wx" });
  let mod;
  try {
    mod = await import(pathToFileURL(file).href);
  } finally {
    try {
      unlinkSync(file);
    } catch {
      // already gone: nothing to clean
    }
  }
  const check = mod.default;
  if (typeof check !== "function") throw new Error("the script has no default export function");
  return check({
    mcp: makeMcp(input.servers),
    firedAt: new Date(input.firedAt),
    timeZone: input.timeZone,
    today: input.today,
    schedule: input.schedule,
  });
}

function answerFor(outcome) {
  try {
    if (outcome.ok) return JSON.stringify({ ok: true, result: outcome.value ?? null });
  } catch (err) {
    return JSON.stringify({ ok: false, error: errorText(err) });
  }
  return JSON.stringify({ ok: false, error: errorText(outcome.error) });
}

function writeAll(text) {
  const buf = Buffer.from(text, "utf8");
  let off = 0;
  while (off < buf.length) {
    try {
      off += writeSync(1, buf, off, buf.length - off);
    } catch (err) {
      if (err && err.code === "EAGAIN") continue;
      return;
    }
  }
}

async function main() {
  // A stray rejection or throw from the script's own timers must not kill
  // the process before it answers.
  process.on("unhandledRejection", () => {});
  process.on("uncaughtException", () => {});
  // A script awaiting a promise that never settles must not let the process
  // end without an answer: the loop stays alive until the answer is written
  // (or the runner's deadline kills the container).
  const keepAlive = setInterval(() => {}, 1 << 30);
  let outcome;
  try {
    const input = parseInput(await readInput());
    quietConsole();
    outcome = { ok: true, value: await runScript(input) };
  } catch (err) {
    outcome = { ok: false, error: err };
  }
  writeAll(answerFor(outcome));
  clearInterval(keepAlive);
  process.exit(0);
}

main();
