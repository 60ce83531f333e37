// tiers.js: the worker's compaction tiers (spec/rich-mode.md 15.1), pure
// functions over the persisted branch:
//
//   trigger(contextWindow, reserve, branch, hostEngine) -> tokens | undefined
//        the context size that compacts; undefined means Pi's own threshold
//        (contextWindow - reserve)
//   reserveFor(contextWindow, reserve, branch, hostEngine) -> reserveTokens
//        what the worker sets so Pi compacts at that trigger
//   skipReason(tokensBefore, branch, hostEngine) -> reason | undefined
//        why the host compactor is skipped for Pi's summary
//   newest(branch, hostEngine) -> {left, byHost} | undefined
//        the newest compaction: the estimated size it left behind (its
//        summary plus the kept entries up to it) and whether the host made it
//
// `reserve` is Pi's configured reserveTokens (16,384 by default), never the
// value this module sets.
import { buildSessionContext, estimateTokens } from "@earendil-works/pi-coding-agent";

export const SOFT = 300_000;
export const HARD = 500_000;
export const HEADROOM = 50_000;
export const ABOVE_HARD = "above the hard ceiling";
export const LEFT_ABOVE_HARD = "The extension's last compaction left the context above the hard ceiling";

export function newest(branch, hostEngine) {
  const entries = branch ?? [];
  for (let i = entries.length - 1; i >= 0; i--) {
    const e = entries[i];
    if (e?.type !== "compaction") continue;
    let left = 0;
    for (const m of buildSessionContext(entries.slice(0, i + 1)).messages) left += estimateTokens(m);
    const byHost = hostEngine !== undefined && e.details?.engine === hostEngine;
    return { left, byHost };
  }
  return undefined;
}

export function trigger(contextWindow, reserve, branch, hostEngine) {
  const native = contextWindow - reserve;
  if (native <= SOFT) return undefined;
  const last = newest(branch, hostEngine);
  const left = last?.left ?? 0;
  if (left <= SOFT - HEADROOM) return SOFT;
  if (native <= HARD) return undefined;
  if (last && !last.byHost && left > HARD - HEADROOM) return undefined;
  return HARD;
}

export function reserveFor(contextWindow, reserve, branch, hostEngine) {
  const t = trigger(contextWindow, reserve, branch, hostEngine);
  return t === undefined ? reserve : contextWindow - t;
}

export function skipReason(tokensBefore, branch, hostEngine) {
  if (tokensBefore > HARD) return ABOVE_HARD;
  const last = newest(branch, hostEngine);
  if (last?.byHost && last.left > HARD) return LEFT_ABOVE_HARD;
  return undefined;
}
