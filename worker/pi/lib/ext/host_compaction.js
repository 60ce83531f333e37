// host_compaction.js: the worker side of compaction (spec/rich-mode.md
// 15.1-15.2, 14.2 "compaction privacy") on Pi's extension events.
//
//   - Tiers: state.applyTier() sets Pi's reserveTokens = window - trigger
//     (lib/tiers.js), before every prompt and after every compaction.
//   - session_before_compact (one handler, this extension's):
//       1. redacts Pi's preparation in place, so neither Pi's summary, the
//          bridge's nor the host request sees a private exchange or reasoning;
//       2. with a host compactor (config.compaction.engine), unless a tier
//          rule skips it (a "bypass" report and "compaction skips the host
//          compactor"), posts the request to /compaction/compact, abortable
//          by the compaction's own signal; an answer {ok:true, compaction} is
//          the result; a non-200 status, ok=false or an exception logs
//          "compaction falls back to Pi's summary" {fallback};
//       3. falling back: Pi summarizes, on a claude-bridge model through the
//          bridge's own takeover (session.js hands it over disabled, so it
//          runs only here, on the redacted preparation). An aborted signal
//          cancels instead, so Pi records an aborted compaction.
//     Without a host compactor no host request is ever made (the "compaction
//     ready" line says hostCompactor=false); the privacy step still runs.
//   - session_compact / session_compact_failed: one report each to
//     /compaction/report (5 s, failures logged "compaction report failed");
//     state.flushReports() resolves when every report has settled, which the
//     transport awaits before /worker/result.
import * as broker from "../broker.js";
import { log, errorText, cut } from "../log.js";
import { buildSessionContext, estimateTokens } from "@earendil-works/pi-coding-agent";
import { keptForSummary, redactPreparation } from "../privacy.js";
import { reserveFor, skipReason } from "../tiers.js";
import { COMPACTION_ANSWER_MAX, REPORT_TIMEOUT_MS, RESULT_ERROR_MAX, TURN_ABORT_MS, LOG_ERROR_MAX } from "../limits.js";

const sorted = (set) => [...set].sort();

// fileLists(fileOps): readFiles = read minus modified, modifiedFiles = written
// and edited, both sorted (15.2 step 1).
function fileLists(ops) {
  const modified = new Set([...(ops?.written ?? []), ...(ops?.edited ?? [])]);
  return { readFiles: sorted([...(ops?.read ?? [])].filter((f) => !modified.has(f))), modifiedFiles: sorted(modified) };
}

function keptMessages(branch, firstKeptEntryId) {
  const at = branch.findIndex((e) => e.id === firstKeptEntryId);
  if (at < 0) return [];
  return branch.slice(at).filter((e) => e.type === "message").map((e) => e.message);
}

export function buildRequest(event, kept, memoryTools) {
  const p = event.preparation;
  return {
    reason: event.reason, tokensBefore: p.tokensBefore, firstKeptEntryId: p.firstKeptEntryId, isSplitTurn: p.isSplitTurn,
    messagesToSummarize: p.messagesToSummarize, turnPrefixMessages: p.turnPrefixMessages,
    keptMessages: keptForSummary(kept, memoryTools),
    ...(typeof p.previousSummary === "string" ? { previousSummary: p.previousSummary } : {}),
    ...(typeof event.customInstructions === "string" ? { customInstructions: event.customInstructions } : {}),
    ...fileLists(p.fileOps),
  };
}

// ask(request, signal) -> {compaction, tokensAfter} | {fallback}
async function ask(request, signal) {
  let res;
  try {
    res = await broker.call("POST", "/compaction/compact", { body: request, signal, timeoutMs: TURN_ABORT_MS, max: COMPACTION_ANSWER_MAX });
  } catch (err) {
    return { fallback: errorText(err) };
  }
  if (res.status !== 200) return { fallback: `the broker answered ${res.status}` };
  let answer;
  try { answer = broker.json(res.bytes); } catch (err) { return { fallback: errorText(err) }; }
  if (answer?.ok !== true) return { fallback: typeof answer?.fallback === "string" ? answer.fallback : "the host declined" };
  const c = answer.compaction;
  if (!c || typeof c.summary !== "string" || c.summary === "" || c.firstKeptEntryId !== request.firstKeptEntryId
      || !Number.isInteger(c.tokensBefore) || (c.details !== undefined && (c.details === null || typeof c.details !== "object"))) {
    return { fallback: "the host's compaction is malformed" };
  }
  return {
    compaction: { summary: c.summary, firstKeptEntryId: c.firstKeptEntryId, tokensBefore: c.tokensBefore, details: c.details ?? {} },
    tokensAfter: Number.isInteger(c.estimatedTokensAfter) ? c.estimatedTokensAfter : undefined,
  };
}

// hostCompactionExtension(state, {engine, memoryTools, settings, takeover})
//   engine: the host engine (config.compaction.engine) or undefined;
//   settings: the session's SettingsManager; takeover: {handler} the
//   bridge's session_before_compact handler, held back by session.js.
export function hostCompactionExtension(state, { engine, memoryTools, settings, takeover }) {
  const baseReserve = settings.getCompactionReserveTokens();
  const pending = new Set();
  let hostAfter;                                    // the host's estimatedTokensAfter of the running compaction

  state.applyTier = (model, branch) => {
    if (!model?.contextWindow) return undefined;
    const reserveTokens = reserveFor(model.contextWindow, baseReserve, branch, engine);
    settings.applyOverrides({ compaction: { reserveTokens } });
    return model.contextWindow - reserveTokens;
  };
  state.flushReports = async () => { while (pending.size) await Promise.allSettled([...pending]); };

  const report = (body) => {
    const p = broker.call("POST", "/compaction/report", { body, timeoutMs: REPORT_TIMEOUT_MS })
      .then((res) => { if (res.status !== 200) log("compaction report failed", { type: body.type, status: res.status }); })
      .catch((err) => log("compaction report failed", { type: body.type, error: cut(errorText(err), LOG_ERROR_MAX) }))
      .finally(() => pending.delete(p));
    pending.add(p);
  };

  return (pi) => {
    pi.on("session_before_compact", async (event, ctx) => {
      const branch = event.branchEntries ?? [];
      const kept = keptMessages(branch, event.preparation.firstKeptEntryId);
      redactPreparation(event.preparation, kept, memoryTools);
      hostAfter = undefined;
      const fallBack = async () => {
        if (event.signal?.aborted) return { cancel: true };
        return takeover?.handler ? takeover.handler(event, ctx) : undefined;
      };
      if (engine === undefined) return fallBack();
      const skip = skipReason(event.preparation.tokensBefore, branch, engine);
      if (skip) {
        log("compaction skips the host compactor", { reason: skip, tokensBefore: event.preparation.tokensBefore });
        report({ type: "bypass", reason: skip, tokensBefore: event.preparation.tokensBefore });
        return fallBack();
      }
      const got = await ask(buildRequest(event, kept, memoryTools), event.signal);
      if (got.compaction && !event.signal?.aborted) {
        hostAfter = got.tokensAfter;
        return { compaction: got.compaction };
      }
      log("compaction falls back to Pi's summary", { fallback: cut(got.fallback ?? "the compaction was aborted", LOG_ERROR_MAX) });
      return fallBack();
    });

    pi.on("session_compact", (event, ctx) => {
      const entry = event.compactionEntry;
      const branch = ctx.sessionManager.getBranch();
      const nextCompactionAt = state.applyTier(ctx.model, branch);
      let contextAfter = 0;
      for (const m of buildSessionContext(branch).messages) contextAfter += estimateTokens(m);
      const byHost = engine !== undefined && entry?.details?.engine === engine;
      const tokensAfter = byHost && hostAfter !== undefined ? hostAfter : contextAfter;
      const fields = {
        reason: event.reason, aborted: false, willRetry: event.willRetry, engine: byHost ? "extension" : "pi",
        tokensBefore: entry?.tokensBefore, tokensAfter, contextAfter,
        ...(nextCompactionAt !== undefined ? { nextCompactionAt } : {}),
      };
      log("conversation compacted", fields);
      report({ type: "end", ...fields });
      hostAfter = undefined;
    });

    pi.on("session_compact_failed", (event) => {
      const error = typeof event.errorMessage === "string" ? cut(event.errorMessage, RESULT_ERROR_MAX) : undefined;
      log("compaction failed", { reason: event.reason, aborted: event.aborted, ...(error ? { error: cut(error, LOG_ERROR_MAX) } : {}) });
      report({ type: "end", reason: event.reason, aborted: event.aborted, willRetry: event.willRetry, ...(error ? { error } : {}) });
      hostAfter = undefined;
    });
  };
}

// withoutTakeover(factory, takeover): the bridge's extension with its
// session_before_compact handler held in takeover.handler instead of
// registered, so it can run only as host-compaction's fallback (after the
// preparation is redacted) and never after a host summary was chosen.
export function withoutTakeover(factory, takeover) {
  return (pi) => {
    const view = new Proxy(pi, {
      get(target, prop) {
        if (prop === "on") {
          return (name, handler) => (name === "session_before_compact" ? (takeover.handler = handler) : target.on(name, handler));
        }
        const v = Reflect.get(target, prop);
        return typeof v === "function" ? v.bind(target) : v;
      },
    });
    return factory(view);
  };
}
