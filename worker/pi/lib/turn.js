// turn.js: one turn in the worker (spec/rich-mode.md 17.5, part 1).
//
// 1. An unknown thinking level gives "unknown thinking level X".
// 2. Set the turn context (author id, name, principalId).
// 3. Bridge refusal (14.2): on a claude-bridge model, a raw branch holding a
//    private-memory turn of another reader, or a privateTo exchange this
//    reader may not see, ends the turn before any provider call.
// 4. Set memory and visibility, write the reader record, pin the active
//    tools, set the thinking level and the compaction tier (15.1).
// 5. A 10-minute in-worker abort timer.
// 6. Prompt with "[<name> (<id>)] <text>" plus the images. A throw, or a run
//    whose last assistant message ended in an error, gives
//    {ok:false, error:"prompt failed: <err>"}.
// The reply text is trimmed and must be 1-100,000 characters ("Final text
// bounds exceeded"); the reply files are the turn's outbox (16.5, lib/outbox.js).
// Either failure is logged "turn output failed" and answered
// {ok:false, error:"Worker output failed"}.
import { log, errorText, cut } from "./log.js";
import { writeBridgePrompt } from "./session.js";
import { codePoints } from "./names.js";
import * as outbox from "./outbox.js";
import { BRIDGE_REFUSAL, bridgeRefused, readerOf } from "./privacy.js";
import { THINKING_LEVELS, TURN_ABORT_MS, TEXT_MAX, RESULT_ERROR_MAX } from "./limits.js";

function failure(error) { return { ok: false, error: cut(error, RESULT_ERROR_MAX) }; }

function assistantText(message) {
  return (message.content ?? []).filter((c) => c?.type === "text").map((c) => c.text).join("");
}

export async function runTurn(state, session, turn) {
  if (!THINKING_LEVELS.includes(turn.thinking)) return failure(`unknown thinking level ${turn.thinking}`);
  const reader = readerOf(turn.author);
  if (state.provider === "claude-bridge" && bridgeRefused(session.sessionManager.getBranch(), reader, state.memoryTools)) {
    log("prompt failed", { turnId: turn.turnId, error: "bridge refusal" });
    return failure(BRIDGE_REFUSAL);
  }
  try {
    state.outbox = outbox.prepare(state.workspace, turn.turnId);
  } catch (err) {
    log("turn output failed", { turnId: turn.turnId, error: cut(errorText(err), 2000) });
    return failure("Worker output failed");
  }
  state.turn = turn;
  let toolCalls = 0;
  let reply;                 // this turn's last assistant message (a compaction may rebuild session.messages)
  const unsubscribe = session.subscribe((event) => {
    if (event.type === "tool_execution_end") toolCalls += 1;
    else if (event.type === "message_end" && event.message?.role === "assistant") reply = event.message;
    else if (event.type === "auto_retry_start") log("model call retried", { attempt: event.attempt, error: cut(event.errorMessage ?? "", 2000) });
  });
  const timer = setTimeout(() => { void session.abort(); }, TURN_ABORT_MS);
  try {
    state.recordReader(turn.memory !== "" && turn.memoryVisibility !== "shared");
    state.pinTools();
    session.setThinkingLevel(turn.thinking);
    state.applyTier(session.model, session.sessionManager.getBranch());
    writeBridgePrompt(state);
    const images = turn.images.map((i) => ({ type: "image", data: i.data, mimeType: i.mimeType }));
    try {
      await session.prompt(`[${turn.author.name} (${turn.author.id})] ${turn.text}`, {
        expandPromptTemplates: false,
        ...(images.length ? { images } : {}),
      });
    } catch (err) {
      log("prompt failed", { turnId: turn.turnId, error: cut(errorText(err), 2000) });
      return failure(`prompt failed: ${errorText(err)}`);
    }
    if (!reply || reply.stopReason === "error" || reply.stopReason === "aborted") {
      const why = reply?.errorMessage || (reply ? reply.stopReason : "no reply");
      log("model call failed", { turnId: turn.turnId, error: cut(why, 2000) });
      return failure(`prompt failed: ${why}`);
    }
    const text = assistantText(reply).trim();
    if (!text || codePoints(text) > TEXT_MAX) {
      log("turn output failed", { turnId: turn.turnId, error: "Final text bounds exceeded" });
      return failure("Worker output failed");
    }
    let files;
    try {
      files = outbox.collect(state.outbox);
    } catch (err) {
      log("turn output failed", { turnId: turn.turnId, error: cut(err.message, 2000) });
      return failure("Worker output failed");
    }
    log("turn finished", { turnId: turn.turnId, thinking: turn.thinking, toolCalls });
    return { ok: true, text, files };
  } finally {
    clearTimeout(timer);
    unsubscribe();
    state.endReaderTurn();
    if (state.outbox) outbox.finish(state.outbox);
    state.outbox = undefined;
    state.turn = undefined;
  }
}
