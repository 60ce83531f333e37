// transport.js: the worker loop over the broker socket (spec/rich-mode.md
// 10.7 step 3), forever:
//   POST /worker/ready (5 s) -> GET /worker/next (55 s; not 200: sleep 250 ms,
//   back to ready) -> parse (96 MiB) and validate the turn -> run it ->
//   (pending compaction reports delivered: 15.2) -> POST /worker/result (60 s).
// Any exception logs "broker poll failed" once until the next success, then
// sleeps 250 ms and continues. The ready body declares both privacy
// capabilities (privateTo projection, reader records: 14.2) and whether the
// retained branch holds any private-memory turn or private exchange.
import * as broker from "./broker.js";
import { validateTurn } from "./turn_input.js";
import { runTurn } from "./turn.js";
import { log, errorText } from "./log.js";
import { safeName } from "./names.js";
import { walk } from "./privacy.js";
import { READY_TIMEOUT_MS, NEXT_TIMEOUT_MS, RESULT_TIMEOUT_MS, RETRY_SLEEP_MS, TURN_BODY_MAX } from "./limits.js";

export function readyBody(state, session) {
  const { privateHistory } = walk(session.sessionManager.getBranch(), state.memoryTools);
  return { capabilities: { privateTo: true, readerRecords: true }, privateHistory };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function postResult(turnId, result) {
  const res = await broker.call("POST", "/worker/result", { body: { turnId, result }, timeoutMs: RESULT_TIMEOUT_MS });
  if (res.status !== 200) throw new Error(`the broker answered ${res.status} for the result`);
}

// once(state, session): one ready/next/run/result round; false when no turn came.
export async function once(state, session) {
  const ready = await broker.call("POST", "/worker/ready", { body: readyBody(state, session), timeoutMs: READY_TIMEOUT_MS });
  if (ready.status !== 200) throw new Error(`the broker answered ${ready.status} for ready`);
  const next = await broker.call("GET", "/worker/next", { timeoutMs: NEXT_TIMEOUT_MS, max: TURN_BODY_MAX });
  if (next.status !== 200) return false;
  const raw = broker.json(next.bytes);
  let turn;
  try {
    turn = validateTurn(raw);
  } catch (err) {
    if (raw && safeName(raw.turnId)) await postResult(raw.turnId, { ok: false, error: err.message });
    return true;
  }
  const result = await runTurn(state, session, turn);
  await state.flushReports?.();               // 15.2: reports stay inside the bound turn
  await postResult(turn.turnId, result);
  return true;
}

export async function loop(state, session) {
  let failing = false;
  for (;;) {
    try {
      const served = await once(state, session);
      failing = false;
      if (!served) await sleep(RETRY_SLEEP_MS);
    } catch (err) {
      if (!failing) log("broker poll failed", { error: errorText(err) });
      failing = true;
      await sleep(RETRY_SLEEP_MS);
    }
  }
}
