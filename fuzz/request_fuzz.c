/*
 * request_fuzz.c: libFuzzer harness for the broker's head decision
 * (core/http_head.c, spec/broker.md section 5 steps 0-8).
 *
 * Input: bytes as a client would send them. The head is found the way the
 * listener finds it (sbx__head_end, also resumed at the first split points)
 * and decided under all four turn states (ended or not, busy or not); the
 * whole input is decided too, as a head that may be malformed. Invariants checked on every decision, against a deliberately
 * naive re-reading of the bytes written here:
 *
 *  - the status, step and fixed body agree with the table of section 5;
 *  - steps 0-6 do not depend on the turn state; with it, an accepted head
 *    becomes 410 (turn ended) before 429 (busy);
 *  - an accepted head: request line exactly `POST <route> HTTP/1.x` with a
 *    configured route, CRLF line endings, no folding, only permitted header
 *    names, none twice, Host exactly `broker`, Authorization absent or the
 *    dummy, and the reported Content-Length equal to the header's digits;
 *  - the stream listener's framing (sbx__head_frame, rich-mode.md 8) frames
 *    exactly the heads the sealed scan frames; its lines, re-read naively,
 *    are the head's lines in order (name as sent, value trimmed, inside the
 *    head when not empty), its repeated-name flag is a naive case-insensitive comparison,
 *    and its method/target/version are the request line's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http_head.h"
#include "bounds.h"

static const sbx__route_t routes[] = {
  {"/model", 6}, {"/tools/clock", 12}, {"/tools/bash", 11}, {"/mcp/public", 11}};
#define NROUTES (sizeof routes / sizeof routes[0])

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

static int ieq(const char *s, size_t n, const char *w) {
  size_t i;
  if (strlen(w) != n) return 0;
  for (i = 0; i < n; i++) if (lower((unsigned char)s[i]) != w[i]) return 0;
  return 1;
}

static int eq(const char *s, size_t n, const char *w) {
  return strlen(w) == n && memcmp(s, w, n) == 0;
}

static void check_table(const sbx__head_result_t *r) {
  switch (r->step) {
  case 0: CHECK(r->status == 400 && strcmp(r->body, SBX_BODY_BAD_REQUEST) == 0); break;
  case 1: CHECK(r->status == 400 && strcmp(r->body, SBX_BODY_INVALID_URL) == 0); break;
  case 2: CHECK(r->status == 404 && strcmp(r->body, SBX_BODY_NOT_FOUND) == 0); break;
  case 3: CHECK(r->status == 403 && strcmp(r->body, SBX_BODY_FORBIDDEN_HDR) == 0); break;
  case 4: CHECK(r->status == 403 && strcmp(r->body, SBX_BODY_FORBIDDEN_CRED) == 0); break;
  case 5: CHECK(r->status == 403 && strcmp(r->body, SBX_BODY_FORBIDDEN_HOST) == 0); break;
  case 6: CHECK(r->status == 404 && strcmp(r->body, SBX_BODY_NOT_FOUND) == 0); break;
  case 7: CHECK(r->status == 410 && strcmp(r->body, SBX_BODY_TURN_ENDED) == 0); break;
  case 8: CHECK(r->status == 429 && strcmp(r->body, SBX_BODY_BUSY) == 0); break;
  case 9: CHECK(r->status == 0 && r->body == NULL && r->route < NROUTES); break;
  default: abort();
  }
}

/* Naive re-reading of an accepted head; aborts on any disagreement. */
static void check_accepted(const char *h, size_t n, const sbx__head_result_t *r) {
  const char *p = h, *end = h + n, *eol, *sp;
  const char *permitted[] = {"host", "content-type", "content-length", "accept",
                             "accept-encoding", "authorization", "user-agent"};
  int seen[7] = {0}, host_ok = 0, i;
  size_t k;

  CHECK(n >= 4 && memcmp(end - 4, "\r\n\r\n", 4) == 0);
  for (k = 0; k < n; k++) {
    if (h[k] == '\n') CHECK(k > 0 && h[k - 1] == '\r');
    if (h[k] == '\r') CHECK(k + 1 < n && h[k + 1] == '\n');
  }
  eol = memchr(p, '\r', n);
  CHECK(eol != NULL);
  CHECK((size_t)(eol - p) > 5 && memcmp(p, "POST ", 5) == 0);
  sp = memchr(p + 5, ' ', (size_t)(eol - p - 5));
  CHECK(sp != NULL);
  CHECK(routes[r->route].len == (size_t)(sp - p - 5) &&
        memcmp(routes[r->route].s, p + 5, routes[r->route].len) == 0);
  CHECK(eq(sp + 1, (size_t)(eol - sp - 1), "HTTP/1.1") || eq(sp + 1, (size_t)(eol - sp - 1), "HTTP/1.0"));

  for (p = eol + 2; p < end - 2; p = eol + 2) {
    const char *colon, *v, *ve;
    size_t nl;
    eol = memchr(p, '\r', (size_t)(end - p));
    CHECK(eol != NULL && eol > p);
    CHECK(*p != ' ' && *p != '\t');                     /* no folding */
    colon = memchr(p, ':', (size_t)(eol - p));
    CHECK(colon != NULL);
    nl = (size_t)(colon - p);
    for (i = 0; i < 7; i++) if (ieq(p, nl, permitted[i])) break;
    CHECK(i < 7);                                       /* permitted only */
    CHECK(!seen[i]);                                    /* never twice */
    seen[i] = 1;
    for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++) {}
    for (ve = eol; ve > v && (ve[-1] == ' ' || ve[-1] == '\t'); ve--) {}
    if (i == 0) host_ok = eq(v, (size_t)(ve - v), SBX_BROKER_HOST);
    if (i == 5) CHECK(eq(v, (size_t)(ve - v), SBX_DUMMY_AUTHORIZATION));
    if (i == 2) {
      uint64_t cl = 0;
      int over = 0;
      CHECK(ve > v);
      for (; v < ve; v++) {
        CHECK(*v >= '0' && *v <= '9');
        over |= __builtin_mul_overflow(cl, 10, &cl);
        over |= __builtin_add_overflow(cl, (uint64_t)(*v - '0'), &cl);
      }
      CHECK(r->has_length && r->length == (over ? UINT64_MAX : cl));
    }
  }
  CHECK(host_ok);
  CHECK(seen[2] == r->has_length);
}

/* The stream framing of h[0..n), against the scan and a naive re-reading. */
static void check_frame(const char *h, size_t n) {
  static sbx__head_req_t rq;
  sbx__head_facts_t f;
  const char *p, *eol, *end = h + n;
  size_t i, j, line = 0;
  int framed = sbx__head_frame(h, n, &rq) == 0, repeated = 0;
  CHECK(framed == (sbx__head_scan(h, n, &f) == 0));
  if (!framed) return;
  CHECK(rq.method == h && rq.mlen > 0 && rq.method[rq.mlen] == ' ');
  CHECK(rq.target == h + rq.mlen + 1 && rq.target == f.target && rq.tlen == f.target_len);
  CHECK(memcmp(rq.target + rq.tlen, rq.minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n", 11) == 0);
  CHECK(rq.bad_url == f.bad_url && rq.has_length == f.has_length && rq.length == f.length);
  CHECK(rq.nfields <= SBX_MAX_HEAD_FIELDS && rq.nfields <= rq.total);
  CHECK(rq.total <= SBX_MAX_HEAD_FIELDS || rq.nfields == SBX_MAX_HEAD_FIELDS);
  for (p = memchr(h, '\n', n) + 1; p < end - 2; p = eol + 2, line++) {
    const char *colon, *v, *ve;
    eol = memchr(p, '\r', (size_t)(end - p));
    colon = memchr(p, ':', (size_t)(eol - p));
    CHECK(colon != NULL);
    for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++) {}
    for (ve = eol; ve > v && (ve[-1] == ' ' || ve[-1] == '\t'); ve--) {}
    if (line >= rq.nfields) continue;
    CHECK(rq.fields[line].name == p && rq.fields[line].nlen == (size_t)(colon - p));
    CHECK(rq.fields[line].vlen == (size_t)(ve - v));
    CHECK(rq.fields[line].vlen == 0 || rq.fields[line].value == v);
  }
  CHECK(line == rq.total);
  for (i = 0; i < rq.nfields; i++)
    for (j = 0; j < i; j++) {
      size_t k, nl = rq.fields[i].nlen;
      if (rq.fields[j].nlen != nl) continue;
      for (k = 0; k < nl && lower((unsigned char)rq.fields[i].name[k]) ==
                            lower((unsigned char)rq.fields[j].name[k]); k++) {}
      if (k == nl) repeated = 1;
    }
  CHECK(repeated == rq.repeated);
}

static void decide_all(const char *h, size_t n) {
  sbx__head_ctx_t ctx;
  sbx__head_result_t r[4];
  int s;
  ctx.routes = routes;
  ctx.nroutes = NROUTES;
  for (s = 0; s < 4; s++) {
    ctx.turn_ended = s & 1;
    ctx.busy = (s >> 1) & 1;
    sbx__head_decide(h, n, &ctx, &r[s]);
    check_table(&r[s]);
    if (r[s].status == 0) {
      CHECK(!ctx.turn_ended && !ctx.busy);
      check_accepted(h, n, &r[s]);
    }
  }
  /* Steps 0-6 ignore the turn state; 7 comes before 8. */
  if (r[0].step <= 6) {
    for (s = 1; s < 4; s++) CHECK(r[s].step == r[0].step);
  } else {
    CHECK(r[0].step == 9);
    CHECK(r[1].step == 7 && r[3].step == 7 && r[2].step == 8);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  size_t n = size, end, k;

  end = sbx__head_end(buf, n, 0);
  /* Resuming the scan at any earlier length finds the same end. */
  for (k = 0; k <= n && k < 64; k++) {
    size_t first = sbx__head_end(buf, k, 0);
    if (first == 0) CHECK(sbx__head_end(buf, n, k) == end);
    else CHECK(first == end);
  }
  if (end > 0 && end <= SBX_MAX_HEAD_BYTES) { decide_all(buf, end); check_frame(buf, end); }
  if (n <= SBX_MAX_HEAD_BYTES + 1) { decide_all(buf, n); check_frame(buf, n); }
  return 0;
}
