/*
 * listener.c: the broker's request policy over the connection engine
 * (conn.c): the Unix-socket HTTP/1.1 listener of spec/broker.md sections 3,
 * 5 steps 0-12, 6, 7.1, and the `call` object Lua's route handlers (step
 * 13) receive. Accept, the connection cap, the descriptor pool and EMFILE
 * drain (shared/spec/hardening.md 2), the head deadline, the write queue,
 * shutdown and linger, close accounting and what C refuses before a head
 * are conn.c's; this file keeps what a request is here: a head judged in C,
 * a body buffered whole, one reply.
 *
 * Objects and who frees what (libuv's rule: memory a handle uses is freed in
 * its close callback and nowhere else):
 *
 *  - lst_t, the listener: conn.c's sbx__srv_t first, then the route table,
 *    budget and in-flight flag. Reference counted (conn.h): the Lua listener
 *    userdata, the open server handle, every connection and every `call`
 *    userdata each hold one reference; the last release frees it.
 *  - bconn_t, one accepted connection: conn.c's sbx__conn_t first, then its
 *    body buffer and pending call; freed by conn.c's close callback.
 *  - call_t, the `call` userdata (Lua owns its memory): points at its
 *    connection until that closes or the reply is written, and at the
 *    listener (counted). Everything it does is harmless once the connection
 *    is gone; its reply always releases the in-flight slot (step 14).
 *
 * Flow per connection: once the head is complete (conn.c), http_head.c
 * decides steps 0-8 and the request deadline starts; step 9 takes budget
 * and the in-flight slot; the body (exactly Content-Length bytes) is read
 * into its own buffer; steps 10-12 decode it with json.c; then
 * opts.on_call(call, i), where i is the index in opts.routes of the route
 * step 2 matched, so Lua dispatches on data it handed over and never parses
 * a route again. Every reply is built whole, written, and the connection
 * ends (conn.c shuts our side down and lingers).
 *
 * A listener made with opts.policy "precheck" (lua/sandbox/precheck) decides
 * heads with precheck_head.c instead (the precheck broker's rows 0-7), caps
 * bodies at opts.max_body and hands any strict-JSON body to on_call; the
 * framing, deadlines, connection cap and reply format are the same.
 *
 * Every request that does not reach on_call (a refusal at steps 0-12, a
 * connection over the cap, an expired head or request deadline before the
 * call) is reported to opts.on_refused once its reply is written, as data:
 * {reason, status, accepted (the budget was spent), route (the index step 2
 * matched, when one did), header (step 3/5's refused name, when it is a
 * token of at most 64 bytes)}; the reason is the audit vocabulary of
 * spec/operations.md 3. A call handed to Lua learns why its connection
 * closed from call:on_close(fn(why)).
 *
 * Lua is only called from libuv callbacks through sbx__loop(L)->L (the thread
 * running core.run), or from the caller's own thread inside a method, and
 * never once the listener userdata has been collected. Nothing here logs a
 * payload, header value, credential or path.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "http_head.h"
#include "json.h"
#include "loop.h"
#include "parts.h"
#include "precheck_head.h"

#define LISTENER_MT "sbx.listener"
#define CALL_MT     "sbx.call"
#define WHO         "broker_listen"

#define CT_TEXT "text/plain;charset=utf-8"
#define CT_JSON "application/json;charset=utf-8"

/* call userdata user values */
#define UV_BODY     1
#define UV_ON_CLOSE 2
#define UV_ROUTE    3

typedef struct lst lst_t;
typedef struct bconn bconn_t;
typedef struct call call_t;

struct lst {
  sbx__srv_t srv;          /* first: conn.c's listener */
  int turn_ended;
  int unbound;             /* opts.unbound: a warm turn's broker before its
                              bind (spec/warm-turns.md 1): every head gets 503
                              `broker not ready`, no budget, no on_call */
  int in_flight;
  lua_Integer budget;      /* calls left */
  int test_echo;           /* the test seam opts.test_echo (see API.md) */
  int precheck;            /* opts.policy "precheck": precheck_head.c decides
                              the head, and any JSON value reaches on_call */
  size_t max_body;         /* Content-Length above this is refused unread */
  uint64_t request_ms;
  sbx__route_t *routes;
  size_t nroutes;
  char *route_bytes;
};

/* What the connection does inside conn.c's SBX_CONN_REQUEST. */
enum { P_DECIDE, P_BODY, P_CALL };

struct bconn {
  sbx__conn_t base;        /* first: conn.c's connection */
  int phase;
  int holds_slot;          /* accepted (step 9) and no call owns the slot yet */
  char *body;              /* exactly body_len bytes once accepted */
  size_t len;              /* of them, read so far */
  size_t body_len;         /* Content-Length once accepted */
  size_t route;
  size_t discarded;        /* bytes read and dropped during the call */
  call_t *call;            /* the pending call, until reply or close */
  int call_ref;            /* registry ref keeping that userdata alive */
};

struct call {
  lst_t *lst;
  bconn_t *conn;           /* NULL once the connection closed or was replied to */
  int replied;
  int close_fired;
};

static lst_t *lst_of(bconn_t *c) { return (lst_t *)c->base.srv; }

static void lst_release(lst_t *lst) { sbx__srv_release(&lst->srv); }

/* ---- refusals as data (spec/operations.md 3) ----------------------------- */

/* Protected: (fn, refusal) -> fn({reason=, status=, accepted=, route=, header=}). */
static int push_refusal(lua_State *L) {
  const sbx__refusal_t *r = lua_touserdata(L, 2);
  size_t i;
  lua_settop(L, 1);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, r->reason);
  lua_setfield(L, -2, "reason");
  lua_pushinteger(L, r->status);
  lua_setfield(L, -2, "status");
  lua_pushboolean(L, r->accepted);
  lua_setfield(L, -2, "accepted");
  if (r->route >= 0) {
    lua_pushinteger(L, (lua_Integer)r->route + 1);
    lua_setfield(L, -2, "route");
  }
  if (r->header != NULL && r->header_len > 0 && r->header_len <= 64) {
    char name[64];
    for (i = 0; i < r->header_len; i++) {
      unsigned char c = (unsigned char)r->header[i];
      if (!sbx__http_is_tchar(c)) break;
      name[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    if (i == r->header_len) {
      lua_pushlstring(L, name, r->header_len);
      lua_setfield(L, -2, "header");
    }
  }
  lua_call(L, 1, 0);
  return 0;
}

/* Hands one refusal to opts.on_refused. Call it last on a path: the handler
   may stop the listener (lst stays valid: conn.c holds a reference). */
static void report(lst_t *lst, const char *reason, int status, long route, int accepted,
                   const char *header, size_t header_len) {
  sbx__refusal_t r;
  r.reason = reason;
  r.status = status;
  r.route = route;
  r.accepted = accepted;
  r.header = header;
  r.header_len = header_len;
  sbx__srv_report(&lst->srv, &r);
}

/* ---- closing ------------------------------------------------------------ */

/* conn.c's closing(): a connection holding the in-flight slot without a call
 * (steps 9-12) gives it back; a pending call is detached and its on_close
 * handler runs on L (when L is non-NULL and it was not replied to) with
 * why: "client_closed", "request_deadline" or "stopped". */
static void on_closing(sbx__conn_t *base, lua_State *L, const char *why) {
  bconn_t *c = (bconn_t *)base;
  call_t *call = c->call;
  int ref = c->call_ref;
  if (c->holds_slot) {
    c->holds_slot = 0;
    lst_of(c)->in_flight = 0;
  }
  c->call = NULL;
  c->call_ref = LUA_NOREF;
  if (call == NULL) return;
  call->conn = NULL;
  if (L == NULL) return;   /* state closing: one registry slot stays, harmless */
  if (strcmp(why, SBX_CONN_GONE) == 0 || strcmp(why, SBX_CONN_FINISHED) == 0) why = "client_closed";
  if (!call->replied && !call->close_fired) {
    call->close_fired = 1;
    sbx__conn_call_uservalue(L, ref, UV_ON_CLOSE, why);
  }
  sbx__unref(L, &ref);
}

static void on_free(sbx__conn_t *base) {
  free(((bconn_t *)base)->body);
}

/* ---- writing a reply ---------------------------------------------------- */

/*
 * Builds the reply's head (status line and the three headers), queues it with
 * the body and ends the connection. Returns 0, or -1 when the connection was
 * closed instead (no memory, write refused) or had already ended.
 */
static int conn_reply(bconn_t *c, int status, const char *ctype,
                      const char *body, size_t blen) {
  char head[256 + SBX_MAX_CONTENT_TYPE_BYTES];
  uv_buf_t parts[2];
  int n;
  if (c->base.state != SBX_CONN_REQUEST) return -1;
  n = snprintf(head, sizeof head,
               "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
               "Connection: close\r\n\r\n", status, sbx__http_reason(status), ctype, blen);
  if (n < 0 || (size_t)n >= sizeof head) { sbx__conn_close(&c->base, SBX_CONN_GONE); return -1; }
  sbx__conn_read_stop(&c->base);
  sbx__conn_probe(&c->base, 0);          /* the request deadline still runs */
  parts[0] = uv_buf_init(head, (unsigned)n);
  parts[1] = uv_buf_init((char *)body, (unsigned)blen);
  if (sbx__conn_write(&c->base, parts, 2) != 0) return -1;
  sbx__conn_end(&c->base);
  return 0;
}

static void reply_text(bconn_t *c, int status, const char *body) {
  conn_reply(c, status, CT_TEXT, body, strlen(body));
}

/* A refusal from C after step 9: the slot goes back, the budget stays spent;
   reported last (with the route step 2 matched). */
static void fail_accepted(bconn_t *c, int status, const char *body, const char *reason) {
  lst_t *lst = lst_of(c);
  long route = (long)c->route;
  if (c->holds_slot) {
    c->holds_slot = 0;
    lst->in_flight = 0;
  }
  reply_text(c, status, body);
  report(lst, reason, status, route, 1, NULL, 0);
}

/* conn.c's deadline(): the request deadline passed: closed, no reply. A
   request that never reached Lua is reported; a call's on_close hears why. */
static void on_deadline(sbx__conn_t *base) {
  bconn_t *c = (bconn_t *)base;
  lst_t *lst = lst_of(c);
  int body = c->base.state == SBX_CONN_REQUEST && c->phase == P_BODY;
  long route = (long)c->route;
  lst->srv.refs++;
  sbx__conn_close(base, "request_deadline");
  if (body) report(lst, "request_deadline", 0, route, 1, NULL, 0);
  lst_release(lst);
}

/* ---- the pipeline: steps 9-12 and the handoff to Lua ---------------------- */

/* The audit reasons of a refusal at steps 10-12, by prep_call's code. */
enum { R_MALFORMED, R_PAYLOAD, R_AFTER_TURN, R_CLIENT_CLOSED, R_TOO_COSTLY, R_COUNT };
static const char *const body_reasons[R_COUNT] = {
  "malformed_json", "payload", "after_turn", "client_closed", "body_too_large"};

/*
 * Protected (lua_pcall) part of steps 10-12 so that a Lua memory error never
 * unwinds through libuv. Argument: the connection (light userdata). Returns
 * the status that decides (0 = hand a call to Lua, 200 = the test_echo seam) and, for 0,
 * the call userdata, anchored by conn->call_ref and by a second ref returned
 * as the third value (released by the caller after on_call).
 */
static int prep_call(lua_State *L) {
  bconn_t *c = lua_touserdata(L, 1);
  lst_t *lst = lst_of(c);
  call_t *call;
  const char *why = NULL;
  size_t budget = c->body_len * SBX_BODY_MEMORY_FACTOR;
  int rc;
  /* 10: strict JSON, decoded only once the scan (building nothing) found
   * what it would cost within the budget (core/json_shape.c) */
  if (budget < lst->max_body * SBX_BODY_MEMORY_FLOOR_FACTOR) budget = lst->max_body * SBX_BODY_MEMORY_FLOOR_FACTOR;
  rc = sbx__json_decode_bounded(L, c->body, c->body_len, NULL, 0, budget, 0, &why, NULL, 0);
  if (rc != 0) {
    lua_pushinteger(L, 502);
    lua_pushinteger(L, rc == SBX_ETOOBIG ? R_TOO_COSTLY : R_MALFORMED);
    return 2;
  }
  if (!lst->precheck && !sbx__json_is_object(L, -1)) {               /* 11 */
    lua_pushinteger(L, 400);
    lua_pushinteger(L, R_PAYLOAD);
    return 2;
  }
  if (lst->turn_ended || c->base.peer_eof) {                               /* 12 */
    lua_pushinteger(L, 502);
    lua_pushinteger(L, lst->turn_ended ? R_AFTER_TURN : R_CLIENT_CLOSED);
    return 2;
  }
  if (lst->test_echo) { lua_pushinteger(L, 200); return 1; }
  call = lua_newuserdatauv(L, sizeof *call, 3);
  memset(call, 0, sizeof *call);
  luaL_setmetatable(L, CALL_MT);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, UV_BODY);
  lua_pushlstring(L, lst->routes[c->route].s, lst->routes[c->route].len);
  lua_setiuservalue(L, -2, UV_ROUTE);
  c->call_ref = sbx__ref(L, -1);
  lua_pushinteger(L, 0);
  lua_pushvalue(L, -2);
  lua_pushinteger(L, sbx__ref(L, -1));
  /* Only now, with nothing left that can raise, does the call own things. */
  call->lst = lst;
  lst->srv.refs++;
  call->conn = c;
  c->call = call;
  return 3;
}

static void body_complete(bconn_t *c) {
  lst_t *lst = lst_of(c);
  lua_State *L = sbx__conn_L(&c->base);
  int status, pin;
  call_t *call;

  if (L == NULL) { sbx__conn_close(&c->base, SBX_CONN_GONE); return; }
  lua_pushcfunction(L, prep_call);
  lua_pushlightuserdata(L, c);
  if (lua_pcall(L, 1, 3, 0) != LUA_OK) {
    lua_pop(L, 1);
    if (c->call_ref != LUA_NOREF && c->call == NULL) sbx__unref(L, &c->call_ref);
    fail_accepted(c, 502, SBX_BODY_CALL_FAILED, "malformed_json");
    return;
  }
  status = (int)lua_tointeger(L, -3);
  if (status != 0) {
    lua_Integer k = lua_tointeger(L, -2);
    const char *reason = body_reasons[k >= 0 && k < R_COUNT ? k : R_MALFORMED];
    lua_pop(L, 3);
    if (status == 200) {
      if (c->holds_slot) { c->holds_slot = 0; lst->in_flight = 0; }
      conn_reply(c, 200, CT_JSON, c->body, c->body_len);
    } else {
      fail_accepted(c, status, status == 400 ? SBX_BODY_INVALID_INPUT : SBX_BODY_CALL_FAILED, reason);
    }
    return;
  }
  call = lua_touserdata(L, -2);
  pin = (int)lua_tointeger(L, -1);
  lua_pop(L, 3);
  c->holds_slot = 0;                 /* the call owns the slot now */
  c->phase = P_CALL;
  free(c->body);                     /* the decoded value is all Lua needs */
  c->body = NULL;
  c->discarded = 0;

  lua_rawgeti(L, LUA_REGISTRYINDEX, lst->srv.handler_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, pin);
  lua_pushinteger(L, (lua_Integer)c->route + 1);   /* the route matched in step 2 */
  lua_pushinteger(L, (lua_Integer)c->body_len);    /* bytes_in of the audit line */
  if (sbx__pcall(L, 3) != 0 && !call->replied) {
    /* A handler error is step 13's 502; the slot is released by the reply. */
    call->replied = 1;
    lst->in_flight = 0;
    if (call->conn != NULL) {
      bconn_t *cc = call->conn;
      int ref = cc->call_ref;
      cc->call = NULL;
      cc->call_ref = LUA_NOREF;
      call->conn = NULL;
      sbx__unref(L, &ref);
      reply_text(cc, 502, SBX_BODY_CALL_FAILED);
    }
  }
  luaL_unref(L, LUA_REGISTRYINDEX, pin);
}

/* Step 9 onwards, once the head is complete and steps 0-8 passed. */
static void accept_call(bconn_t *c, size_t head_len, const sbx__head_result_t *r) {
  lst_t *lst = lst_of(c);
  size_t have = c->base.len - head_len;

  lst->in_flight = 1;                                            /* 9 */
  lst->budget--;
  c->holds_slot = 1;
  c->route = r->route;
  if (!r->has_length || r->length == 0 || r->length > lst->max_body) {
    fail_accepted(c, 502, SBX_BODY_CALL_FAILED,                  /* 10 */
                  r->has_length && r->length > lst->max_body ? "body_too_large" : "malformed_json");
    return;
  }
  c->body_len = (size_t)r->length;
  c->body = malloc(c->body_len);
  if (c->body == NULL) { fail_accepted(c, 502, SBX_BODY_CALL_FAILED, "malformed_json"); return; }
  if (have > c->body_len) have = c->body_len;     /* bytes after it: ignored */
  memcpy(c->body, c->base.buf + head_len, have);
  free(c->base.buf);                              /* the head is judged */
  c->base.buf = NULL;
  c->len = have;
  c->phase = P_BODY;
  if (have == c->body_len) body_complete(c);
}

static void head_complete(bconn_t *c, size_t head_len) {
  lst_t *lst = lst_of(c);
  sbx__head_ctx_t ctx;
  sbx__head_result_t r;

  sbx__conn_arm(&c->base, lst->request_ms);               /* request deadline starts */
  if (lst->unbound) {                          /* warm-turns.md 1: before the bind */
    reply_text(c, 503, SBX_BODY_NOT_READY);
    report(lst, "not_bound", 503, -1, 0, NULL, 0);
    return;
  }
  if (lst->precheck) {
    sbx__precheck_ctx_t pc;
    pc.routes = lst->routes;
    pc.nroutes = lst->nroutes;
    pc.run_ended = lst->turn_ended;
    pc.in_flight = lst->in_flight;
    pc.exhausted = lst->budget <= 0;
    sbx__precheck_head_decide(c->base.buf, head_len, &pc, &r);
  } else {
    ctx.routes = lst->routes;
    ctx.nroutes = lst->nroutes;
    ctx.turn_ended = lst->turn_ended;
    ctx.busy = lst->in_flight || lst->budget <= 0;
    ctx.no_budget = lst->budget <= 0;
    sbx__head_decide(c->base.buf, head_len, &ctx, &r);
  }
  if (r.status != 0) {
    reply_text(c, r.status, r.body);
    report(lst, r.reason, r.status, r.routed ? (long)r.route : -1, 0, r.header, r.header_len);
    return;
  }
  accept_call(c, head_len, &r);
}

/* ---- reading ------------------------------------------------------------ */

/* conn.c's head(): steps 0-8 on a complete head (end == 0: too big). */
static void on_head(sbx__conn_t *base, size_t end) {
  bconn_t *c = (bconn_t *)base;
  base->state = SBX_CONN_REQUEST;
  c->phase = P_DECIDE;
  if (end == 0) {                                         /* step 0: too big */
    lst_t *lst = lst_of(c);
    reply_text(c, 400, SBX_BODY_BAD_REQUEST);
    report(lst, "header", 400, -1, 0, NULL, 0);
    return;
  }
  head_complete(c, end);
}

static int on_alloc(sbx__conn_t *base, uv_buf_t *b) {
  bconn_t *c = (bconn_t *)base;
  if (c->phase != P_BODY) return 0;
  *b = uv_buf_init(c->body + c->len, (unsigned)(c->body_len - c->len));
  return 1;
}

static void on_data(sbx__conn_t *base, const char *p, size_t n) {
  bconn_t *c = (bconn_t *)base;
  (void)p;
  if (c->phase == P_BODY) {
    c->len += n;
    if (c->len == c->body_len) body_complete(c);
  } else if (c->phase == P_CALL) {
    c->discarded += n;
    if (c->discarded > SBX_MAX_DISCARD_BYTES) {
      sbx__conn_read_stop(base);
      sbx__conn_probe(base, 1);
    }
  }
}

/* conn.c's eof(): the client half-closed (UV_EOF) or is gone. */
static void on_eof(sbx__conn_t *base, ssize_t nread) {
  bconn_t *c = (bconn_t *)base;
  if (nread != UV_EOF) {                       /* reset: the peer is gone */
    lst_t *lst = lst_of(c);
    int body = c->phase == P_BODY;
    long route = (long)c->route;
    lst->srv.refs++;
    sbx__conn_close(base, SBX_CONN_GONE);
    if (body) report(lst, "malformed_json", 0, route, 1, NULL, 0);   /* 10 */
    lst_release(lst);
    return;
  }
  if (c->phase == P_BODY) { fail_accepted(c, 502, SBX_BODY_CALL_FAILED, "malformed_json"); return; }
  if (c->phase == P_CALL) {
    /* A half-close mid-call: look for a hang-up until the deadline. */
    if (sbx__conn_hung_up(base)) sbx__conn_close(base, SBX_CONN_GONE);
    else sbx__conn_probe(base, 1);
    return;
  }
  sbx__conn_close(base, SBX_CONN_GONE);
}

static void on_open(sbx__conn_t *base) {
  ((bconn_t *)base)->call_ref = LUA_NOREF;
}

static void on_nothing(sbx__conn_t *base) { (void)base; }

static void srv_free(sbx__srv_t *srv) {
  lst_t *lst = (lst_t *)srv;
  free(lst->routes);
  free(lst->route_bytes);
  free(lst);
}

static const sbx__conn_ops_t broker_ops = {
  sizeof(bconn_t), on_open, on_head, on_alloc, on_data, on_eof, on_deadline,
  on_nothing, on_nothing, on_nothing, on_closing, on_free, srv_free, push_refusal};

/* ---- listener lifecycle ----------------------------------------------- */

static lst_t *check_lst(lua_State *L, int idx) {
  return sbx__box_check(L, idx, LISTENER_MT);
}

/* Copies opts.routes into lst (one block of bytes plus an index). */
static void read_routes(lua_State *L, lst_t *lst) {
  size_t n, i, total = 0, off = 0;
  if (lua_getfield(L, 1, "routes") != LUA_TTABLE)
    luaL_error(L, "broker_listen: opts.routes must be an array of strings");
  n = (size_t)lua_rawlen(L, -1);
  if (n > SBX_MAX_ROUTES) luaL_error(L, "broker_listen: too many routes");
  for (i = 1; i <= n; i++) {
    size_t len;
    if (lua_rawgeti(L, -1, (lua_Integer)i) != LUA_TSTRING)
      luaL_error(L, "broker_listen: opts.routes must be an array of strings");
    lua_tolstring(L, -1, &len);
    if (len == 0 || len > SBX_MAX_HEAD_BYTES) luaL_error(L, "broker_listen: invalid route");
    total += len;
    lua_pop(L, 1);
  }
  lst->routes = calloc(n ? n : 1, sizeof *lst->routes);
  lst->route_bytes = malloc(total ? total : 1);
  if (lst->routes == NULL || lst->route_bytes == NULL) luaL_error(L, "out of memory");
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    lua_rawgeti(L, -1, (lua_Integer)i);
    s = lua_tolstring(L, -1, &len);
    memcpy(lst->route_bytes + off, s, len);
    lst->routes[i - 1].s = lst->route_bytes + off;
    lst->routes[i - 1].len = len;
    off += len;
    lua_pop(L, 1);
  }
  lst->nroutes = n;
  lua_pop(L, 1);
}

/* Frees a listener that never got a server handle (argument errors). */
static int lst_gc_unbound(lua_State *L) {
  lst_t **pp = lua_touserdata(L, 1);
  if (*pp != NULL) {
    free((*pp)->routes);
    free((*pp)->route_bytes);
    free(*pp);
    *pp = NULL;
  }
  return 0;
}

/* core.broker_listen(opts) -> listener | nil, err */
static int l_broker_listen(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  const char *path, *policy;
  size_t path_len;
  lst_t *lst, **guard;
  sbx__box_t *box;
  int rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  /* A guard userdata frees the half-built listener if an argument raises. */
  guard = lua_newuserdatauv(L, sizeof *guard, 0);
  *guard = NULL;
  lua_newtable(L);
  lua_pushcfunction(L, lst_gc_unbound);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lst = calloc(1, sizeof *lst);
  if (lst == NULL) return luaL_error(L, "out of memory");
  *guard = lst;
  lst->srv.max_conns = SBX_MAX_CONNECTIONS;

  if (lua_getfield(L, 1, "path") != LUA_TSTRING)
    return luaL_error(L, "broker_listen: opts.path must be a string");
  path = lua_tolstring(L, -1, &path_len);       /* stays on the stack */
  read_routes(L, lst);
  lst->budget = sbx__opt_integer_field(L, 1, WHO, "max_calls", SBX_DEFAULT_MAX_CALLS, 1,
                                       SBX_MAX_CALLS_LIMIT);
  lst->srv.head_ms = (uint64_t)sbx__opt_integer_field(L, 1, WHO, "header_timeout_ms",
                                                  SBX_HEADER_DEADLINE_MS, 1, SBX_HEADER_DEADLINE_MS);
  lst->request_ms = (uint64_t)sbx__opt_integer_field(L, 1, WHO, "request_timeout_ms",
                                                     SBX_REQUEST_DEADLINE_MS, 1, SBX_REQUEST_DEADLINE_MS);
  lst->test_echo = sbx__opt_boolean_field(L, 1, WHO, "test_echo", 0);
  lst->unbound = sbx__opt_boolean_field(L, 1, WHO, "unbound", 0);
  lst->max_body = (size_t)sbx__opt_integer_field(L, 1, WHO, "max_body", SBX_MAX_BODY_BYTES, 1,
                                                 SBX_MAX_BODY_BYTES);
  policy = sbx__opt_string_field(L, 1, WHO, "policy", 16, NULL, 0);
  if (policy != NULL && strcmp(policy, "precheck") == 0) lst->precheck = 1;
  else if (policy != NULL && strcmp(policy, "broker") != 0)
    return luaL_error(L, WHO ": opts.policy must be \"broker\" or \"precheck\"");
  if (lua_getfield(L, 1, "on_call") != LUA_TFUNCTION && !lst->test_echo)
    return luaL_error(L, "broker_listen: opts.on_call must be a function");
  if (strlen(path) != path_len || path_len == 0)
    return luaL_error(L, "broker_listen: opts.path must be a non-empty path");
  if (path_len > SBX_MAX_SOCKET_PATH) return sbx__push_failure(L, ENAMETOOLONG, "broker socket path too long");

  /* From here the server handle owns one reference and frees lst. */
  box = sbx__box_new(L, LISTENER_MT);
  *guard = NULL;
  rc = sbx__srv_listen(&lst->srv, lp, &broker_ops, path);
  if (rc != 0) return sbx__srv_push_listen_failure(L, rc);
  if (lua_type(L, -2) == LUA_TFUNCTION) lst->srv.handler_ref = sbx__ref(L, -2);
  lua_getfield(L, 1, "on_refused");
  lua_insert(L, -2);                            /* the box is the result again */
  sbx__srv_adopt(L, &lst->srv, box, -2);
  return 1;
}

/*
 * core.broker_reclaim(n) -> closed: closes up to n pooled connections that
 * hold nothing (still waiting for their head: no request, no call), of any
 * listener (the stream listener's too), from the listeners holding the most
 * connections first, so a new turn's charge fits (fdbudget.c, conn.c).
 * Nothing is written to them and no Lua runs.
 */
static int l_broker_reclaim(lua_State *L) {
  lua_Integer want = luaL_checkinteger(L, 1);
  lua_pushinteger(L, sbx__srv_reclaim(want > SBX_MAX_CONNECTIONS * 1024 ? SBX_MAX_CONNECTIONS * 1024
                                      : want < 0 ? 0 : (int)want));
  return 1;
}

static int l_lst_end_turn(lua_State *L) {
  check_lst(L, 1)->turn_ended = 1;
  return 0;
}

/* listener:bind(): the warm broker's bind (spec/warm-turns.md 1); once. */
static int l_lst_bind(lua_State *L) {
  lst_t *lst = check_lst(L, 1);
  if (lst == NULL || !lst->unbound) return luaL_error(L, "broker listener is not unbound");
  lst->unbound = 0;
  return 0;
}

static int l_lst_stop(lua_State *L) {
  lst_t *lst = check_lst(L, 1);
  if (lst != NULL) sbx__srv_stop(&lst->srv, L, 1);
  return 0;
}

static int l_lst_stats(lua_State *L) {
  lst_t *lst = check_lst(L, 1);
  sbx__srv_push_stats(L, lst ? &lst->srv : NULL, 3);
  lua_pushinteger(L, lst ? lst->budget : 0);
  lua_setfield(L, -2, "budget");
  lua_pushboolean(L, lst ? lst->in_flight : 0);
  lua_setfield(L, -2, "in_flight");
  lua_pushboolean(L, lst ? lst->turn_ended : 0);
  lua_setfield(L, -2, "turn_ended");
  return 1;
}

static int l_lst_gc(lua_State *L) {
  return sbx__srv_gc_box(L, LISTENER_MT);
}

/* ---- call --------------------------------------------------------------- */

/* 1 while c is open and its call is Lua's (not replied to). */
static int in_call(const bconn_t *c) {
  return c != NULL && c->base.state == SBX_CONN_REQUEST && c->phase == P_CALL;
}

static call_t *check_call(lua_State *L) {
  return luaL_checkudata(L, 1, CALL_MT);
}

static int l_call_route(lua_State *L) {
  check_call(L);
  lua_getiuservalue(L, 1, UV_ROUTE);
  return 1;
}

static int l_call_body(lua_State *L) {
  check_call(L);
  lua_getiuservalue(L, 1, UV_BODY);
  return 1;
}

static int l_call_is_open(lua_State *L) {
  call_t *call = check_call(L);
  lua_pushboolean(L, in_call(call->conn));
  return 1;
}

/* call:on_close(fn): fn(why) once if the connection closes before the reply
   (at once when it already has), why = "client_closed", "request_deadline"
   or "stopped". Replaces an earlier handler. */
static int l_call_on_close(lua_State *L) {
  call_t *call = check_call(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_setiuservalue(L, 1, UV_ON_CLOSE);
  if (call->conn == NULL && !call->replied) {
    call->close_fired = 1;
    lua_getiuservalue(L, 1, UV_ON_CLOSE);
    lua_pushstring(L, "client_closed");
    lua_call(L, 1, 0);
  }
  return 0;
}

/* call:reply(status, body [, content_type]) -> true if written, false if the
   connection was gone or a reply was already given. */
static int l_call_reply(lua_State *L) {
  call_t *call = check_call(L);
  lua_Integer status = luaL_checkinteger(L, 2);
  size_t blen, ctlen, i;
  const char *body = luaL_checklstring(L, 3, &blen);
  const char *ct = luaL_optlstring(L, 4, status == 200 ? CT_JSON : CT_TEXT, &ctlen);
  bconn_t *c;
  int ref;

  luaL_argcheck(L, status >= 200 && status <= 599, 2, "status out of range");
  luaL_argcheck(L, ctlen > 0 && ctlen <= SBX_MAX_CONTENT_TYPE_BYTES, 4, "invalid content type");
  for (i = 0; i < ctlen; i++)
    luaL_argcheck(L, ct[i] >= 0x20 && ct[i] < 0x7f, 4, "invalid content type");
  if (call->replied) { lua_pushboolean(L, 0); return 1; }
  call->replied = 1;
  if (call->lst != NULL) call->lst->in_flight = 0;        /* step 14 */
  c = call->conn;
  if (!in_call(c)) { lua_pushboolean(L, 0); return 1; }
  call->conn = NULL;
  ref = c->call_ref;
  c->call = NULL;
  c->call_ref = LUA_NOREF;
  if (blen > SBX_MAX_REPLY_BYTES) {
    status = 502;
    body = SBX_BODY_CALL_FAILED;
    blen = strlen(body);
    ct = CT_TEXT;
  }
  lua_pushboolean(L, conn_reply(c, (int)status, ct, body, blen) == 0);
  sbx__unref(L, &ref);            /* last: may let this userdata be collected */
  return 1;
}

static int l_call_gc(lua_State *L) {
  call_t *call = lua_touserdata(L, 1);
  if (call->conn != NULL) {
    call->conn->call = NULL;
    call->conn = NULL;
  }
  if (call->lst != NULL) {
    /* Unreachable without a reply: nobody can settle it any more. */
    if (!call->replied) call->lst->in_flight = 0;
    call->replied = 1;
    lst_release(call->lst);
    call->lst = NULL;
  }
  return 0;
}

void sbx__open_listener(lua_State *L) {
  static const luaL_Reg lst_methods[] = {
    {"end_turn", l_lst_end_turn}, {"bind", l_lst_bind}, {"stop", l_lst_stop}, {"stats", l_lst_stats},
    {NULL, NULL}};
  static const luaL_Reg call_methods[] = {
    {"route", l_call_route}, {"body", l_call_body}, {"reply", l_call_reply},
    {"on_close", l_call_on_close}, {"is_open", l_call_is_open}, {NULL, NULL}};
  sbx__class(L, LISTENER_MT, lst_methods, l_lst_gc);
  sbx__class(L, CALL_MT, call_methods, l_call_gc);
  lua_pushcfunction(L, l_broker_listen);
  lua_setfield(L, -2, "broker_listen");
  lua_pushcfunction(L, l_broker_reclaim);
  lua_setfield(L, -2, "broker_reclaim");
}
