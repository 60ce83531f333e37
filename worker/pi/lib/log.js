// log.js: the worker's log lines (spec/rich-mode.md 17.5): one JSON object per
// line on stdout, {time, app:"sandbox-worker", msg, ...fields}. Callers pass
// only names, statuses, counts and bounded error text: never a payload or a
// credential.
export function log(msg, fields = {}) {
  const line = JSON.stringify({ time: new Date().toISOString(), app: "sandbox-worker", msg, ...fields });
  process.stdout.write(line + "\n");
}

// errorText(err): "<name>: <message>" down the cause chain (section 19's
// errorText), at most 64 levels, for log fields and ok=false errors.
export function errorText(err, depth = 0) {
  if (err === undefined || err === null) return String(err);
  if (typeof err !== "object") return String(err);
  const head = err instanceof Error ? `${err.name}: ${err.message}` : String(err.message ?? err);
  if (err.cause !== undefined && depth < 63) return `${head} (cause: ${errorText(err.cause, depth + 1)})`;
  return head;
}

// cut(text, max): at most max code points, for bounded log and reply fields.
export function cut(text, max) {
  const s = String(text);
  if (s.length <= max) return s;
  const cps = Array.from(s);
  return cps.length <= max ? s : cps.slice(0, max).join("");
}
