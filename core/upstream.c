/*
 * upstream.c: core.http_post(opts), the broker's only way out (spec/broker.md
 * 7.2, 9.7, 9.8, 11.2, 11.3): one POST over HTTP(S) through libcurl's multi
 * interface, driven by the same libuv loop as everything else.
 *
 * Design
 * - One curl multi handle per loop ("multi"), created on first use and kept
 *   in the Lua registry as a userdata whose __gc tears it down. It is the
 *   broker's own: safe fetch never uses it (and this never uses safe
 *   fetch's). curl_loop.c feeds it from libuv (one uv_poll_t per socket, one
 *   uv_timer_t) and hands finished transfers to finish().
 * - Lua is only ever called from a libuv callback, after curl has returned
 *   (never from inside a curl callback), so a Lua callback may start or
 *   cancel any request, this one included.
 * - A request (up_req_t) is owned by the multi from http_post until it
 *   finishes or is cancelled; then it is removed from the multi and freed at
 *   once. The Lua userdata only points at it; both sides clear the pointer
 *   when they go away, so a collected userdata never frees memory curl still
 *   uses, and a dropped userdata does not stop the request (on_done is held
 *   in the registry). uv handles are freed only in their close callbacks.
 * - on_done(res) runs exactly once, on the next loop turn at the earliest,
 *   and never after request:cancel().
 *
 * Policy: the headers sent are the caller's lines plus Host and
 * Content-Length, nothing else (no User-Agent, Accept, Accept-Encoding,
 * Expect or the form Content-Type libcurl would add). The transfer policy is
 * safe fetch's too (sbx__curl_harden, curl_loop.c): no redirects, no proxy
 * (environment ignored), no netrc, no cookies, no connection reuse (one
 * request, one connection: a POST is never silently retried on a stale
 * connection), no DNS cache, HTTP/1.1 and never HTTP/0.9, TLS 1.2+ verified. The final status line decides: a
 * non-2xx stops the transfer before any body byte is read, 1xx interim
 * responses are skipped. A Content-Encoding other than identity stops it
 * too. The body is read up to max_body bytes; one more stops it.
 * Exception, for the operator log only (spec/providers.md 4): with
 * opts.error_body_max (at most SBX_MAX_ERROR_BODY_BYTES) a non-2xx body is
 * read up to that many bytes (an encoded one not at all) and handed to
 * on_done as res.error_body; the outcome stays "status". The caller extracts
 * its whitelisted tokens and drops it; nothing of it reaches a guest.
 *
 * Nothing here logs a URL, header, body or curl error text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "http_head.h"
#include "parts.h"
#include "upstream.h"

#define MULTI_KEY "sbx.upstream.multi"      /* registry field: the box */
#define MULTI_MT "sbx.upstream.multi_mt"    /* its metatable (a different name:
                                               luaL_newmetatable owns its key) */
#define REQ_MT "sbx.upstream.request"
#define WHO "http_post"

/* Bounds on what a caller may hand us (the caller is host Lua). */
#define UP_MAX_URL           8192
#define UP_MAX_HEADERS       64
#define UP_MAX_HEADER_LINE   8192
#define UP_MAX_REQUEST_BODY  (4 * 1024 * 1024)
#define UP_MAX_BODY_LIMIT    (64 * 1024 * 1024)
#define UP_MAX_TIMEOUT_MS    600000
#define UP_MAX_CONNECT_TO    16
#define UP_MAX_SEAM_STRING   4096
#define UP_BUF_START         16384
#define UP_MAX_CONTENT_TYPE  256        /* res.content_type keeps this much */

/* Outcome kinds; 0 while undecided. */
enum { UP_OK = 1, UP_STATUS, UP_ENCODING, UP_TOO_LARGE, UP_TIMEOUT, UP_NETWORK };

typedef sbx__up_multi_t up_multi_t;
typedef struct up_req up_req_t;


struct up_req {
  sbx__up_xfer_t x;      /* first: the multi's link and CURLOPT_PRIVATE */
  sbx__box_t *box;       /* Lua side, or NULL once collected */
  CURL *easy;
  struct curl_slist *headers, *connect_to;
  char *body;            /* our copy of the request body (POSTFIELDS) */
  char *buf;             /* response body so far */
  size_t len, cap, max_body;
  long status;           /* last status line read; 0 before any */
  int final_seen;        /* a non-1xx status line was read */
  int last_was_ce;       /* previous header line was Content-Encoding */
  char ctype[UP_MAX_CONTENT_TYPE];  /* final response's Content-Type value */
  size_t ctype_len;
  int status_fail;       /* final status outside 2xx whose body is read for the log */
  size_t err_max;        /* opts.error_body_max: 0 = never read a non-2xx body */
  int err;               /* UP_* decided by a curl callback, else 0 */
  int done_ref;          /* on_done in the registry */
  int want_ctype;        /* opts.content_type: report the Content-Type */
  char rid[SBX_UP_MAX_REQUEST_ID];  /* the provider's request id (best name) */
  size_t rid_len;
  int rid_rank;          /* its name's rank, 0 while none */
  long retry_after_ms;   /* the final response's Retry-After, -1 while none */
};

/* What on_done receives; built on the C stack, turned into a table in Lua. */
typedef struct {
  int kind;
  long status;
  const char *body;
  size_t len;
  char ctype[UP_MAX_CONTENT_TYPE];
  size_t ctype_len;
  int want_ctype;
  char rid[SBX_UP_MAX_REQUEST_ID];
  size_t rid_len;
  long retry_after_ms;
  const char *cause;     /* network/timeout: why (sbx__curl_cause), else NULL */
} up_outcome_t;

/* ---- the multi's list ------------------------------------------------ */

void sbx__up_link(sbx__up_multi_t *m, sbx__up_xfer_t *x) {
  x->m = m;
  x->prev = NULL;
  x->next = m->xfers;
  if (m->xfers != NULL) m->xfers->prev = x;
  m->xfers = x;
}

void sbx__up_unlink(sbx__up_xfer_t *x, CURL *easy) {
  sbx__up_multi_t *m = x->m;
  if (m == NULL) return;
  if (x->prev != NULL) x->prev->next = x->next; else m->xfers = x->next;
  if (x->next != NULL) x->next->prev = x->prev;
  x->prev = x->next = NULL;
  x->m = NULL;
  if (easy != NULL && m->cl != NULL) sbx__curl_loop_remove(m->cl, easy);
}

/* ---- request lifetime ------------------------------------------------- */

/* Removes r from curl and frees it; its buffer is handed back when keep_buf
 * is non-NULL. Never calls Lua. L is any thread of the state (for unref). */
static void req_destroy(lua_State *L, up_req_t *r, char **keep_buf) {
  sbx__up_unlink(&r->x, r->easy);
  if (r->easy != NULL) curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  curl_slist_free_all(r->connect_to);
  free(r->body);
  if (keep_buf != NULL) *keep_buf = r->buf; else free(r->buf);
  if (L != NULL) sbx__unref(L, &r->done_ref);
  sbx__box_unbind(r->box);
  free(r);
}

/* Runs inside lua_pcall: (fn, outcome) -> fn(res). */
static int deliver(lua_State *L) {
  const up_outcome_t *o = lua_touserdata(L, 2);
  static const char *const names[] = {
    NULL, NULL, "status", "encoding", "too large", "timeout", "network"};
  lua_pushvalue(L, 1);
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, o->kind == UP_OK);
  lua_setfield(L, -2, "ok");
  if (o->status > 0) {
    lua_pushinteger(L, (lua_Integer)o->status);
    lua_setfield(L, -2, "status");
  }
  if (o->rid_len > 0) {
    lua_pushlstring(L, o->rid, o->rid_len);
    lua_setfield(L, -2, "request_id");
  }
  if (o->retry_after_ms >= 0) {
    lua_pushinteger(L, (lua_Integer)o->retry_after_ms);
    lua_setfield(L, -2, "retry_after_ms");
  }
  if (o->kind == UP_OK) {
    lua_pushlstring(L, o->body != NULL ? o->body : "", o->len);
    lua_setfield(L, -2, "body");
    if (o->want_ctype) {
      lua_pushlstring(L, o->ctype, o->ctype_len);
      lua_setfield(L, -2, "content_type");
    }
  } else {
    lua_pushstring(L, names[o->kind]);
    lua_setfield(L, -2, "error");
    if (o->cause != NULL) {
      lua_pushstring(L, o->cause);
      lua_setfield(L, -2, "cause");
    }
    if (o->kind == UP_STATUS && o->body != NULL && o->len > 0) {
      lua_pushlstring(L, o->body, o->len);
      lua_setfield(L, -2, "error_body");
    }
  }
  lua_call(L, 1, 0);
  return 0;
}

/* One transfer is over: decide its outcome, free it, then call on_done. */
static void finish(up_multi_t *m, up_req_t *r, CURLcode rc) {
  lua_State *L = m->lp->L;
  up_outcome_t o;
  long code = 0;
  char *buf = NULL;
  int ref;
  memset(&o, 0, sizeof o);
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  if (r->status_fail) {
    o.kind = UP_STATUS;              /* however the read of its body ended */
  } else if (r->err != 0) {
    o.kind = r->err;
  } else if (rc == CURLE_OK) {
    if (!r->final_seen || code < 100) o.kind = UP_NETWORK;
    else if (code >= 200 && code <= 299) o.kind = UP_OK;
    else o.kind = UP_STATUS;
  } else if (rc == CURLE_OPERATION_TIMEDOUT) {
    o.kind = UP_TIMEOUT;
  } else {
    o.kind = UP_NETWORK;
  }
  if (r->final_seen) o.status = code > 0 ? code : r->status;
  if (o.kind == UP_NETWORK || o.kind == UP_TIMEOUT) o.cause = sbx__curl_cause(r->easy, rc);
  o.len = r->len;
  memcpy(o.ctype, r->ctype, r->ctype_len);
  o.ctype_len = r->ctype_len;
  o.want_ctype = r->want_ctype;
  memcpy(o.rid, r->rid, r->rid_len);
  o.rid_len = r->rid_len;
  o.retry_after_ms = r->retry_after_ms;
  ref = r->done_ref;
  r->done_ref = LUA_NOREF;
  req_destroy(NULL, r, &buf);
  o.body = buf;
  lua_pushcfunction(L, deliver);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_pushlightuserdata(L, &o);
  sbx__pcall(L, 2);
  free(buf);
}

/* The curl loop's done function: one finished transfer of either kind
 * (curl_loop.c calls it from a libuv callback, one message at a time, so a
 * Lua callback may remove other handles). */
static void up_curl_done(void *priv, CURL *easy, CURLcode rc) {
  sbx__up_xfer_t *x = priv;
  (void)easy;
  x->done(x, rc);
}

static void req_done(sbx__up_xfer_t *x, CURLcode rc) {
  up_req_t *r = (up_req_t *)x;
  finish(r->x.m, r, rc);
}

static void req_drop(lua_State *L, sbx__up_xfer_t *x) {
  req_destroy(L, (up_req_t *)x, NULL);
}

/* ---- curl easy callbacks (never call Lua) ----------------------------- */

static int is_ows(char c) { return c == ' ' || c == '\t'; }

long sbx__up_parse_status(const char *p, size_t n) {
  size_t i = 5;
  long code = 0;
  int k;
  while (i < n && p[i] != ' ') i++;
  while (i < n && p[i] == ' ') i++;
  for (k = 0; k < 3; k++, i++) {
    if (i >= n || p[i] < '0' || p[i] > '9') return -1;
    code = code * 10 + (p[i] - '0');
  }
  if (i < n && p[i] != ' ' && p[i] != '\r' && p[i] != '\n') return -1;
  return code;
}

int sbx__up_bad_encoding(const char *p, size_t n, int *is_ce) {
  const char *colon = memchr(p, ':', n);
  size_t nl, vs, ve;
  *is_ce = 0;
  if (colon == NULL) return 0;
  nl = (size_t)(colon - p);
  while (nl > 0 && is_ows(p[nl - 1])) nl--;
  if (nl != 16 || strncasecmp(p, "content-encoding", 16) != 0) return 0;
  *is_ce = 1;
  vs = (size_t)(colon - p) + 1;
  ve = n;
  while (vs < ve && is_ows(p[vs])) vs++;
  while (ve > vs && (is_ows(p[ve - 1]) || p[ve - 1] == '\r' || p[ve - 1] == '\n')) ve--;
  return !(ve - vs == 8 && strncasecmp(p + vs, "identity", 8) == 0);
}

/* Keeps the trimmed value of a Content-Type line (its first
 * UP_MAX_CONTENT_TYPE bytes; the last one wins). */
static void keep_content_type(up_req_t *r, const char *p, size_t n) {
  const char *colon = memchr(p, ':', n);
  size_t nl, vs, ve;
  if (colon == NULL) return;
  nl = (size_t)(colon - p);
  while (nl > 0 && is_ows(p[nl - 1])) nl--;
  if (nl != 12 || strncasecmp(p, "content-type", 12) != 0) return;
  vs = (size_t)(colon - p) + 1;
  ve = n;
  while (vs < ve && is_ows(p[vs])) vs++;
  while (ve > vs && (is_ows(p[ve - 1]) || p[ve - 1] == '\r' || p[ve - 1] == '\n')) ve--;
  r->ctype_len = ve - vs < sizeof r->ctype ? ve - vs : sizeof r->ctype;
  memcpy(r->ctype, p + vs, r->ctype_len);
}

int sbx__up_request_id(const char *p, size_t n, size_t *vs_out, size_t *vn_out) {
  static const char *const names[] = {SBX_UP_REQUEST_ID_NAMES};
  const char *colon = memchr(p, ':', n);
  size_t nl, vs, ve, i, k;
  if (colon == NULL) return 0;
  nl = (size_t)(colon - p);
  while (nl > 0 && is_ows(p[nl - 1])) nl--;
  vs = (size_t)(colon - p) + 1;
  ve = n;
  while (vs < ve && is_ows(p[vs])) vs++;
  while (ve > vs && (is_ows(p[ve - 1]) || p[ve - 1] == '\r' || p[ve - 1] == '\n')) ve--;
  if (ve == vs || ve - vs > SBX_UP_MAX_REQUEST_ID) return 0;
  for (k = vs; k < ve; k++) {
    unsigned char c = (unsigned char)p[k];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == ':' || c == '-'))
      return 0;
  }
  for (i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strlen(names[i]) == nl && strncasecmp(p, names[i], nl) == 0) {
      *vs_out = vs;
      *vn_out = ve - vs;
      return (int)i + 1;
    }
  }
  return 0;
}

long sbx__up_retry_after(const char *p, size_t n, time_t now) {
  const char *colon = memchr(p, ':', n);
  size_t nl, vs, ve, k;
  char value[64];
  long secs = 0;
  time_t when;
  if (colon == NULL) return -1;
  nl = (size_t)(colon - p);
  while (nl > 0 && is_ows(p[nl - 1])) nl--;
  if (nl != 11 || strncasecmp(p, "retry-after", 11) != 0) return -1;
  vs = (size_t)(colon - p) + 1;
  ve = n;
  while (vs < ve && is_ows(p[vs])) vs++;
  while (ve > vs && (is_ows(p[ve - 1]) || p[ve - 1] == '\r' || p[ve - 1] == '\n')) ve--;
  if (ve == vs || ve - vs >= sizeof value) return -1;
  for (k = vs; k < ve && p[k] >= '0' && p[k] <= '9'; k++) {
    if (secs <= SBX_UP_MAX_RETRY_AFTER_MS / 1000) secs = secs * 10 + (p[k] - '0');
  }
  if (k == ve) {                                         /* delta-seconds */
    if (secs > SBX_UP_MAX_RETRY_AFTER_MS / 1000) return SBX_UP_MAX_RETRY_AFTER_MS;
    return secs * 1000;
  }
  memcpy(value, p + vs, ve - vs);                        /* an HTTP-date */
  value[ve - vs] = '\0';
  when = curl_getdate(value, NULL);
  if (when == (time_t)-1) return -1;
  if (when <= now) return 0;
  if (when - now > SBX_UP_MAX_RETRY_AFTER_MS / 1000) return SBX_UP_MAX_RETRY_AFTER_MS;
  return (long)(when - now) * 1000;
}

/* Keeps the best-ranked request id of the final response. */
static void keep_request_id(up_req_t *r, const char *p, size_t n) {
  size_t vs, vn;
  int rank = sbx__up_request_id(p, n, &vs, &vn);
  if (rank == 0 || (r->rid_rank != 0 && rank >= r->rid_rank)) return;
  memcpy(r->rid, p + vs, vn);
  r->rid_len = vn;
  r->rid_rank = rank;
}

/* CURLOPT_HEADERFUNCTION: sees every header line of every response of the
 * transfer (interim 1xx ones too). Returning less than n aborts. */
static size_t on_header(char *p, size_t size, size_t nitems, void *ud) {
  up_req_t *r = ud;
  size_t n = size * nitems;
  int is_ce = 0;
  if (r->err != 0) return 0;
  if (n >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    long code = sbx__up_parse_status(p, n);
    r->last_was_ce = 0;
    if (code < 100) { r->err = UP_NETWORK; return 0; }
    r->status = code;
    if (code < 200) return n;              /* interim: wait for the final one */
    r->final_seen = 1;
    if (code > 299) {
      if (r->err_max == 0) { r->err = UP_STATUS; return 0; }   /* body never read */
      r->status_fail = 1;                  /* its body is read for the log */
    }
    return n;
  }
  if (!r->final_seen) return n;            /* a 1xx response's own headers */
  if (n > 0 && is_ows(p[0])) {             /* obs-fold continuation */
    if (r->last_was_ce) { r->err = r->status_fail ? UP_STATUS : UP_ENCODING; return 0; }
    return n;
  }
  if (sbx__up_bad_encoding(p, n, &is_ce)) { r->err = r->status_fail ? UP_STATUS : UP_ENCODING; return 0; }
  r->last_was_ce = is_ce;
  keep_content_type(r, p, n);
  keep_request_id(r, p, n);
  {
    long ra = sbx__up_retry_after(p, n, time(NULL));
    if (ra >= 0) r->retry_after_ms = ra;
  }
  return n;                                /* every other header: discarded */
}

/* CURLOPT_WRITEFUNCTION: the body of a final 2xx, bounded by max_body. */
static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
  up_req_t *r = ud;
  size_t n = size * nmemb;
  if (r->err != 0 || !r->final_seen) { if (r->err == 0) r->err = UP_NETWORK; return 0; }
  if (n == 0) return 0;
  if (r->status_fail) {
    /* A non-2xx body, kept up to err_max bytes, then the transfer stops. */
    size_t keep = n < r->err_max - r->len ? n : r->err_max - r->len;
    if (r->buf == NULL) {
      r->buf = malloc(r->err_max);
      if (r->buf == NULL) { r->err = UP_STATUS; return 0; }
      r->cap = r->err_max;
    }
    memcpy(r->buf + r->len, p, keep);
    r->len += keep;
    if (r->len >= r->err_max) { r->err = UP_STATUS; return 0; }
    return n;
  }
  if (n > r->max_body - r->len) { r->err = UP_TOO_LARGE; return 0; }
  if (sbx__reserve(&r->buf, &r->cap, r->len, n, UP_BUF_START, r->max_body) != 0) {
    r->err = UP_NETWORK;                      /* out of memory */
    return 0;
  }
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  return n;
}

/* ---- the multi, one per loop ------------------------------------------ */

/* Tears the multi down without calling Lua: in-flight transfers are dropped
 * (no callback of theirs runs: the state is going away). */
static int multi_gc(lua_State *L) {
  up_multi_t *m = sbx__box_detach(luaL_checkudata(L, 1, MULTI_MT));
  if (m == NULL) return 0;
  while (m->xfers != NULL) m->xfers->drop(L, m->xfers);
  sbx__curl_loop_close(m->cl);       /* freed in its close callbacks */
  free(m);
  return 0;
}

sbx__up_multi_t *sbx__up_multi(lua_State *L) {
  sbx__box_t *b;
  up_multi_t *m;
  sbx__loop_t *lp;
  if (lua_getfield(L, LUA_REGISTRYINDEX, MULTI_KEY) == LUA_TUSERDATA) {
    b = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return b->obj;
  }
  lua_pop(L, 1);
  if (sbx__curl_global() != 0) return NULL;
  lp = sbx__loop(L);
  /* The box first: a Lua allocation may raise, and nothing is owned yet. */
  if (luaL_newmetatable(L, MULTI_MT)) {
    lua_pushcfunction(L, multi_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  b = sbx__box_new(L, MULTI_MT);
  m = calloc(1, sizeof *m);
  if (m == NULL) { lua_pop(L, 1); return NULL; }
  m->lp = lp;
  m->cl = sbx__curl_loop_new(&lp->uv, up_curl_done);
  if (m->cl == NULL) { free(m); lua_pop(L, 1); return NULL; }
  sbx__box_bind(b, m, NULL);        /* the box owns the multi */
  /* May raise (the registry grows); m is owned by b by then, whose __gc
   * frees it. */
  lua_setfield(L, LUA_REGISTRYINDEX, MULTI_KEY);
  return m;
}

/* ---- argument checks (programming errors raise) ----------------------- */

/* "Name: value": token name, non-empty value of HTAB/SP/VCHAR/obs-text.
 * Framing headers are the client's own and refused. Returns the name
 * length, or raises. */
static size_t check_header_line(lua_State *L, const char *who, const char *s, size_t n) {
  static const char *const framing[] = {
    "host", "content-length", "transfer-encoding", "expect", "connection", NULL};
  size_t i = 0, k;
  int has_value = 0;
  while (i < n && sbx__http_is_tchar((unsigned char)s[i])) i++;
  if (i == 0 || i >= n || s[i] != ':')
    luaL_error(L, "%s: header lines must be 'Name: value'", who);
  for (k = 0; framing[k] != NULL; k++)
    if (strlen(framing[k]) == i && strncasecmp(s, framing[k], i) == 0)
      luaL_error(L, "%s: the %s header is set by the client", who, framing[k]);
  for (k = i + 1; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    if (c != '\t' && (c < 0x20 || c == 0x7f))
      luaL_error(L, "%s: header value holds a control character", who);
    if (c != ' ' && c != '\t') has_value = 1;
  }
  if (!has_value) luaL_error(L, "%s: header lines must be 'Name: value'", who);
  return i;
}

void sbx__up_check_lists(lua_State *L, const char *who) {
  lua_Integer i, n = 0;
  int t = lua_getfield(L, 1, "headers");
  if (t != LUA_TNIL && t != LUA_TTABLE) luaL_error(L, "%s: opts.headers must be an array", who);
  if (t == LUA_TTABLE) n = (lua_Integer)lua_rawlen(L, -1);
  if (n > UP_MAX_HEADERS) luaL_error(L, "%s: too many header lines", who);
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING) luaL_error(L, "%s: header lines must be strings", who);
    s = lua_tolstring(L, -1, &len);
    if (len > UP_MAX_HEADER_LINE) luaL_error(L, "%s: header line too long", who);
    check_header_line(L, who, s, len);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  t = lua_getfield(L, 1, "connect_to");
  n = 0;
  if (t != LUA_TNIL && t != LUA_TTABLE) luaL_error(L, "%s: opts.connect_to must be an array", who);
  if (t == LUA_TTABLE) n = (lua_Integer)lua_rawlen(L, -1);
  if (n > UP_MAX_CONNECT_TO) luaL_error(L, "%s: too many connect_to entries", who);
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING) luaL_error(L, "%s: connect_to entries must be strings", who);
    s = lua_tolstring(L, -1, &len);
    if (len == 0 || len > UP_MAX_SEAM_STRING || memchr(s, '\0', len) != NULL)
      luaL_error(L, "%s: bad connect_to entry", who);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* Appends to *list, or returns -1 (out of memory). */
static int slist_add(struct curl_slist **list, const char *s) {
  struct curl_slist *nl = curl_slist_append(*list, s);
  if (nl == NULL) return -1;
  *list = nl;
  return 0;
}

/* Lua strings are NUL-terminated and were checked NUL-free. */
int sbx__up_build_lists(lua_State *L, struct curl_slist **headers, struct curl_slist **connect_to) {
  int has_accept = 0, has_type = 0, rc = 0;
  lua_Integer i, n = 0;
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) n = (lua_Integer)lua_rawlen(L, -1);
  for (i = 1; i <= n && rc == 0; i++) {
    const char *s;
    lua_rawgeti(L, -1, i);
    s = lua_tostring(L, -1);
    if (strncasecmp(s, "accept:", 7) == 0) has_accept = 1;
    if (strncasecmp(s, "content-type:", 13) == 0) has_type = 1;
    rc = slist_add(headers, s);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (rc == 0 && !has_accept) rc = slist_add(headers, "Accept:");
  if (rc == 0 && !has_type) rc = slist_add(headers, "Content-Type:");
  if (rc == 0) rc = slist_add(headers, "Expect:");
  n = 0;
  if (lua_getfield(L, 1, "connect_to") == LUA_TTABLE) n = (lua_Integer)lua_rawlen(L, -1);
  for (i = 1; i <= n && rc == 0; i++) {
    lua_rawgeti(L, -1, i);
    rc = slist_add(connect_to, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return rc;
}

/* ---- Lua API ---------------------------------------------------------- */

#define SET(opt, val) (bad |= curl_easy_setopt(r->easy, opt, val) != CURLE_OK)

/* The shared policy (curl_loop.c, sbx__curl_harden: https only unless
 * allow_http) and this transfer's own options; returns 0, or -1 when curl
 * refused one (every option here is policy, so none may be skipped). */
static int setup_easy(up_req_t *r, const char *url, size_t body_len, long timeout_ms,
                      int allow_http, const char *cainfo) {
  int bad = sbx__curl_harden(r->easy, allow_http ? "http,https" : "https", cainfo) != 0;
  SET(CURLOPT_PRIVATE, (char *)r);
  SET(CURLOPT_URL, url);
  SET(CURLOPT_TIMEOUT_MS, timeout_ms);
  SET(CURLOPT_POST, 1L);
  SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  SET(CURLOPT_POSTFIELDS, r->body);
  SET(CURLOPT_HTTPHEADER, r->headers);
  SET(CURLOPT_HEADERFUNCTION, on_header);
  SET(CURLOPT_HEADERDATA, r);
  SET(CURLOPT_WRITEFUNCTION, on_body);
  SET(CURLOPT_WRITEDATA, r);
  if (r->connect_to != NULL) SET(CURLOPT_CONNECT_TO, r->connect_to);
  return bad ? -1 : 0;
}

#undef SET

static int fail(lua_State *L, up_req_t *r, const char *msg) {
  if (r != NULL) {
    if (r->easy != NULL) curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->headers);
    curl_slist_free_all(r->connect_to);
    free(r->body);
    sbx__unref(L, &r->done_ref);
    free(r);
  }
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* core.http_post(opts) -> request | nil, err. See API.md. Malformed opts
 * raise before anything is allocated; a failure after that (out of memory,
 * curl refusing a policy option) frees what was built and returns nil, err
 * (fail() leaves the unused request userdata to the collector). */
static int l_http_post(lua_State *L) {
  const char *url, *body, *cainfo;
  size_t url_len = 0, body_len = 0;
  lua_Integer timeout_ms, max_body, err_max;
  int allow_http, want_ctype, ref;
  up_multi_t *m;
  up_req_t *r;
  sbx__box_t *b;

  luaL_checktype(L, 1, LUA_TTABLE);
  url = sbx__opt_string_field(L, 1, WHO, "url", UP_MAX_URL, &url_len, 0);
  if (url == NULL || url_len == 0) luaL_error(L, "http_post: opts.url is required");
  body = sbx__opt_string_field(L, 1, WHO, "body", UP_MAX_REQUEST_BODY, &body_len, 1);
  cainfo = sbx__opt_string_field(L, 1, WHO, "cainfo", UP_MAX_SEAM_STRING, NULL, 0);
  timeout_ms = sbx__check_integer_field(L, 1, WHO, "timeout_ms", 1, UP_MAX_TIMEOUT_MS);
  max_body = sbx__opt_integer_field(L, 1, WHO, "max_body", SBX_MAX_UPSTREAM_BYTES, 0, UP_MAX_BODY_LIMIT);
  err_max = sbx__opt_integer_field(L, 1, WHO, "error_body_max", 0, 0, SBX_MAX_ERROR_BODY_BYTES);
  allow_http = sbx__opt_boolean_field(L, 1, WHO, "allow_http", 0);
  want_ctype = sbx__opt_boolean_field(L, 1, WHO, "content_type", 0);
  if (lua_getfield(L, 1, "on_done") != LUA_TFUNCTION)
    luaL_error(L, "http_post: opts.on_done must be a function");
  lua_pop(L, 1);
  sbx__up_check_lists(L, WHO);

  m = sbx__up_multi(L);
  if (m == NULL || m->cl == NULL) return fail(L, NULL, "upstream client unavailable");
  /* Lua allocations (which may raise) before any C allocation. */
  b = sbx__box_new(L, REQ_MT);
  lua_getfield(L, 1, "on_done");
  ref = luaL_ref(L, LUA_REGISTRYINDEX);
  r = calloc(1, sizeof *r);
  if (r == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return fail(L, NULL, "out of memory");
  }
  r->done_ref = ref;
  r->x.done = req_done;
  r->x.drop = req_drop;
  r->max_body = (size_t)max_body;
  r->want_ctype = want_ctype;
  r->retry_after_ms = -1;
  r->err_max = (size_t)err_max;
  if (sbx__up_build_lists(L, &r->headers, &r->connect_to) != 0) return fail(L, r, "out of memory");
  r->body = malloc(body_len > 0 ? body_len : 1);
  if (r->body == NULL) return fail(L, r, "out of memory");
  if (body_len > 0) memcpy(r->body, body, body_len);
  r->easy = curl_easy_init();
  if (r->easy == NULL) return fail(L, r, "out of memory");
  if (setup_easy(r, url, body_len, (long)timeout_ms, allow_http, cainfo) != 0)
    return fail(L, r, "upstream client setup failed");
  if (sbx__curl_loop_add(m->cl, r->easy) != 0)
    return fail(L, r, "upstream client setup failed");
  sbx__up_link(m, &r->x);
  sbx__box_bind(b, r, &r->box);
  return 1;
}

/* request:cancel(): aborts the transfer; on_done will not run. Idempotent,
 * safe from any callback (curl is never on the stack when Lua runs). */
static int req_cancel(lua_State *L) {
  up_req_t *r = sbx__box_detach(luaL_checkudata(L, 1, REQ_MT));
  if (r != NULL) req_destroy(L, r, NULL);
  return 0;
}

void sbx__open_upstream(lua_State *L) {
  static const luaL_Reg methods[] = {{"cancel", req_cancel}, {NULL, NULL}};
  /* A collected request object lets the transfer run on (on_done is held
   * in the registry); it only forgets the link. */
  sbx__class(L, REQ_MT, methods, sbx__box_gc);
  lua_pushcfunction(L, l_http_post);
  lua_setfield(L, -2, "http_post");
}
