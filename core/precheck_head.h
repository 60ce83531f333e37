/*
 * precheck_head.h: the precheck broker's decision on one request head
 * (shared/spec/precheck.md 5.1 rows 0-7), as a pure function: no libuv, no
 * Lua, no allocation. Framing is the shared listener's (http_head.c's
 * sbx__head_scan); only the order of checks and the refusals differ from
 * the sealed broker's. The listener calls it for a precheck listener once a
 * head is complete; fuzz/precheck_fuzz.c calls it with arbitrary bytes.
 */
#ifndef SBX_PRECHECK_HEAD_H
#define SBX_PRECHECK_HEAD_H

#include "http_head.h"

typedef struct sbx__precheck_ctx {
  const sbx__route_t *routes;   /* "/mcp/<server>" for each server of the run */
  size_t nroutes;
  int run_ended;                /* row 5: the run signal has aborted */
  int in_flight;                /* row 6: another call is in flight */
  int exhausted;                /* row 7: no call left in the budget */
} sbx__precheck_ctx_t;

/*
 * Decides rows 0-7 for head[0..len) (one complete head, as for
 * sbx__head_decide). out->step is the row that decided, 8 when accepted
 * (status 0, route, has_length and length filled in). Always fills *out.
 */
void sbx__precheck_head_decide(const char *head, size_t len, const sbx__precheck_ctx_t *ctx,
                               sbx__head_result_t *out);

/* The refusal bodies of rows 5-7 that differ from the sealed broker's. */
#define SBX_BODY_RUN_ENDED      "run ended"
#define SBX_BODY_ONE_AT_A_TIME  "one call at a time"
#define SBX_BODY_BUDGET_OUT     "call budget exhausted"
/* Row 10 (decided in Lua, after acceptance). */
#define SBX_BODY_MCP_REFUSED    "MCP method or tool refused"

#endif
