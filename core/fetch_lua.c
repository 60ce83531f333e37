/*
 * fetch_lua.c: the Lua binding of the safe-fetch C API (sbx_fetch.h), what
 * lua/sandbox/fetch.lua builds on:
 *
 *   core.fetch_start(url, opts, on_done)        -> call | nil, err
 *   core.assert_url_start(url, opts, on_done)   -> call | nil, err
 *   core.fetch_opts_check(opts, check)          -> nil | err
 *   call:cancel()                               on_done never runs
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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_internal.h"
#include "netaddr.h"
#include "loop.h"
#include "parts.h"

#define CALL_MT  "sbx.fetch.call"
#define REPLY_MT "sbx.fetch.reply"

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

void sbx__open_fetch_lua(lua_State *L) {
  static const luaL_Reg call_methods[] = {{"cancel", call_cancel}, {NULL, NULL}};
  static const luaL_Reg reply_methods[] = {
    {"answers", reply_answers}, {"locals", reply_locals}, {"result", reply_result},
    {"fail", reply_fail}, {NULL, NULL}};
  sbx__class(L, CALL_MT, call_methods, call_gc);
  sbx__class(L, REPLY_MT, reply_methods, reply_gc);
  lua_pushcfunction(L, l_fetch_start);
  lua_setfield(L, -2, "fetch_start");
  lua_pushcfunction(L, l_assert_url_start);
  lua_setfield(L, -2, "assert_url_start");
  lua_pushcfunction(L, l_fetch_opts_check);
  lua_setfield(L, -2, "fetch_opts_check");
}
