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


/* Row 2's audit reason: which of its causes refused (all answer 404). */
static const char *row2_reason(const sbx__head_facts_t *f) {
  if (!f->is_post) return "method";
  if (f->auth_bad) return "credential_header";
  if (memchr(f->target, '?', f->target_len) != NULL || memchr(f->target, '#', f->target_len) != NULL)
    return "query";
  return "unknown_route";
}

void sbx__precheck_head_decide(const char *head, size_t len, const sbx__precheck_ctx_t *ctx,
                               sbx__head_result_t *out) {
  sbx__head_facts_t f;
  size_t route;

  memset(out, 0, sizeof *out);
  if (sbx__head_scan(head, len, &f) != 0) {                                /* row 0 */
    sbx__head_refuse_why(out, 0, 400, SBX_BODY_BAD_REQUEST, sbx__head_frame_reason(&f, head, len));
    return;
  }
  if (f.bad_url) { sbx__head_refuse_why(out, 1, 400, SBX_BODY_INVALID_URL, "unknown_route"); return; }
  route = ctx != NULL ? sbx__route_find(ctx->routes, ctx->nroutes, f.target, f.target_len) : 0;
  if (ctx == NULL || !f.is_post || route == ctx->nroutes || f.auth_bad) {
    sbx__head_refuse_why(out, 2, 404, SBX_BODY_NOT_FOUND, row2_reason(&f));
    return;
  }
  out->route = route;        /* rows 3-7 refuse a known route */
  out->routed = 1;
  if (f.header_refused) {
    sbx__head_refuse_why(out, 3, 403, SBX_BODY_FORBIDDEN_HDR, "header");
    out->header = f.refused_name;
    out->header_len = f.refused_len;
    return;
  }
  if (!sbx__head_host_ok(&f)) {
    sbx__head_refuse_why(out, 4, 403, SBX_BODY_FORBIDDEN_HOST, "header");
    out->header = "host";
    out->header_len = 4;
    return;
  }
  if (ctx->run_ended) { sbx__head_refuse_why(out, 5, 410, SBX_BODY_RUN_ENDED, "after_turn"); return; }
  if (ctx->in_flight) { sbx__head_refuse_why(out, 6, 409, SBX_BODY_ONE_AT_A_TIME, "busy"); return; }
  if (ctx->exhausted) { sbx__head_refuse_why(out, 7, 429, SBX_BODY_BUDGET_OUT, "budget"); return; }

  sbx__head_accept(out, 8, route, &f);
}
