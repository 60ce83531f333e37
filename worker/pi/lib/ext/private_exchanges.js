// private_exchanges.js: the worker half of spec/rich-mode.md 14.2 on Pi's
// extension events.
//   - tool_result: a host tool answer that carried privateTo (success or
//     error) is stored as details.privateTo on the Pi tool result;
//   - reader records: state.recordReader(privateMemory) appends the turn's
//     "roundtable-memory-turn" entry before prompting; the first completed
//     message with memory in it (a memory tool call or result, or any result
//     with privateTo) appends a second one, privateMemory=true;
//   - context: every request is projected for this turn's reader.
// Loaded with speaker-memory (17.4), before the content's extensions.
import { randomUUID } from "node:crypto";
import { READER_RECORD, readerOf, project } from "../privacy.js";

export function privateExchangesExtension(state, memoryTools) {
  const memory = new Set(memoryTools);
  state.privateCalls = new Map();
  return (pi) => {
    let record;                          // {turnId, reader, marked}
    state.recordReader = (privateMemory) => {
      record = { turnId: randomUUID(), reader: readerOf(state.turn.author), marked: false };
      pi.appendEntry(READER_RECORD, { turnId: record.turnId, reader: record.reader, privateMemory });
    };
    state.endReaderTurn = () => { record = undefined; state.privateCalls.clear(); };
    const markMemory = () => {
      if (!record || record.marked) return;
      record.marked = true;
      pi.appendEntry(READER_RECORD, { turnId: record.turnId, reader: record.reader, privateMemory: true });
    };
    pi.on("tool_result", (event) => {
      const privateTo = state.privateCalls.get(event.toolCallId);
      if (privateTo !== undefined || memory.has(event.toolName)) markMemory();
      if (privateTo === undefined) return undefined;
      return { details: { ...(event.details ?? {}), privateTo }, isError: event.isError };
    });
    pi.on("message_end", (event) => {
      const m = event.message;
      if (m?.role === "assistant" && Array.isArray(m.content) && m.content.some((c) => c?.type === "toolCall" && memory.has(c.name))) markMemory();
      return undefined;
    });
    pi.on("context", (event) => {
      if (!state.turn) return undefined;
      return { messages: project(event.messages, readerOf(state.turn.author), memoryTools) };
    });
  };
}
