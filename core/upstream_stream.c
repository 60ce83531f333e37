/*
 * upstream_stream.c: core.http_stream(opts), a streaming upstream call for
 * rich mode's broker (spec/rich-mode.md 11.3-11.5, 13.1): one request
 * through the broker's own curl multi (upstream.h) under the one curl
 * policy (sbx__curl_harden: no redirect followed, no proxy, no netrc, no
 * cookies, TLS 1.2+ verified, HTTP/1.1, a fresh connection), whose status
 * and headers, then body chunks, reach Lua as they arrive, with
 * backpressure: the listener's drain state drives call:pause()/resume().
 *
 * Delivery. curl's callbacks never call Lua: the write callback appends to
 * a pending buffer (at most PEND_MAX beyond one write) and asks for a
 * `tick`; once something is pending, or the call is paused, it answers
 * CURL_WRITEFUNC_PAUSE, so curl keeps the bytes and stops reading the
 * socket (the upstream's TCP window closes). The tick (a 0 ms timer, a
 * libuv callback) hands Lua the head, then the pending bytes, unpauses
 * curl with curl_easy_pause(CURLPAUSE_CONT) when Lua is not paused (curl
 * may then refill the buffer at once), and, once the transfer finished and
 * nothing is pending, on_done. Order: on_head, on_chunk*, on_done, each
 * exactly as documented, none after cancel(), none inside http_stream.
 *
 * Memory (libuv's rule: a handle's memory is freed in its close callback):
 * the call struct is freed when it is destroyed (finished and delivered, or
 * cancelled), or at the end of the tick that destroyed it; its tick timer is
 * its own allocation, freed in its close callback. The Lua object is a box
 * (aux.h): a collected object lets the call run on (the callbacks are held
 * in the registry).
 *
 * Bounds: response head 64 KiB and 100 fields; body max_bytes (default and
 * at most SBX_STREAM_MAX_RESPONSE_BYTES), counted as curl hands bytes over;
 * a Content-Encoding other than identity ends the call before any body
 * byte (the reflection filter must see plain bytes). Nothing here logs a
 * URL, header, body or curl error text; curl's text goes to Lua only.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "http_head.h"
#include "parts.h"
#include "upstream.h"

#define CALL_MT "sbx.upstream.stream"
#define WHO     "http_stream"

#define US_MAX_URL          8192
#define US_MAX_METHOD       16
#define US_MAX_TIMEOUT_MS   600000
#define US_MAX_SEAM_STRING  4096
#define US_MAX_HEAD_BYTES   65536     /* status lines + header blocks */
#define US_MAX_FIELDS       100
#define US_BUFFER_SIZE      65536     /* CURLOPT_BUFFERSIZE: curl's read size */
#define PEND_MAX            65536     /* pending bytes before curl is paused */

/* Outcome kinds decided by a curl callback; 0 while none. */
enum { US_OK = 1, US_HEAD, US_ENCODING, US_TOO_LARGE, US_TIMEOUT, US_NETWORK };

typedef sbx__hfield_t us_field_t;

typedef struct us_call {
  sbx__up_xfer_t x;          /* first: the multi's link and CURLOPT_PRIVATE */
  sbx__box_t *box;           /* the Lua side, NULL once collected */
  lua_State *L;              /* the loop's thread */
  CURL *easy;
  struct curl_slist *headers, *connect_to;
  char *body;
  uv_timer_t *tick;          /* own allocation; freed in its close callback */
  int head_ref, chunk_ref, done_ref;
  /* the response head */
  long status;               /* the current block's status, 0 before any */
  int in_final, expect_status, head_ready, head_delivered;
  size_t head_used, hb_len;
  char *head_store;          /* the final block's fields, lower-case names */
  us_field_t fields[US_MAX_FIELDS];
  int nfields, total_fields;
  /* the body */
  char *pend;
  size_t plen, pcap, total, max_bytes;
  int curl_paused;           /* a write answered CURL_WRITEFUNC_PAUSE */
  int user_paused;
  /* the end */
  int finished;              /* curl is done with it */
  CURLcode rc;
  int kind;                  /* US_* decided by a callback */
  int depth;                 /* inside tick: a destroy defers the free */
  int dead;                  /* destroyed: no more callbacks */
  char errbuf[CURL_ERROR_SIZE];
} us_call_t;

/* ---- lifetime ----------------------------------------------------------- */

static void tick_closed(uv_handle_t *h) { free(h); }

static void call_free(us_call_t *c) {
  free(c->head_store);
  free(c->pend);
  free(c->body);
  free(c);
}

/* Takes c out of curl and the multi, drops its Lua references and its
 * box; frees it now, or at the end of the tick running (depth > 0). Never
 * calls Lua. L may be NULL only when no reference is held. */
static void call_destroy(lua_State *L, us_call_t *c) {
  if (c->dead) return;
  c->dead = 1;
  sbx__up_unlink(&c->x, c->easy);
  if (c->easy != NULL) curl_easy_cleanup(c->easy);
  c->easy = NULL;
  curl_slist_free_all(c->headers);
  curl_slist_free_all(c->connect_to);
  c->headers = c->connect_to = NULL;
  if (c->tick != NULL) {
    uv_timer_stop(c->tick);
    uv_close((uv_handle_t *)c->tick, tick_closed);
    c->tick = NULL;
  }
  if (L != NULL) {
    sbx__unref(L, &c->head_ref);
    sbx__unref(L, &c->chunk_ref);
    sbx__unref(L, &c->done_ref);
  }
  sbx__box_unbind(c->box);
  c->box = NULL;
  if (c->depth == 0) call_free(c);
}

static void on_tick(uv_timer_t *t);

static void kick(us_call_t *c) {
  if (c->tick != NULL) uv_timer_start(c->tick, on_tick, 0, 0);
}

/* The multi's done function: record, deliver from the tick. The easy handle
 * leaves curl now; the call stays linked, so a state closing before the tick
 * still drops it. */
static void call_done(sbx__up_xfer_t *x, CURLcode rc) {
  us_call_t *c = (us_call_t *)x;
  c->finished = 1;
  c->rc = rc;
  if (c->x.m != NULL && c->x.m->cl != NULL) sbx__curl_loop_remove(c->x.m->cl, c->easy);
  kick(c);
}

static void call_drop(lua_State *L, sbx__up_xfer_t *x) {
  call_destroy(L, (us_call_t *)x);
}

/* ---- curl callbacks (never call Lua) ---------------------------------------- */

/* CURLOPT_HEADERFUNCTION: every line of every block (1xx ones too). */
static size_t on_header(char *p, size_t size, size_t nitems, void *ud) {
  us_call_t *c = ud;
  size_t n = size * nitems;
  int ce = 0;
  if (c->kind != 0) return 0;
  c->head_used += n;
  if (c->head_used > US_MAX_HEAD_BYTES) { c->kind = US_HEAD; return 0; }
  if (c->head_ready) return n;                             /* trailers: counted only */
  if (c->expect_status) {
    long code = n >= 5 && memcmp(p, "HTTP/", 5) == 0 ? sbx__up_parse_status(p, n) : -1;
    if (code < 100 || code > 999) { c->kind = US_HEAD; return 0; }
    c->status = code;
    c->in_final = code >= 200;
    c->expect_status = 0;
    c->nfields = 0;
    c->hb_len = 0;
    return n;
  }
  if (n <= 2 && (n == 0 || p[0] == '\r' || p[0] == '\n')) {  /* the end of a block */
    if (!c->in_final) { c->expect_status = 1; return n; }  /* 1xx: the next block */
    c->head_ready = 1;
    kick(c);
    return n;
  }
  if (++c->total_fields > US_MAX_FIELDS * 2) { c->kind = US_HEAD; return 0; }
  if (!c->in_final) return n;                               /* 1xx fields: counted */
  if (sbx__up_bad_encoding(p, n, &ce)) { c->kind = US_ENCODING; return 0; }
  if (c->nfields >= US_MAX_FIELDS ||
      sbx__http_field(p, n, c->head_store, &c->hb_len, US_MAX_HEAD_BYTES, &c->fields[c->nfields]) != 0) {
    c->kind = US_HEAD;                          /* obs-fold, no name, too large */
    return 0;
  }
  c->nfields++;
  return n;
}

/* CURLOPT_WRITEFUNCTION: body bytes into the pending buffer, or a pause. */
static size_t on_write(char *p, size_t size, size_t nmemb, void *ud) {
  us_call_t *c = ud;
  size_t n = size * nmemb;
  if (c->kind != 0) return 0;
  if (!c->head_ready) { c->kind = US_HEAD; return 0; }
  if (n == 0) return 0;
  if (c->user_paused || (c->plen > 0 && c->plen + n > PEND_MAX)) {
    c->curl_paused = 1;
    return CURL_WRITEFUNC_PAUSE;            /* curl keeps these bytes */
  }
  if (n > c->max_bytes - c->total) { c->kind = US_TOO_LARGE; return 0; }
  if (sbx__reserve(&c->pend, &c->pcap, c->plen, n, PEND_MAX, SIZE_MAX) != 0) {
    c->kind = US_NETWORK;                     /* out of memory */
    return 0;
  }
  memcpy(c->pend + c->plen, p, n);
  c->plen += n;
  c->total += n;
  kick(c);
  return n;
}

/* ---- delivering to Lua (from the tick) --------------------------------------- */

/* Pushes the head's fields as {name = value}, repeats joined with ", ". */
static void push_headers(lua_State *L, const us_call_t *c) {
  int i;
  lua_createtable(L, 0, c->nfields);
  for (i = 0; i < c->nfields; i++) {
    const us_field_t *f = &c->fields[i];
    lua_pushlstring(L, c->head_store + f->name_off, f->name_len);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, c->head_store + f->val_off, f->val_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, c->head_store + f->val_off, f->val_len);
    }
    lua_rawset(L, -3);
  }
}

/* Protected: fn(status, headers). */
static int deliver_head(lua_State *L) {
  const us_call_t *c = lua_touserdata(L, 2);
  lua_pushvalue(L, 1);
  lua_pushinteger(L, (lua_Integer)c->status);
  push_headers(L, c);
  lua_call(L, 2, 0);
  return 0;
}

/* Protected: fn(bytes) with the pending buffer (light userdata 2, 3 = len). */
static int deliver_chunk(lua_State *L) {
  const char *p = lua_touserdata(L, 2);
  size_t n = (size_t)lua_tointeger(L, 3);
  lua_pushvalue(L, 1);
  lua_pushlstring(L, p, n);
  lua_call(L, 1, 0);
  return 0;
}

/* Protected: fn(res) for the finished call. */
static int deliver_done(lua_State *L) {
  us_call_t *c = lua_touserdata(L, 2);
  static const char *const names[] = {
    NULL, NULL, "head", "encoding", "too large", "timeout", "network"};
  int kind = c->kind;
  long os_errno = 0;
  if (kind == 0) {
    if (c->rc == CURLE_OK) kind = c->head_ready ? US_OK : US_NETWORK;
    else if (c->rc == CURLE_OPERATION_TIMEDOUT) kind = US_TIMEOUT;
    else kind = US_NETWORK;
  }
  lua_pushvalue(L, 1);
  lua_createtable(L, 0, 5);
  lua_pushboolean(L, kind == US_OK);
  lua_setfield(L, -2, "ok");
  if (c->head_ready || (c->status >= 200 && kind != US_HEAD)) {
    lua_pushinteger(L, (lua_Integer)c->status);
    lua_setfield(L, -2, "status");
  }
  if (kind == US_OK) {
    lua_pushinteger(L, (lua_Integer)c->total);
    lua_setfield(L, -2, "bytes");
  } else {
    lua_pushstring(L, names[kind]);
    lua_setfield(L, -2, "error");
    if (c->easy != NULL) curl_easy_getinfo(c->easy, CURLINFO_OS_ERRNO, &os_errno);
    if (os_errno > 0) {
      lua_pushstring(L, sbx__errno_name((int)os_errno));
      lua_setfield(L, -2, "code");
    }
    if (c->rc != CURLE_OK && kind != US_HEAD && kind != US_ENCODING && kind != US_TOO_LARGE) {
      lua_pushstring(L, c->errbuf[0] ? c->errbuf : curl_easy_strerror(c->rc));
      lua_setfield(L, -2, "message");
    }
  }
  lua_call(L, 1, 0);
  return 0;
}

/* Calls fn (registry ref) through the protected deliverer with args. */
static void call_lua(us_call_t *c, lua_CFunction deliver, int ref, void *a, lua_Integer b, int nargs) {
  lua_State *L = c->L;
  lua_pushcfunction(L, deliver);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_pushlightuserdata(L, a);
  if (nargs == 3) lua_pushinteger(L, b);
  sbx__pcall(L, nargs);
}

static void on_tick(uv_timer_t *t) {
  us_call_t *c = t->data;
  c->depth++;
  if (c->head_ready && !c->head_delivered) {
    c->head_delivered = 1;
    call_lua(c, deliver_head, c->head_ref, c, 0, 2);
  }
  if (!c->dead && c->head_delivered && c->plen > 0 && !c->user_paused) {
    /* The buffer is handed over: a write curl makes meanwhile gets a new one. */
    char *p = c->pend;
    size_t n = c->plen;
    c->pend = NULL;
    c->plen = c->pcap = 0;
    call_lua(c, deliver_chunk, c->chunk_ref, p, (lua_Integer)n, 3);
    free(p);
  }
  if (!c->dead && !c->finished && c->curl_paused && !c->user_paused && c->plen == 0) {
    CURLcode prc;
    c->curl_paused = 0;
    prc = curl_easy_pause(c->easy, CURLPAUSE_CONT);   /* may write at once: a new tick */
    /* The bytes curl held while paused are written inside curl_easy_pause;
     * a write refusing them (over max_bytes) fails the transfer, but only
     * its return says so: the multi never reports it, and no socket event
     * is left to wake it (the whole body was read). Finish it here. */
    if (!c->dead && !c->finished && (prc != CURLE_OK || c->kind != 0))
      call_done(&c->x, prc != CURLE_OK ? prc : CURLE_WRITE_ERROR);
  }
  /* The end: once every byte was delivered after a success; at once after a
   * failure, paused or not (bytes not yet delivered are dropped: the
   * response is broken anyway). */
  if (!c->dead && c->finished && (c->head_delivered || !c->head_ready) &&
      (c->plen == 0 || c->kind != 0 || c->rc != CURLE_OK)) {
    call_lua(c, deliver_done, c->done_ref, c, 0, 2);
    call_destroy(c->L, c);
  }
  if (--c->depth == 0 && c->dead) call_free(c);
}

/* ---- Lua API ------------------------------------------------------------------ */

#define SET(opt, val) (bad |= curl_easy_setopt(c->easy, opt, val) != CURLE_OK)

static int setup_easy(us_call_t *c, const char *url, const char *method, size_t body_len,
                      int has_body, long timeout_ms, int allow_http, const char *cainfo) {
  int bad = sbx__curl_harden(c->easy, allow_http ? "http,https" : "https", cainfo) != 0;
  SET(CURLOPT_PRIVATE, (char *)&c->x);
  SET(CURLOPT_URL, url);
  SET(CURLOPT_TIMEOUT_MS, timeout_ms);
  SET(CURLOPT_BUFFERSIZE, (long)US_BUFFER_SIZE);
  SET(CURLOPT_ERRORBUFFER, c->errbuf);
  if (strcmp(method, "GET") == 0 && !has_body) {
    SET(CURLOPT_HTTPGET, 1L);
  } else if (strcmp(method, "HEAD") == 0 && !has_body) {
    SET(CURLOPT_NOBODY, 1L);
  } else {
    SET(CURLOPT_POST, 1L);
    SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    SET(CURLOPT_POSTFIELDS, c->body);
    if (strcmp(method, "POST") != 0) SET(CURLOPT_CUSTOMREQUEST, method);
  }
  SET(CURLOPT_HTTPHEADER, c->headers);
  SET(CURLOPT_HEADERFUNCTION, on_header);
  SET(CURLOPT_HEADERDATA, c);
  SET(CURLOPT_WRITEFUNCTION, on_write);
  SET(CURLOPT_WRITEDATA, c);
  if (c->connect_to != NULL) SET(CURLOPT_CONNECT_TO, c->connect_to);
  return bad ? -1 : 0;
}

#undef SET

static void check_fn(lua_State *L, const char *field) {
  if (lua_getfield(L, 1, field) != LUA_TFUNCTION)
    luaL_error(L, WHO ": opts.%s must be a function", field);
  lua_pop(L, 1);
}

/* core.http_stream(opts) -> call | nil, err. See API.md. */
static int l_http_stream(lua_State *L) {
  const char *url, *body, *cainfo, *method;
  size_t url_len = 0, body_len = 0, mlen = 0, i;
  lua_Integer timeout_ms, max_bytes;
  int allow_http;
  sbx__up_multi_t *m;
  us_call_t *c;
  sbx__box_t *b;

  luaL_checktype(L, 1, LUA_TTABLE);
  url = sbx__opt_string_field(L, 1, WHO, "url", US_MAX_URL, &url_len, 0);
  if (url == NULL || url_len == 0) luaL_error(L, WHO ": opts.url is required");
  method = sbx__opt_string_field(L, 1, WHO, "method", US_MAX_METHOD, &mlen, 0);
  if (method == NULL) method = "POST", mlen = 4;
  for (i = 0; i < mlen; i++)
    if (!sbx__http_is_tchar((unsigned char)method[i])) luaL_error(L, WHO ": opts.method must be a token");
  if (mlen == 0) luaL_error(L, WHO ": opts.method must be a token");
  body = sbx__opt_string_field(L, 1, WHO, "body", SBX_STREAM_MAX_BODY_BYTES, &body_len, 1);
  cainfo = sbx__opt_string_field(L, 1, WHO, "cainfo", US_MAX_SEAM_STRING, NULL, 0);
  timeout_ms = sbx__check_integer_field(L, 1, WHO, "timeout_ms", 1, US_MAX_TIMEOUT_MS);
  max_bytes = sbx__opt_integer_field(L, 1, WHO, "max_bytes", SBX_STREAM_MAX_RESPONSE_BYTES, 0,
                                     SBX_STREAM_MAX_RESPONSE_BYTES);
  allow_http = sbx__opt_boolean_field(L, 1, WHO, "allow_http", 0);
  check_fn(L, "on_head");
  check_fn(L, "on_chunk");
  check_fn(L, "on_done");
  sbx__up_check_lists(L, WHO);

  m = sbx__up_multi(L);
  if (m == NULL || m->cl == NULL) {
    lua_pushnil(L);
    lua_pushliteral(L, "upstream client unavailable");
    return 2;
  }
  /* Lua allocations (which may raise) before any C allocation. */
  b = sbx__box_new(L, CALL_MT);
  lua_getfield(L, 1, "on_head");
  lua_getfield(L, 1, "on_chunk");
  lua_getfield(L, 1, "on_done");
  c = calloc(1, sizeof *c);
  if (c == NULL) { lua_pushnil(L); lua_pushliteral(L, "out of memory"); return 2; }
  c->done_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->chunk_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->head_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->L = sbx__loop(L)->L;
  c->max_bytes = (size_t)max_bytes;
  c->expect_status = 1;
  c->x.done = call_done;
  c->x.drop = call_drop;
  c->tick = malloc(sizeof *c->tick);
  c->head_store = malloc(US_MAX_HEAD_BYTES);
  c->body = malloc(body_len > 0 ? body_len : 1);
  if (c->tick == NULL || c->head_store == NULL || c->body == NULL ||
      sbx__up_build_lists(L, &c->headers, &c->connect_to) != 0 ||
      (c->easy = curl_easy_init()) == NULL) {
    free(c->tick);
    c->tick = NULL;
    call_destroy(L, c);
    lua_pushnil(L);
    lua_pushliteral(L, "out of memory");
    return 2;
  }
  uv_timer_init(&m->lp->uv, c->tick);
  c->tick->data = c;
  if (body_len > 0) memcpy(c->body, body, body_len);
  if (setup_easy(c, url, method, body_len, body != NULL, (long)timeout_ms, allow_http, cainfo) != 0 ||
      sbx__curl_loop_add(m->cl, c->easy) != 0) {
    call_destroy(L, c);
    lua_pushnil(L);
    lua_pushliteral(L, "upstream client setup failed");
    return 2;
  }
  sbx__up_link(m, &c->x);
  sbx__box_bind(b, c, &c->box);
  return 1;
}

static us_call_t *check_call(lua_State *L) {
  return sbx__box_check(L, 1, CALL_MT);
}

/* call:pause(): no on_chunk until resume(); curl stops reading. */
static int l_call_pause(lua_State *L) {
  us_call_t *c = check_call(L);
  if (c != NULL) c->user_paused = 1;
  return 0;
}

/* call:resume(): delivery (and the transfer) go on from the next tick. */
static int l_call_resume(lua_State *L) {
  us_call_t *c = check_call(L);
  if (c != NULL && c->user_paused) {
    c->user_paused = 0;
    kick(c);
  }
  return 0;
}

static int l_call_paused(lua_State *L) {
  us_call_t *c = check_call(L);
  lua_pushboolean(L, c != NULL && c->user_paused);
  return 1;
}

/* call:cancel(): aborts; no callback runs after it. Idempotent. */
static int l_call_cancel(lua_State *L) {
  us_call_t *c = sbx__box_detach(luaL_checkudata(L, 1, CALL_MT));
  if (c != NULL) call_destroy(L, c);
  return 0;
}

void sbx__open_upstream_stream(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"pause", l_call_pause}, {"resume", l_call_resume}, {"paused", l_call_paused},
    {"cancel", l_call_cancel}, {NULL, NULL}};
  sbx__class(L, CALL_MT, methods, sbx__box_gc);
  lua_pushcfunction(L, l_http_stream);
  lua_setfield(L, -2, "http_stream");
}
