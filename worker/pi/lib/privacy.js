// privacy.js: the worker's rules for private exchanges (spec/rich-mode.md 14.2),
// pure functions over Pi messages and persisted session entries:
//
//   readerOf(author)                     principalId or id
//   walk(entries, memoryTools)           the raw branch, attributed turn by turn:
//                                        {privateHistory, turns:[{reader, privateMemory, unreadable}], tagged:[privateTo...]}
//   bridgeRefused(entries, reader, memoryTools) -> true when the bridge must not replay it
//   project(messages, reader, memoryTools) -> messages as this reader may see them
//   redact(messages, memoryTools)        -> messages with every private exchange removed
//                                        (for Pi's summary and the host compactor)
//
// A tagged exchange is a tool result whose details carry privateTo, together
// with the tool call of the same id; a memory exchange is a call to or a
// result from a tool the content module lists in memoryTools. A reader
// record (custom entry "roundtable-memory-turn" {turnId, reader,
// privateMemory}) opens a turn; everything after it belongs to that reader,
// even a malformed, truncated or unanswered exchange.
export const READER_RECORD = "roundtable-memory-turn";
export const HIDDEN_OTHER = "(another person's private memory, hidden)";
export const HIDDEN_UNTAGGED = "(a private memory result that does not say whose it is, hidden)";
export const BRIDGE_REFUSAL = "claude-bridge cannot replay another reader's private-memory turns or private exchanges hidden from this sandbox reader; use another provider or a fresh conversation";

export function readerOf(author) {
  return author?.principalId ?? author?.id;
}

function privateToOf(msg) {
  const p = msg?.details?.privateTo;
  return typeof p === "string" ? p : undefined;
}

function isRecord(data) {
  return data !== null && typeof data === "object" && typeof data.turnId === "string"
    && typeof data.reader === "string" && typeof data.privateMemory === "boolean";
}

// walk: one pass over the persisted branch (compactions included).
export function walk(entries, memoryTools = []) {
  const memory = new Set(memoryTools);
  const turns = [];
  const tagged = [];
  let current;
  for (const e of entries ?? []) {
    if (e?.type === "custom" && e.customType === READER_RECORD) {
      if (!isRecord(e.data)) { current = { reader: undefined, privateMemory: true, unreadable: true }; turns.push(current); continue; }
      if (current && current.turnId === e.data.turnId) { current.privateMemory ||= e.data.privateMemory; continue; }
      current = { turnId: e.data.turnId, reader: e.data.reader, privateMemory: e.data.privateMemory, unreadable: false };
      turns.push(current);
      continue;
    }
    if (e?.type !== "message") continue;
    const m = e.message;
    if (m?.role === "toolResult") {
      const p = privateToOf(m);
      if (p !== undefined) tagged.push(p);
      if ((p !== undefined || memory.has(m.toolName)) && current) current.privateMemory = true;
    } else if (m?.role === "assistant" && Array.isArray(m.content) && current) {
      if (m.content.some((c) => c?.type === "toolCall" && memory.has(c.name))) current.privateMemory = true;
    }
  }
  return { turns, tagged, privateHistory: tagged.length > 0 || turns.some((t) => t.privateMemory) };
}

export function bridgeRefused(entries, reader, memoryTools = []) {
  const w = walk(entries, memoryTools);
  if (w.tagged.some((p) => p !== reader)) return true;
  return w.turns.some((t) => t.privateMemory && (t.unreadable || t.reader !== reader));
}

// The tool-call ids whose exchange is hidden from reader (undefined reader:
// hidden from everyone, i.e. every private exchange), and how.
function hiddenCalls(messages, reader, memory) {
  const hidden = new Map();
  for (const m of messages) {
    if (m?.role !== "toolResult") continue;
    const p = privateToOf(m);
    if (p !== undefined) { if (reader === undefined || p !== reader) hidden.set(m.toolCallId, HIDDEN_OTHER); }
    else if (memory.has(m.toolName)) hidden.set(m.toolCallId, HIDDEN_UNTAGGED);
  }
  return hidden;
}

function placeholderResult(m, text) {
  const { details: _d, ...rest } = m;
  return { ...rest, content: [{ type: "text", text }] };
}

// project: call ids and names stay paired; the call shows no arguments.
export function project(messages, reader, memoryTools = []) {
  const hidden = hiddenCalls(messages, reader, new Set(memoryTools));
  if (hidden.size === 0) return messages;
  return messages.map((m) => {
    if (m?.role === "toolResult" && hidden.has(m.toolCallId)) return placeholderResult(m, hidden.get(m.toolCallId));
    if (m?.role === "assistant" && Array.isArray(m.content) && m.content.some((c) => c?.type === "toolCall" && hidden.has(c.id))) {
      return { ...m, content: m.content.map((c) => (c?.type === "toolCall" && hidden.has(c.id) ? { ...c, arguments: {} } : c)) };
    }
    return m;
  });
}

// redact: for summaries. Private exchanges (tagged or memory tools) are
// dropped, and so is reasoning. `also` holds messages on the other side of a
// compaction boundary, so a call and its result split by it still match.
export function redact(messages, memoryTools = [], also = []) {
  const memory = new Set(memoryTools);
  const hidden = hiddenCalls([...also, ...messages], undefined, memory);
  for (const m of [...also, ...messages]) {
    if (m?.role === "assistant" && Array.isArray(m.content)) {
      for (const c of m.content) if (c?.type === "toolCall" && memory.has(c.name)) hidden.set(c.id, HIDDEN_UNTAGGED);
    }
  }
  const out = [];
  for (const m of messages) {
    if (m?.role === "toolResult" && hidden.has(m.toolCallId)) continue;
    if (m?.role === "assistant" && Array.isArray(m.content)) {
      const content = m.content.filter((c) => c?.type !== "thinking" && c?.type !== "redacted_thinking" && !(c?.type === "toolCall" && hidden.has(c.id)));
      if (content.length === 0) continue;
      out.push({ ...m, content });
      continue;
    }
    out.push(m);
  }
  return out;
}

function withoutReasoning(m) {
  if (m?.role !== "assistant" || !Array.isArray(m.content)) return m;
  if (!m.content.some((c) => c?.type === "thinking" || c?.type === "redacted_thinking")) return m;
  return { ...m, content: m.content.filter((c) => c?.type !== "thinking" && c?.type !== "redacted_thinking") };
}

// keptForSummary: the kept tail as a summarizer may see it: every private
// exchange shows its placeholder (no reader sees through), calls keep their
// ids and names but no arguments, and reasoning is gone.
export function keptForSummary(messages, memoryTools = []) {
  return project(messages, undefined, memoryTools).map(withoutReasoning);
}

// redactPreparation(preparation, kept, memoryTools): Pi's compaction
// preparation redacted in place (the one object Pi's own summary, the
// bridge's and the host request all read). A call and its result on
// different sides of the boundary (the summarized part, the split turn's
// prefix, the kept tail) are matched across all three.
export function redactPreparation(preparation, kept, memoryTools = []) {
  const summarized = preparation.messagesToSummarize ?? [];
  const prefix = preparation.turnPrefixMessages ?? [];
  preparation.messagesToSummarize = redact(summarized, memoryTools, [...prefix, ...kept]);
  preparation.turnPrefixMessages = redact(prefix, memoryTools, [...summarized, ...kept]);
  return preparation;
}
