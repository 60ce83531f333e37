/*
 * precheck_fuzz.c: libFuzzer harness for the precheck broker's head decision
 * (core/precheck_head.c, shared/spec/precheck.md 5.1 rows 0-7).
 *
 * Input: bytes as a script would send them; the head is found the way the
 * listener finds it and decided under all eight run states (ended, in
 * flight, exhausted). Invariants, checked on every decision:
 *
 *  - status, row and fixed body agree with the table of 5.1; every refusal
 *    carries its audit reason (spec/operations.md 3), and from row 3 on the
 *    route it refused (the audit line names it);
 *  - rows 0-4 do not depend on the run state; with it, 410 comes before
 *    409, which comes before 429;
 *  - against the sealed broker's decision over the same bytes and routes
 *    (core/http_head.c, whose own harness re-reads accepted heads naively):
 *    framing and `invalid URL` agree; a head one accepts the other accepts,
 *    on the same route with the same Content-Length; the sealed broker's
 *    method/query refusal, wrong credential and unknown route are all the
 *    precheck broker's 404.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "precheck_head.h"
#include "bounds.h"

static const sbx__route_t routes[] = {{"/mcp/health", 11}, {"/mcp/google", 11}, {"/mcp/a-b_9", 10}};
#define NROUTES (sizeof routes / sizeof routes[0])

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static int is(const char *a, const char *b) { return a != NULL && strcmp(a, b) == 0; }

static void check_reason(const sbx__head_result_t *r) {
  if (r->status == 0) { CHECK(r->reason == NULL); return; }
  switch (r->step) {
  case 0: CHECK(is(r->reason, "method") || is(r->reason, "header")); break;
  case 1: CHECK(is(r->reason, "unknown_route")); break;
  case 2: CHECK(is(r->reason, "method") || is(r->reason, "credential_header") || is(r->reason, "query")
                || is(r->reason, "unknown_route")); break;
  case 3: case 4: CHECK(is(r->reason, "header") && r->header != NULL); break;
  case 5: CHECK(is(r->reason, "after_turn")); break;
  case 6: CHECK(is(r->reason, "busy")); break;
  case 7: CHECK(is(r->reason, "budget")); break;
  default: abort();
  }
  CHECK(r->step < 3 ? !r->routed : (r->routed && r->route < NROUTES));
}

static void check_table(const sbx__head_result_t *r) {
  check_reason(r);
  switch (r->step) {
  case 0: CHECK(r->status == 400 && strcmp(r->body, SBX_BODY_BAD_REQUEST) == 0); break;
  case 1: CHECK(r->status == 400 && strcmp(r->body, SBX_BODY_INVALID_URL) == 0); break;
  case 2: CHECK(r->status == 404 && strcmp(r->body, SBX_BODY_NOT_FOUND) == 0); break;
  case 3: CHECK(r->status == 403 && strcmp(r->body, SBX_BODY_FORBIDDEN_HDR) == 0); break;
  case 4: CHECK(r->status == 403 && strcmp(r->body, SBX_BODY_FORBIDDEN_HOST) == 0); break;
  case 5: CHECK(r->status == 410 && strcmp(r->body, SBX_BODY_RUN_ENDED) == 0); break;
  case 6: CHECK(r->status == 409 && strcmp(r->body, SBX_BODY_ONE_AT_A_TIME) == 0); break;
  case 7: CHECK(r->status == 429 && strcmp(r->body, SBX_BODY_BUDGET_OUT) == 0); break;
  case 8: CHECK(r->status == 0 && r->body == NULL && r->route < NROUTES); break;
  default: abort();
  }
}

static void decide_all(const char *h, size_t n) {
  sbx__precheck_ctx_t ctx;
  sbx__head_ctx_t bctx;
  sbx__head_result_t r[8], b;
  int s;
  ctx.routes = routes;
  ctx.nroutes = NROUTES;
  for (s = 0; s < 8; s++) {
    ctx.run_ended = s & 1;
    ctx.in_flight = (s >> 1) & 1;
    ctx.exhausted = (s >> 2) & 1;
    sbx__precheck_head_decide(h, n, &ctx, &r[s]);
    check_table(&r[s]);
    if (r[s].status == 0) CHECK(s == 0);
  }
  if (r[0].step <= 4) {
    for (s = 1; s < 8; s++) CHECK(r[s].step == r[0].step);
  } else {
    CHECK(r[0].step == 8);
    for (s = 1; s < 8; s++) CHECK(r[s].step == ((s & 1) ? 5 : (s & 2) ? 6 : 7));
  }

  bctx.routes = routes;
  bctx.nroutes = NROUTES;
  bctx.turn_ended = 0;
  bctx.busy = 0;
  sbx__head_decide(h, n, &bctx, &b);
  CHECK((b.step == 0) == (r[0].step == 0));
  CHECK((b.step == 1) == (r[0].step == 1));
  CHECK((b.status == 0) == (r[0].status == 0));
  if (b.status == 0) {
    CHECK(b.route == r[0].route && b.has_length == r[0].has_length && b.length == r[0].length);
  }
  if (b.step == 2 || b.step == 4 || b.step == 6) CHECK(r[0].step == 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  size_t end = sbx__head_end(buf, size, 0);
  if (end > 0 && end <= SBX_MAX_HEAD_BYTES) decide_all(buf, end);
  if (size <= SBX_MAX_HEAD_BYTES + 1) decide_all(buf, size);
  return 0;
}
