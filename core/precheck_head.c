/*
 * precheck_head.c: rows 0-7 of the precheck broker's order of checks
 * (shared/spec/precheck.md 5.1) for one complete request head.
 *
 * The framing of row 0 and every fact the later rows read come from the
 * shared listener's scan (http_head.c, sbx__head_scan); this file owns only
 * the order, which differs from the sealed broker's in three ways: a target
 * that is not exactly a route of this run and a wrong Authorization value
 * are both 404 `not found` (row 2, before the header policy, so a script
 * learns nothing about what else the listener would accept); the run having
 * ended is 410 `run ended`; a call in flight (409) and an empty budget (429)
 * are told apart. Rows 8 on (acceptance, body, method, upstream) belong to
 * the listener and to lua/sandbox/precheck/_broker.lua.
 */
#include <string.h>

#include "precheck_head.h"


void sbx__precheck_head_decide(const char *head, size_t len, const sbx__precheck_ctx_t *ctx,
                               sbx__head_result_t *out) {
  sbx__head_facts_t f;
  size_t route;

  memset(out, 0, sizeof *out);
  sbx__head_refuse(out, 0, 400, SBX_BODY_BAD_REQUEST);
  if (sbx__head_scan(head, len, &f) != 0) return;                          /* row 0 */
  if (f.bad_url) { sbx__head_refuse(out, 1, 400, SBX_BODY_INVALID_URL); return; }
  route = ctx != NULL ? sbx__route_find(ctx->routes, ctx->nroutes, f.target, f.target_len) : 0;
  if (ctx == NULL || !f.is_post || route == ctx->nroutes || f.auth_bad) {
    sbx__head_refuse(out, 2, 404, SBX_BODY_NOT_FOUND);
    return;
  }
  if (f.header_refused) { sbx__head_refuse(out, 3, 403, SBX_BODY_FORBIDDEN_HDR); return; }
  if (!sbx__head_host_ok(&f)) { sbx__head_refuse(out, 4, 403, SBX_BODY_FORBIDDEN_HOST); return; }
  if (ctx->run_ended) { sbx__head_refuse(out, 5, 410, SBX_BODY_RUN_ENDED); return; }
  if (ctx->in_flight) { sbx__head_refuse(out, 6, 409, SBX_BODY_ONE_AT_A_TIME); return; }
  if (ctx->exhausted) { sbx__head_refuse(out, 7, 429, SBX_BODY_BUDGET_OUT); return; }

  sbx__head_accept(out, 8, route, &f);
}
