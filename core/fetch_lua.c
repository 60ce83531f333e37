/*
 * fetch_lua.c: the Lua binding of the safe-fetch C API (sbx_fetch.h), what
 * lua/sandbox/fetch.lua builds on:
 *
 *   core.fetch_start(url, opts, on_done)        -> call | nil, err
 *   core.assert_url_start(url, opts, on_done)   -> call | nil, err
 *   core.fetch_opts_check(opts, check)          -> nil | err
 *   call:cancel()                               on_done never runs
 *   core.fetch_attempt(opts)                    -> attempt | nil, err: one GET
 *                                               pinned to one vetted address
 *                                               (fetch_attempt.c), what
 *                                               fetch.pinned_transport uses
 *
 * opts carries the 1.3 option names (maxBytes, timeoutMs, idleTimeoutMs,
 * maxRedirects, followRedirects, headers, cainfo) converted here without
 * judging them: the C entry points validate every bound and header. A
 * non-number becomes NaN, a followRedirects that is not a boolean becomes 2,
 * a header entry that is not string -> string a NULL name: each is refused
 * by C with the same catalogue code as for any other caller.
 *
 * opts.resolve / opts.transport / opts.localAddresses are Lua trampolines
 * (fetch.lua builds them around the host's seams): trampoline(reply, ...),
 * called from a loop callback; the reply userdata answers once with
 * reply:answers(list), reply:locals(list), reply:result(tbl, url) or
 * reply:fail(errno_name, after_response, message). A reply collected
 * unanswered is released. A trampoline that raises fails its reply.
 *
 * on_done(res, err): res is { url, status, statusText, headers, data,
 * location_count } or { seam_token = true } (the transport seam's own table
 * is the result); err is { code, name, message, errno, afterResponse,
 * status, headers, from_seam }. The result and error never hold raw
 * pointers.
 */
#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_internal.h"
#include "netaddr.h"
#include "loop.h"
#include "parts.h"

#define CALL_MT  "sbx.fetch.call"
#define REPLY_MT "sbx.fetch.reply"
#define ATT_MT   "sbx.fetch.attempt"
#define ATT_WHO  "fetch_attempt"
#define ATT_MAX_URL 8192

enum { SEAM_RESOLVE, SEAM_TRANSPORT, SEAM_LOCAL, SEAM_N };

/* A call's Lua object is a box (aux.h) linked both ways; a reply's Lua
 * object is a box owning the reply until it answers (or is collected). */
typedef struct {
  sbx_fetch_t *f;
  sbx__loop_t *lp;
  int done_ref;
  int seam_ref[SEAM_N];
  int cancelling;
  sbx__box_t *box;
} lf_call_t;

/* ---- options ---------------------------------------------------------- */

static double num_field(lua_State *L, int idx, const char *name, double dflt) {
  double v = dflt;
  int t = lua_getfield(L, idx, name);
  if (t == LUA_TNUMBER) v = (double)lua_tonumber(L, -1);
  else if (t != LUA_TNIL) v = NAN;
  lua_pop(L, 1);
  return v;
}

/* Fills o from the table at idx; header strings stay anchored by that table
 * (the caller keeps it on the stack). hs has room for MAX_HEADERS + 1. */
static void read_opts(lua_State *L, int idx, sbx_fetch_opts *o, sbx_fetch_header_t *hs) {
  int t;
  sbx_fetch_opts_init(o);
  if (lua_type(L, idx) != LUA_TTABLE) {
    o->max_bytes = NAN;
    o->check_timeout_ms = NAN;
    return;
  }
  o->max_bytes = num_field(L, idx, "maxBytes", o->max_bytes);
  o->timeout_ms = num_field(L, idx, "timeoutMs", o->timeout_ms);
  o->idle_timeout_ms = num_field(L, idx, "idleTimeoutMs", o->idle_timeout_ms);
  o->max_redirects = num_field(L, idx, "maxRedirects", o->max_redirects);
  o->check_timeout_ms = num_field(L, idx, "checkTimeoutMs", o->check_timeout_ms);
  t = lua_getfield(L, idx, "followRedirects");
  if (t == LUA_TBOOLEAN) o->follow_redirects = lua_toboolean(L, -1);
  else if (t != LUA_TNIL) o->follow_redirects = 2;
  lua_pop(L, 1);
  t = lua_getfield(L, idx, "headers");
  if (t == LUA_TTABLE) {
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
      if (n <= SBX_FETCH_MAX_HEADERS) {
        sbx_fetch_header_t *h = &hs[n++];
        memset(h, 0, sizeof *h);
        if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
          h->name = lua_tolstring(L, -2, &h->name_len);
          h->value = lua_tolstring(L, -1, &h->value_len);
        }
      }
      lua_pop(L, 1);
    }
    o->headers = hs;
    o->nheaders = n;
  } else if (t != LUA_TNIL) {
    memset(&hs[0], 0, sizeof hs[0]);
    o->headers = hs;
    o->nheaders = 1;                       /* one invalid entry */
  }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "cainfo") == LUA_TSTRING) o->cainfo = lua_tostring(L, -1);
  lua_pop(L, 1);                           /* anchored by the opts table */
  if (lua_getfield(L, idx, "testConnectTo") == LUA_TTABLE) {
    lua_Integer port;
    int isint = 0;
    if (lua_getfield(L, -1, "address") == LUA_TSTRING) o->test_connect_address = lua_tostring(L, -1);
    else o->test_connect_address = "";      /* refused as a bound */
    lua_pop(L, 1);                         /* anchored by testConnectTo, anchored by opts */
    lua_getfield(L, -1, "port");
    port = lua_tointegerx(L, -1, &isint);
    o->test_connect_port = isint && port > 0 && port <= 65535 ? (uint16_t)port : 0;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* ---- results and errors to Lua ------------------------------------------- */

static void push_headers(lua_State *L, const sbx_fetch_header_t *h, size_t n) {
  size_t i;
  lua_createtable(L, 0, (int)n);
  for (i = 0; i < n; i++) {
    lua_pushlstring(L, h[i].name, h[i].name_len);
    lua_pushlstring(L, h[i].value, h[i].value_len);
    lua_rawset(L, -3);
  }
}

typedef struct { const sbx_fetch_result_t *res; const sbx_fetch_error_t *err; } lf_out_t;

/* Runs inside lua_pcall: (fn, out) -> fn(res, err). */
static int deliver(lua_State *L) {
  const lf_out_t *o = lua_touserdata(L, 2);
  lua_pushvalue(L, 1);
  if (o->res != NULL) {
    const sbx_fetch_result_t *r = o->res;
    if (r->seam_token != 0) {
      lua_createtable(L, 0, 1);
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "seam_token");
    } else {
      lua_createtable(L, 0, 6);
      lua_pushlstring(L, r->url, r->url_len);
      lua_setfield(L, -2, "url");
      lua_pushinteger(L, r->status);
      lua_setfield(L, -2, "status");
      if (r->status_text != NULL) {
        lua_pushlstring(L, r->status_text, r->status_text_len);
        lua_setfield(L, -2, "statusText");
      }
      push_headers(L, r->headers, r->nheaders);
      lua_setfield(L, -2, "headers");
      lua_pushlstring(L, r->body != NULL ? r->body : "", r->body != NULL ? r->body_len : 0);
      lua_setfield(L, -2, "data");
      lua_pushinteger(L, (lua_Integer)r->location_count);
      lua_setfield(L, -2, "location_count");
    }
    lua_pushnil(L);
  } else {
    const sbx_fetch_error_t *e = o->err;
    lua_pushnil(L);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, e->code);
    lua_setfield(L, -2, "code");
    lua_pushstring(L, e->name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, e->message);
    lua_setfield(L, -2, "message");
    if (e->errno_name != NULL) {
      lua_pushstring(L, e->errno_name);
      lua_setfield(L, -2, "errno");
    }
    if (e->after_response) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "afterResponse");
    }
    if (e->code == SBX_FETCH_E_DECLARED) {
      lua_pushinteger(L, e->status);
      lua_setfield(L, -2, "status");
      push_headers(L, e->headers, e->nheaders);
      lua_setfield(L, -2, "headers");
    }
    if (e->from_seam) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "from_seam");
    }
  }
  lua_call(L, 2, 0);
  return 0;
}

static void push_code(lua_State *L, int code) {
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, code);
  lua_setfield(L, -2, "code");
  lua_pushstring(L, sbx_fetch_error_name(code));
  lua_setfield(L, -2, "name");
  lua_pushstring(L, sbx_fetch_strerror(code));
  lua_setfield(L, -2, "message");
}

static void call_free(lua_State *L, lf_call_t *c) {
  int i;
  sbx__unref(L, &c->done_ref);
  for (i = 0; i < SEAM_N; i++) sbx__unref(L, &c->seam_ref[i]);
  sbx__box_unbind(c->box);
  free(c);
}

static void on_done(sbx_fetch_t *f, sbx_fetch_result_t *res, const sbx_fetch_error_t *err,
                    void *ud) {
  lf_call_t *c = ud;
  lua_State *L = c->lp->L;
  (void)f;
  c->f = NULL;
  if (!c->cancelling) {
    lf_out_t o;
    o.res = res;
    o.err = err;
    lua_pushcfunction(L, deliver);
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->done_ref);
    lua_pushlightuserdata(L, &o);
    sbx__pcall(L, 2);
  }
  sbx_fetch_result_free(res);
  call_free(L, c);
}

/* ---- seams ----------------------------------------------------------------- */

static sbx__box_t *push_reply(lua_State *L, sbx_fetch_reply_t *r) {
  sbx__box_t *rb = sbx__box_new(L, REPLY_MT);
  sbx__box_bind(rb, r, NULL);
  return rb;
}

/* Calls the trampoline with the reply and nargs pushed after it; a raise
 * fails the reply (so the call does not wait for its deadline). */
static void seam_call(lua_State *L, sbx__box_t *rb, int anchor, int nargs) {
  sbx_fetch_reply_t *r;
  if (sbx__pcall(L, 1 + nargs) != 0 && (r = sbx__box_detach(rb)) != NULL)
    sbx_fetch_reply_fail(r, NULL, 0, "seam failed");
  luaL_unref(L, LUA_REGISTRYINDEX, anchor);
}

static int anchor_reply(lua_State *L) {
  lua_pushvalue(L, -1);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Pushes seam `which`'s Lua function and its reply object (anchored in the
 * registry; *anchor is the ref), ready for the seam's own arguments. */
static sbx__box_t *seam_begin(lf_call_t *c, int which, sbx_fetch_reply_t *r, int *anchor) {
  lua_State *L = c->lp->L;
  sbx__box_t *rb;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->seam_ref[which]);
  rb = push_reply(L, r);
  *anchor = anchor_reply(L);
  return rb;
}

static void seam_resolve(void *ud, const char *host, size_t len, sbx_fetch_reply_t *r) {
  lf_call_t *c = ud;
  lua_State *L = c->lp->L;
  int anchor;
  sbx__box_t *rb = seam_begin(c, SEAM_RESOLVE, r, &anchor);
  lua_pushlstring(L, host, len);
  seam_call(L, rb, anchor, 1);
}

static void seam_local(void *ud, sbx_fetch_reply_t *r) {
  lf_call_t *c = ud;
  lua_State *L = c->lp->L;
  int anchor;
  sbx__box_t *rb = seam_begin(c, SEAM_LOCAL, r, &anchor);
  seam_call(L, rb, anchor, 0);
}

static void seam_transport(void *ud, const sbx_fetch_attempt_info *in, sbx_fetch_reply_t *r) {
  lf_call_t *c = ud;
  lua_State *L = c->lp->L;
  int anchor;
  sbx__box_t *rb = seam_begin(c, SEAM_TRANSPORT, r, &anchor);
  lua_pushlstring(L, in->url, in->url_len);
  lua_createtable(L, 0, 2);
  lua_pushlstring(L, in->address, in->address_len);
  lua_setfield(L, -2, "address");
  lua_pushinteger(L, in->family);
  lua_setfield(L, -2, "family");
  lua_pushinteger(L, (lua_Integer)in->max_bytes);
  push_headers(L, in->headers, in->nheaders);
  seam_call(L, rb, anchor, 4);
}

static sbx_fetch_reply_t *take_reply(lua_State *L) {
  return sbx__box_detach(luaL_checkudata(L, 1, REPLY_MT));
}

/* reply:answers(list) / reply:locals(list): a list that is not a table, or
 * an entry that is not { address = string, family = 4|6 } (answers) or a
 * string (locals), is passed on as malformed: the hop is refused. */
static int addresses(lua_State *L, int locals) {
  sbx_fetch_reply_t *r = take_reply(L);
  sbx_fetch_address_t *list, one = {NULL, 0, 0};
  size_t n = 0, i;
  if (r == NULL) return 0;
  if (lua_type(L, 2) != LUA_TTABLE) {
    sbx_fetch_reply_addresses(r, &one, 1);
    return 0;
  }
  while (n <= SBX_LOCAL_ADDRS_MAX) {          /* one more than allowed is refused by C */
    int t = lua_rawgeti(L, 2, (lua_Integer)n + 1);
    lua_pop(L, 1);
    if (t == LUA_TNIL) break;
    n++;
  }
  list = calloc(n > 0 ? n : 1, sizeof *list);
  if (list == NULL) {
    sbx_fetch_reply_fail(r, NULL, 0, "out of memory");
    return luaL_error(L, "out of memory");
  }
  lua_settop(L, 2);
  for (i = 0; i < n; i++) {
    int t = lua_rawgeti(L, 2, (lua_Integer)i + 1);   /* stays on the stack: anchors text */
    if (locals) {
      if (t == LUA_TSTRING) list[i].text = lua_tolstring(L, -1, &list[i].len);
    } else if (t == LUA_TTABLE) {
      int isint = 0;
      lua_Integer fam;
      if (lua_getfield(L, -1, "family") == LUA_TNUMBER) {
        fam = lua_tointegerx(L, -1, &isint);
        if (isint && (fam == 4 || fam == 6)) list[i].family = (int)fam;
      }
      lua_pop(L, 1);
      if (lua_getfield(L, -1, "address") == LUA_TSTRING && list[i].family != 0) {
        list[i].text = lua_tolstring(L, -1, &list[i].len);
        lua_replace(L, -2);                             /* keep the string, drop the entry */
      } else {
        lua_pop(L, 1);
        list[i].family = 0;
      }
    }
    if (!lua_checkstack(L, 2)) {                       /* cannot anchor more: fail closed */
      n = i + 1;
      list[i].text = NULL;
      break;
    }
  }
  sbx_fetch_reply_addresses(r, list, n);
  free(list);
  return 0;
}

static int reply_answers(lua_State *L) { return addresses(L, 0); }
static int reply_locals(lua_State *L) { return addresses(L, 1); }

/* reply:result(tbl, url): the transport seam's table stays in Lua (the
 * caller gets it back); C gets status, headers, location count and the
 * body length. */
static int reply_result(lua_State *L) {
  sbx_fetch_reply_t *r = take_reply(L);
  sbx_fetch_header_t hs[100];
  size_t nh = 0, url_len = 0, text_len = 0, body_len = 0;
  const char *url, *text = NULL;
  lua_Integer status = 0;
  unsigned loc_count = 0;
  int isint = 0;
  sbx_fetch_result_t *res;
  if (r == NULL) return 0;
  luaL_checktype(L, 2, LUA_TTABLE);
  url = luaL_optlstring(L, 3, "", &url_len);
  lua_settop(L, 3);
  if (lua_getfield(L, 2, "status") == LUA_TNUMBER) status = lua_tointegerx(L, -1, &isint);
  if (!isint || status < 0 || status > 999) status = 0;
  if (lua_getfield(L, 2, "statusText") == LUA_TSTRING) text = lua_tolstring(L, -1, &text_len);
  if (lua_getfield(L, 2, "data") == LUA_TSTRING) body_len = lua_rawlen(L, -1);
  if (lua_getfield(L, 2, "location_count") == LUA_TNUMBER) {
    lua_Integer k = lua_tointegerx(L, -1, &isint);
    if (isint && k > 0) loc_count = k > 1 ? 2 : 1;
  }
  if (lua_getfield(L, 2, "headers") == LUA_TTABLE) {
    int ht = lua_gettop(L), lt = lua_getfield(L, ht, "location");
    if (lt == LUA_TSTRING) {
      hs[nh].name = "location";
      hs[nh].name_len = 8;
      hs[nh].value = lua_tolstring(L, -1, &hs[nh].value_len);
      nh++;
      if (loc_count == 0) loc_count = 1;
    } else if (lt != LUA_TNIL) {
      loc_count = 2;                                   /* not a string: invalid location */
    }
    lua_pushnil(L);
    while (lua_next(L, ht) != 0) {
      if (nh < 100 && lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
        size_t kl;
        const char *k = lua_tolstring(L, -2, &kl);
        if (!(kl == 8 && memcmp(k, "location", 8) == 0)) {
          hs[nh].name = k;
          hs[nh].name_len = kl;
          hs[nh].value = lua_tolstring(L, -1, &hs[nh].value_len);
          nh++;
        }
      }
      lua_pop(L, 1);
    }
  }
  res = sbx__result_new(url, url_len, (int)status, text, text_len, hs, nh, NULL, body_len);
  if (res == NULL) {
    sbx_fetch_reply_fail(r, NULL, 0, "out of memory");
    return 0;
  }
  res->location_count = loc_count;
  res->seam_token = 1;
  sbx_fetch_reply_result(r, res);
  return 0;
}

/* reply:fail(errno_name|nil, after_response, message) */
static int reply_fail(lua_State *L) {
  sbx_fetch_reply_t *r = take_reply(L);
  const char *e = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
  const char *msg = lua_type(L, 4) == LUA_TSTRING ? lua_tostring(L, 4) : "seam failed";
  if (r == NULL) return 0;
  sbx_fetch_reply_fail(r, e, lua_toboolean(L, 3), msg);
  return 0;
}

static int reply_gc(lua_State *L) {
  sbx_fetch_reply_t *r = take_reply(L);
  if (r != NULL) sbx_fetch_reply_release(r);
  return 0;
}

/* ---- calls ------------------------------------------------------------------ */

static int start(lua_State *L, int check) {
  sbx_fetch_header_t hs[SBX_FETCH_MAX_HEADERS + 1];
  sbx_fetch_opts o;
  size_t len = 0;
  const char *url = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &len) : NULL;
  lf_call_t *c;
  sbx__box_t *b;
  int err = 0, i;
  static const char *const names[SEAM_N] = {"resolve", "transport", "localAddresses"};
  luaL_checktype(L, 3, LUA_TFUNCTION);
  lua_settop(L, 3);
  read_opts(L, 2, &o, hs);
  c = calloc(1, sizeof *c);
  if (c == NULL) return luaL_error(L, "out of memory");
  c->lp = sbx__loop(L);
  c->done_ref = LUA_NOREF;
  for (i = 0; i < SEAM_N; i++) {
    c->seam_ref[i] = LUA_NOREF;
    if (lua_type(L, 2) == LUA_TTABLE && lua_getfield(L, 2, names[i]) == LUA_TFUNCTION)
      c->seam_ref[i] = luaL_ref(L, LUA_REGISTRYINDEX);
    else if (lua_type(L, 2) == LUA_TTABLE)
      lua_pop(L, 1);
  }
  if (c->seam_ref[SEAM_RESOLVE] != LUA_NOREF) o.resolve = seam_resolve;
  if (c->seam_ref[SEAM_TRANSPORT] != LUA_NOREF) o.transport = seam_transport;
  if (c->seam_ref[SEAM_LOCAL] != LUA_NOREF) o.local_addresses = seam_local;
  o.seam_ud = c;
  c->f = check ? sbx_assert_public_url_start(&c->lp->uv, url, len, &o, on_done, c, &err)
               : sbx_fetch_start(&c->lp->uv, url, len, &o, on_done, c, &err);
  if (c->f == NULL) {
    call_free(L, c);
    lua_pushnil(L);
    push_code(L, err);
    return 2;
  }
  c->done_ref = sbx__ref(L, 3);
  b = sbx__box_new(L, CALL_MT);
  sbx__box_bind(b, c, &c->box);
  return 1;
}

static int l_fetch_start(lua_State *L) { return start(L, 0); }
static int l_assert_url_start(lua_State *L) { return start(L, 1); }

static int l_fetch_opts_check(lua_State *L) {
  sbx_fetch_header_t hs[SBX_FETCH_MAX_HEADERS + 1];
  sbx_fetch_opts o;
  int code;
  lua_settop(L, 2);
  read_opts(L, 1, &o, hs);
  code = sbx_fetch_opts_check(&o, lua_toboolean(L, 2));
  if (code == 0) return 0;
  push_code(L, code);
  return 1;
}

/* call:cancel(): stops everything at once; on_done never runs. */
static int call_cancel(lua_State *L) {
  lf_call_t *c = sbx__box_check(L, 1, CALL_MT);
  if (c != NULL && c->f != NULL && !c->cancelling) {
    c->cancelling = 1;
    sbx_fetch_cancel(c->f);          /* on_done frees c and unlinks the box */
  }
  return 0;
}

/* A collected call is cancelled: nothing outlives its Lua handle. */
static int call_gc(lua_State *L) { return call_cancel(L); }

/* ---- core.fetch_attempt: one pinned attempt (fetch_attempt.c) ---------------- */

/* The `kind` string core.fetch_attempt hands Lua. */
static const char *const kind_names[] = {
  NULL, "ok", "redirect", "idle", "header_block", "declared_too_large",
  "encoding", "wire_too_large", "body_too_large", "decode", "pin",
  "bad_status", "connect_timeout", "transport", "nomem"};


/* The Lua object and the attempt point at each other through this block;
 * on_done is held in the registry until done or cancel. */
typedef struct {
  sbx__attempt_t *a;
  sbx__loop_t *lp;
  int done_ref;
  sbx__box_t *box;         /* the Lua object, until it is collected */
} sf_lua_att_t;

static void push_att_fields(lua_State *L, const sbx__attempt_out_t *o) {
  sbx_fetch_header_t h[SBX__ATT_MAX_FIELDS];
  char *mem = NULL;
  int n = sbx__attempt_fields(o, h, SBX__ATT_MAX_FIELDS, &mem), i;
  lua_createtable(L, 0, n > 0 ? n : 0);
  for (i = 0; i < n; i++) {
    lua_pushlstring(L, h[i].name, h[i].name_len);
    lua_pushlstring(L, h[i].value, h[i].value_len);
    lua_rawset(L, -3);
  }
  free(mem);
}

/* Runs inside lua_pcall: (fn, outcome) -> fn(res). */
static int att_deliver(lua_State *L) {
  const sbx__attempt_out_t *o = lua_touserdata(L, 2);
  lua_pushvalue(L, 1);
  lua_createtable(L, 0, 8);
  lua_pushboolean(L, o->kind == SBX__ATT_OK || o->kind == SBX__ATT_REDIRECT);
  lua_setfield(L, -2, "ok");
  lua_pushstring(L, kind_names[o->kind]);
  lua_setfield(L, -2, "kind");
  if (o->has_status) {
    lua_pushinteger(L, (lua_Integer)o->status);
    lua_setfield(L, -2, "status");
    if (o->reason != NULL) {
      lua_pushlstring(L, o->reason, o->reason_len);
      lua_setfield(L, -2, "status_text");
    }
    if (o->has_headers) {
      push_att_fields(L, o);
      lua_setfield(L, -2, "headers");
      lua_pushinteger(L, o->location_count);
      lua_setfield(L, -2, "location_count");
    }
  }
  if (o->kind == SBX__ATT_OK || o->kind == SBX__ATT_REDIRECT) {
    lua_pushlstring(L, o->body != NULL ? o->body : "", o->len);
    lua_setfield(L, -2, "body");
  }
  if (o->err != 0) {
    lua_pushstring(L, sbx__errno_name(o->err));
    lua_setfield(L, -2, "code");
  }
  if (o->message != NULL) {
    lua_pushstring(L, o->message);
    lua_setfield(L, -2, "message");
  }
  lua_pushboolean(L, o->fallback);
  lua_setfield(L, -2, "fallback");
  lua_call(L, 1, 0);
  return 0;
}

static void lua_att_done(void *ud, sbx__attempt_out_t *o) {
  sf_lua_att_t *la = ud;
  lua_State *L = la->lp->L;
  int ref = la->done_ref;
  la->a = NULL;
  la->done_ref = LUA_NOREF;
  /* Detach the Lua object first: a cancel from inside on_done is a no-op. */
  if (la->box != NULL) sbx__box_detach(la->box);
  lua_pushcfunction(L, att_deliver);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_pushlightuserdata(L, o);
  sbx__pcall(L, 2);
  free(la);
}

/* ---- argument checks (programming errors raise) ----------------------- */

/* A required string field: non-empty, at most max bytes, no NUL. */
static const char *need_string(lua_State *L, const char *field, size_t max, size_t *len) {
  size_t n;
  const char *s = sbx__opt_string_field(L, 1, ATT_WHO, field, max, &n, 0);
  if (s == NULL || n == 0) luaL_error(L, ATT_WHO ": opts.%s must be a non-empty string", field);
  if (len != NULL) *len = n;
  return s;
}

/* core.fetch_attempt(opts) -> attempt | nil, err. See API.md. The url,
 * header strings and cainfo stay referenced by opts during the call only:
 * curl copies them at setopt. */
static int l_fetch_attempt(lua_State *L) {
  const char *url, *address, *cainfo = NULL, *lines[SBX__ATT_MAX_LINES];
  size_t url_len, addr_len;
  lua_Integer family, port, max_bytes, connect_ms, timeout_ms, idle_ms, i, nh = 0;
  sbx__attempt_params_t p;
  sf_lua_att_t *la;
  sbx__box_t *b;
  const char *err = NULL;
  int top;

  luaL_checktype(L, 1, LUA_TTABLE);
  url = need_string(L, "url", ATT_MAX_URL, &url_len);
  address = need_string(L, "address", INET6_ADDRSTRLEN, &addr_len);
  family = sbx__check_integer_field(L, 1, ATT_WHO, "family", 4, 6);
  port = sbx__check_integer_field(L, 1, ATT_WHO, "port", 1, 65535);
  max_bytes = sbx__check_integer_field(L, 1, ATT_WHO, "max_bytes", 1, SBX_FETCH_MAX_BYTES);
  timeout_ms = sbx__check_integer_field(L, 1, ATT_WHO, "timeout_ms", 1, SBX_FETCH_MAX_TIMEOUT_MS);
  connect_ms = sbx__opt_integer_field(L, 1, ATT_WHO, "connect_timeout_ms", SBX_FETCH_CONNECT_TIMEOUT_MS, 1,
                                      SBX_FETCH_MAX_TIMEOUT_MS);
  idle_ms = sbx__check_integer_field(L, 1, ATT_WHO, "idle_timeout_ms", 1, SBX_FETCH_MAX_TIMEOUT_MS);
  if (lua_getfield(L, 1, "cainfo") != LUA_TNIL) { lua_pop(L, 1); cainfo = need_string(L, "cainfo", 4096, NULL); }
  else lua_pop(L, 1);
  if (family == 5) luaL_error(L, "fetch_attempt: opts.family must be 4 or 6");
  memset(&p, 0, sizeof p);
  p.family = family == 4 ? AF_INET : AF_INET6;
  if (inet_pton(p.family, address, p.addr) != 1)
    luaL_error(L, "fetch_attempt: opts.address is not an IPv%d literal", (int)family);
  if (lua_getfield(L, 1, "on_done") != LUA_TFUNCTION) luaL_error(L, "fetch_attempt: opts.on_done must be a function");
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) nh = (lua_Integer)lua_rawlen(L, -1);
  else if (!lua_isnil(L, -1)) luaL_error(L, "fetch_attempt: opts.headers must be an array");
  if (nh > SBX__ATT_MAX_LINES) luaL_error(L, "fetch_attempt: too many header lines");
  top = lua_gettop(L);   /* the headers table stays there: it anchors the lines */
  for (i = 1; i <= nh; i++) {
    size_t n;
    const char *s;
    if (lua_rawgeti(L, top, i) != LUA_TSTRING) luaL_error(L, "fetch_attempt: header lines must be strings");
    s = lua_tolstring(L, -1, &n);
    lua_pop(L, 1);       /* still referenced by the table */
    if (n > SBX__ATT_MAX_LINE) luaL_error(L, "fetch_attempt: header line too long");
    if (memchr(s, '\0', n) != NULL || !sbx__header_line_ok(s, n))
      luaL_error(L, "fetch_attempt: header lines must be 'Name: value' without control characters");
    lines[i - 1] = s;
  }
  p.url = url;
  p.port = (int)port;
  p.lines = lines;
  p.nlines = (size_t)nh;
  p.max_bytes = (size_t)max_bytes;
  p.timeout_ms = (long)timeout_ms;
  p.connect_ms = (long)connect_ms;
  p.idle_ms = (uint64_t)idle_ms;
  p.cainfo = cainfo;

  b = sbx__box_new(L, ATT_MT);
  la = calloc(1, sizeof *la);
  if (la == NULL) { lua_pushnil(L); lua_pushliteral(L, "out of memory"); return 2; }
  la->lp = sbx__loop(L);
  lua_getfield(L, 1, "on_done");
  la->done_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  la->a = sbx__attempt_start(NULL, &la->lp->uv, &p, lua_att_done, la, &err);
  if (la->a == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, la->done_ref);
    free(la);
    lua_pushnil(L);
    lua_pushstring(L, err != NULL ? err : "fetch client setup failed");
    return 2;
  }
  sbx__box_bind(b, la, &la->box);
  return 1;
}

/* attempt:cancel(): on_done never runs. */
static int att_cancel(lua_State *L) {
  sf_lua_att_t *la = sbx__box_detach(luaL_checkudata(L, 1, ATT_MT));
  if (la != NULL && la->a != NULL) {
    sbx__attempt_cancel(la->a);
    sbx__unref(L, &la->done_ref);
    free(la);
  }
  return 0;
}

void sbx__open_fetch_lua(lua_State *L) {
  static const luaL_Reg call_methods[] = {{"cancel", call_cancel}, {NULL, NULL}};
  static const luaL_Reg reply_methods[] = {
    {"answers", reply_answers}, {"locals", reply_locals}, {"result", reply_result},
    {"fail", reply_fail}, {NULL, NULL}};
  static const luaL_Reg att_methods[] = {{"cancel", att_cancel}, {NULL, NULL}};
  sbx__class(L, CALL_MT, call_methods, call_gc);
  sbx__class(L, REPLY_MT, reply_methods, reply_gc);
  /* A collected attempt handle does not stop it (on_done is in the
   * registry); only the link is dropped. */
  sbx__class(L, ATT_MT, att_methods, sbx__box_gc);
  lua_pushcfunction(L, l_fetch_start);
  lua_setfield(L, -2, "fetch_start");
  lua_pushcfunction(L, l_assert_url_start);
  lua_setfield(L, -2, "assert_url_start");
  lua_pushcfunction(L, l_fetch_opts_check);
  lua_setfield(L, -2, "fetch_opts_check");
  lua_pushcfunction(L, l_fetch_attempt);
  lua_setfield(L, -2, "fetch_attempt");
}
