/*
 * listener.c: the broker's Unix-socket HTTP/1.1 listener (spec/broker.md
 * sections 3, 5 steps 0-12, 6, 7.1) and the `call` object Lua's route
 * handlers (step 13) receive.
 *
 * Objects and who frees what (libuv's rule: memory a handle uses is freed in
 * its close callback and nowhere else):
 *
 *  - lst_t, the listener: one heap block holding the listening uv_pipe_t, the
 *    route table, budget and in-flight flag, and the list of connections. It
 *    is reference counted: the Lua listener userdata, the open server handle,
 *    every connection and every `call` userdata each hold one reference; the
 *    last release frees it. So a collected listener userdata never frees
 *    memory libuv or a surviving `call` still uses.
 *  - conn_t, one accepted connection: a uv_pipe_t and a uv_timer_t (head
 *    deadline, then request deadline, then linger); freed when both handles'
 *    close callbacks have run. Its head buffer, body buffer and reply buffer
 *    are its own.
 *  - call_t, the `call` userdata (Lua owns its memory): points at its
 *    connection until that closes or the reply is written, and at the
 *    listener (counted). Everything it does is harmless once the connection
 *    is gone; its reply always releases the in-flight slot (step 14).
 *
 * Flow per connection: read the head into a buffer of SBX_MAX_HEAD_BYTES + 1;
 * once it is complete, http_head.c decides steps 0-8; step 9 takes budget and
 * the in-flight slot; the body (exactly Content-Length bytes) is read into its
 * own buffer; steps 10-12 decode it with json.c; then opts.on_call(call, i),
 * where i is the index in opts.routes of the route step 2 matched, so Lua
 * dispatches on data it handed over and never parses a route again.
 * Every reply is built whole, written, our side is shut down, and bytes the
 * client still sends are drained for at most SBX_LINGER_MS before the close,
 * so a client still writing its refused body reads the reply instead of a
 * reset.
 *
 * Connections are budgeted (shared/spec/hardening.md 2, fdbudget.c): the
 * first SBX_FD_GUARANTEED_CONNS open connections of a listener are its
 * turn's own; each one beyond them (up to SBX_MAX_CONNECTIONS) is taken from
 * the process's shared pool, and one the pool cannot carry is accepted and
 * closed at once, like one over the cap. An accept that fails with EMFILE or
 * ENFILE never stops the listener: the reserved descriptor is given up to
 * accept and close what is pending, then taken again. Every listener is on
 * one list, so core.broker_reclaim can close idle pooled connections (ones
 * still waiting for their head, no call) when a new turn needs the room.
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
 * token of at most 64 bytes)}; the
 * reason is the audit vocabulary of spec/operations.md 3. A call handed to
 * Lua learns why its connection closed from call:on_close(fn(why)).
 *
 * Lua is only called from libuv callbacks through sbx__loop(L)->L (the thread
 * running core.run), or from the caller's own thread inside a method, and
 * never once the listener userdata has been collected (state closing).
 * Nothing here logs a payload, header value, credential or path.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdbudget.h"
#include "http_head.h"
#include "json.h"
#include "loop.h"
#include "parts.h"
#include "pipe_server.h"
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
typedef struct conn conn_t;
typedef struct call call_t;

struct lst {
  uv_pipe_t server;
  sbx__loop_t *lp;
  int refs;
  int stopped;             /* stop() ran (or bind failed): no new work */
  int lua_gone;            /* userdata collected: never call Lua again */
  int turn_ended;
  int unbound;             /* opts.unbound: a warm turn's broker before its
                              bind (spec/warm-turns.md 1): every head gets 503
                              `broker not ready`, no budget, no on_call */
  int in_flight;
  lua_Integer budget;      /* calls left */
  int test_echo;          /* the test seam opts.test_echo (see API.md) */
  int precheck;            /* opts.policy "precheck": precheck_head.c decides
                              the head, and any JSON value reaches on_call */
  size_t max_body;         /* Content-Length above this is refused unread */
  uint64_t head_ms;
  uint64_t request_ms;
  int on_call_ref;
  int on_refused_ref;      /* opts.on_refused, or LUA_NOREF */
  int self_ref;            /* the userdata, anchored until stop() */
  sbx__route_t *routes;
  size_t nroutes;
  char *route_bytes;
  conn_t *conns;
  int nconns;
  lst_t *all_prev, *all_next;  /* every listener not yet stopped (reclaim) */
};

enum { C_HEAD, C_BODY, C_CALL, C_WRITING, C_SHUTDOWN, C_LINGER, C_CLOSING };

struct conn {
  uv_pipe_t pipe;
  uv_timer_t timer;
  uv_write_t wreq;
  uv_shutdown_t sreq;
  lst_t *lst;
  conn_t *prev, *next;
  int state;
  int handles;             /* open handles; the struct is freed at 0 */
  int reading;
  int holds_slot;          /* accepted (step 9) and no call owns the slot yet */
  int peer_eof;            /* read side ended (peer half-closed or left) */
  int polling;             /* timer repeats to look for a hang-up */
  int pooled;              /* counted in the shared descriptor pool */
  uint64_t deadline;       /* loop time the current phase ends */
  char *buf;               /* head (SBX_MAX_HEAD_BYTES + 1), then body */
  size_t len;
  size_t body_len;         /* Content-Length once accepted */
  size_t route;
  size_t drained;          /* bytes discarded after the request */
  char *reply;
  const char *why;         /* why it closes without a reply (on_close's argument) */
  call_t *call;            /* the pending call, until reply or close */
  int call_ref;            /* registry ref keeping that userdata alive */
};

struct call {
  lst_t *lst;
  conn_t *conn;            /* NULL once the connection closed or was replied to */
  int replied;
  int close_fired;
};

static char drain_buf[16384];   /* bytes we read only to throw away */
static lst_t *all_listeners;    /* the list core.broker_reclaim walks */

/* ---- helpers ----------------------------------------------------------- */

static void lst_release(lst_t *lst) {
  if (--lst->refs > 0) return;
  free(lst->routes);
  free(lst->route_bytes);
  free(lst);
}


/* ---- refusals as data (spec/operations.md 3) ----------------------------- */

typedef struct {
  const char *reason;
  int status;              /* the status written, 0 when nothing was */
  long route;              /* index into lst->routes, or -1 */
  int accepted;            /* step 9 passed: the budget was spent */
  const char *header;
  size_t header_len;
} refusal_t;

/* Protected: (fn, refusal) -> fn({reason=, status=, route=, header=}). */
static int push_refusal(lua_State *L) {
  const refusal_t *r = lua_touserdata(L, 2);
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
   may stop the listener (lst stays valid: a reference is held meanwhile). */
static void report(lst_t *lst, const char *reason, int status, long route, int accepted,
                   const char *header, size_t header_len) {
  lua_State *L;
  refusal_t r;
  if (lst->on_refused_ref == LUA_NOREF || lst->lua_gone || reason == NULL) return;
  L = lst->lp->L;
  r.reason = reason;
  r.status = status;
  r.route = route;
  r.accepted = accepted;
  r.header = header;
  r.header_len = header_len;
  lst->refs++;
  lua_pushcfunction(L, push_refusal);
  lua_rawgeti(L, LUA_REGISTRYINDEX, lst->on_refused_ref);
  lua_pushlightuserdata(L, &r);
  sbx__pcall(L, 2);
  lst_release(lst);
}

/* ---- connection teardown ------------------------------------------------ */

static void conn_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  lst_t *lst;
  if (--c->handles > 0) return;
  lst = c->lst;
  if (c->prev) c->prev->next = c->next; else lst->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  lst->nconns--;
  if (c->pooled) sbx__fd_pool_give();
  free(c->buf);
  free(c->reply);      /* normally freed by the write callback already */
  free(c);
  lst_release(lst);
}

/*
 * Closes both handles (no reply). A connection holding the in-flight slot
 * without a call (steps 9-12) gives it back. A pending call is detached and
 * returned with the registry ref that keeps it alive (the caller owns the
 * ref), or NULL. Lua is not touched. Safe to call more than once.
 */
static call_t *conn_close(conn_t *c, int *ref) {
  call_t *call;
  *ref = LUA_NOREF;
  if (c->state == C_CLOSING) return NULL;
  c->state = C_CLOSING;
  if (c->holds_slot) {
    c->holds_slot = 0;
    c->lst->in_flight = 0;
  }
  uv_close((uv_handle_t *)&c->pipe, conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
  call = c->call;
  *ref = c->call_ref;
  c->call = NULL;
  c->call_ref = LUA_NOREF;
  if (call != NULL) call->conn = NULL;
  return call;
}

/*
 * Runs a detached call's on_close handler on L when fire is set and the call
 * was not replied to, then drops the ref. Touches no connection: the handler
 * may run the loop, and so free connections.
 */
static void call_closed(lua_State *L, call_t *call, int ref, int fire, const char *why) {
  if (call == NULL) return;
  if (L == NULL) return;   /* state closing: one registry slot stays, harmless */
  if (fire && !call->replied && !call->close_fired) {
    call->close_fired = 1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    if (lua_getiuservalue(L, -1, UV_ON_CLOSE) == LUA_TFUNCTION) {
      lua_remove(L, -2);             /* the registry ref keeps the call alive */
      lua_pushstring(L, why != NULL ? why : "client_closed");
      sbx__pcall(L, 1);
    } else {
      lua_pop(L, 2);
    }
  }
  sbx__unref(L, &ref);
}

/* conn_close, then the on_close handler on L (if any). The caller must not
   touch c afterwards. */
static void conn_destroy(conn_t *c, lua_State *L, int fire) {
  int ref;
  const char *why = c->why;
  call_t *call = conn_close(c, &ref);
  if (c->lst->lua_gone) L = NULL;
  call_closed(L, call, ref, fire, why);
}

static lua_State *loop_L(conn_t *c) {
  return c->lst->lua_gone ? NULL : c->lst->lp->L;
}

/* ---- writing a reply ---------------------------------------------------- */

static void start_read(conn_t *c);
static void stop_read(conn_t *c);
static void arm_timer(conn_t *c, uint64_t ms);
static void on_timer(uv_timer_t *t);

static void linger_start(conn_t *c) {
  if (c->peer_eof) { conn_destroy(c, loop_L(c), 1); return; }
  c->state = C_LINGER;
  c->drained = 0;
  arm_timer(c, SBX_LINGER_MS);
  start_read(c);
  if (!c->reading) conn_destroy(c, loop_L(c), 1);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  conn_t *c = req->data;
  if (c->state == C_CLOSING) return;
  if (status < 0) { conn_destroy(c, loop_L(c), 1); return; }
  linger_start(c);
}

static void on_written(uv_write_t *req, int status) {
  conn_t *c = req->data;
  free(c->reply);
  c->reply = NULL;
  if (c->state == C_CLOSING) return;
  if (status < 0 || c->peer_eof) { conn_destroy(c, loop_L(c), 1); return; }
  c->state = C_SHUTDOWN;
  c->sreq.data = c;
  if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->pipe, on_shutdown) != 0)
    conn_destroy(c, loop_L(c), 1);
}

/*
 * Builds the whole reply (status line, the three headers, body) and writes
 * it; the connection closes afterwards. Returns 0, or -1 when the connection
 * was destroyed instead (no memory, write refused).
 */
static int conn_reply(conn_t *c, int status, const char *ctype,
                      const char *body, size_t blen) {
  char head[256 + SBX_MAX_CONTENT_TYPE_BYTES];
  int n;
  uv_buf_t b;
  if (c->state == C_CLOSING) return -1;
  n = snprintf(head, sizeof head,
               "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
               "Connection: close\r\n\r\n", status, sbx__http_reason(status), ctype, blen);
  if (n < 0 || (size_t)n >= sizeof head) { conn_destroy(c, loop_L(c), 1); return -1; }
  c->reply = malloc((size_t)n + blen);
  if (c->reply == NULL) { conn_destroy(c, loop_L(c), 1); return -1; }
  memcpy(c->reply, head, (size_t)n);
  if (blen > 0) memcpy(c->reply + n, body, blen);
  stop_read(c);
  c->state = C_WRITING;
  if (c->polling) {
    /* Back from hang-up polling to one shot at the request deadline. */
    uint64_t now = uv_now(c->timer.loop);
    uv_timer_stop(&c->timer);
    c->polling = 0;
    uv_timer_start(&c->timer, on_timer, c->deadline > now ? c->deadline - now : 0, 0);
  }
  b = uv_buf_init(c->reply, (unsigned)((size_t)n + blen));
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->pipe, &b, 1, on_written) != 0) {
    free(c->reply);
    c->reply = NULL;
    conn_destroy(c, loop_L(c), 1);
    return -1;
  }
  return 0;
}

static void reply_text(conn_t *c, int status, const char *body) {
  conn_reply(c, status, CT_TEXT, body, strlen(body));
}

/* A refusal from C after step 9: the slot goes back, the budget stays spent;
   reported last (with the route step 2 matched). */
static void fail_accepted(conn_t *c, int status, const char *body, const char *reason) {
  lst_t *lst = c->lst;
  long route = (long)c->route;
  if (c->holds_slot) {
    c->holds_slot = 0;
    lst->in_flight = 0;
  }
  reply_text(c, status, body);
  report(lst, reason, status, route, 1, NULL, 0);
}

/* ---- timers ------------------------------------------------------------- */

static int peer_hung_up(conn_t *c) { return sbx__pipe_hung_up(&c->pipe); }

static void on_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  if (c->state == C_CLOSING) return;
  if (c->polling) {
    if (uv_now(t->loop) < c->deadline) {
      if (!peer_hung_up(c)) return;
      c->polling = 0;
      uv_timer_stop(t);
      c->why = "client_closed";
      conn_destroy(c, loop_L(c), 1);
      return;
    }
    c->polling = 0;
    uv_timer_stop(t);
  }
  /* Head deadline, request deadline or end of linger: close, no reply. A
     request that never reached Lua is reported; a call's on_close hears
     why. */
  {
    lst_t *lst = c->lst;
    int state = c->state;
    long route = (long)c->route;
    c->why = state == C_HEAD ? "header_deadline" : "request_deadline";
    conn_destroy(c, loop_L(c), 1);
    if (state == C_HEAD) report(lst, "header_deadline", 0, -1, 0, NULL, 0);
    else if (state == C_BODY) report(lst, "request_deadline", 0, route, 1, NULL, 0);
  }
}

static void arm_timer(conn_t *c, uint64_t ms) {
  uv_timer_stop(&c->timer);
  c->polling = 0;
  c->deadline = uv_now(c->timer.loop) + ms;
  uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* Mid-call and no longer reading: look for a hang-up until the deadline. */
static void start_polling(conn_t *c) {
  uint64_t now = uv_now(c->timer.loop);
  if (c->polling) return;
  if (now >= c->deadline) { conn_destroy(c, loop_L(c), 1); return; }
  uv_timer_stop(&c->timer);
  c->polling = 1;
  uv_timer_start(&c->timer, on_timer, SBX_HUP_POLL_MS, SBX_HUP_POLL_MS);
}

/* ---- the pipeline: steps 9-12 and the handoff to Lua ---------------------- */

/* The audit reasons of a refusal at steps 10-12, by prep_call's code. */
enum { R_MALFORMED, R_PAYLOAD, R_AFTER_TURN, R_CLIENT_CLOSED, R_COUNT };
static const char *const body_reasons[R_COUNT] = {
  "malformed_json", "payload", "after_turn", "client_closed"};

/*
 * Protected (lua_pcall) part of steps 10-12 so that a Lua memory error never
 * unwinds through libuv. Argument: the connection (light userdata). Returns
 * the status that decides (0 = hand a call to Lua, 200 = the test_echo seam) and, for 0,
 * the call userdata, anchored by conn->call_ref and by a second ref returned
 * as the third value (released by the caller after on_call).
 */
static int prep_call(lua_State *L) {
  conn_t *c = lua_touserdata(L, 1);
  lst_t *lst = c->lst;
  call_t *call;
  if (sbx__json_decode(L, c->buf, c->body_len, NULL) != 0) {          /* 10 */
    lua_pushinteger(L, 502);
    lua_pushinteger(L, R_MALFORMED);
    return 2;
  }
  if (!lst->precheck && !sbx__json_is_object(L, -1)) {               /* 11 */
    lua_pushinteger(L, 400);
    lua_pushinteger(L, R_PAYLOAD);
    return 2;
  }
  if (lst->turn_ended || c->peer_eof) {                               /* 12 */
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
  lst->refs++;
  call->conn = c;
  c->call = call;
  return 3;
}

static void body_complete(conn_t *c) {
  lst_t *lst = c->lst;
  lua_State *L = loop_L(c);
  int status, pin;
  call_t *call;

  if (L == NULL) { conn_destroy(c, NULL, 0); return; }
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
      conn_reply(c, 200, CT_JSON, c->buf, c->body_len);
    } else {
      fail_accepted(c, status, status == 400 ? SBX_BODY_INVALID_INPUT : SBX_BODY_CALL_FAILED, reason);
    }
    return;
  }
  call = lua_touserdata(L, -2);
  pin = (int)lua_tointeger(L, -1);
  lua_pop(L, 3);
  c->holds_slot = 0;                 /* the call owns the slot now */
  c->state = C_CALL;
  free(c->buf);                      /* the decoded value is all Lua needs */
  c->buf = NULL;
  c->drained = 0;

  lua_rawgeti(L, LUA_REGISTRYINDEX, lst->on_call_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, pin);
  lua_pushinteger(L, (lua_Integer)c->route + 1);   /* the route matched in step 2 */
  lua_pushinteger(L, (lua_Integer)c->body_len);    /* bytes_in of the audit line */
  if (sbx__pcall(L, 3) != 0 && !call->replied) {
    /* A handler error is step 13's 502; the slot is released by the reply. */
    call->replied = 1;
    lst->in_flight = 0;
    if (call->conn != NULL) {
      conn_t *cc = call->conn;
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
static void accept_call(conn_t *c, size_t head_len, const sbx__head_result_t *r) {
  lst_t *lst = c->lst;
  size_t have = c->len - head_len;
  char *body;

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
  body = malloc(c->body_len);
  if (body == NULL) { fail_accepted(c, 502, SBX_BODY_CALL_FAILED, "malformed_json"); return; }
  if (have > c->body_len) have = c->body_len;     /* bytes after it: ignored */
  memcpy(body, c->buf + head_len, have);
  free(c->buf);
  c->buf = body;
  c->len = have;
  if (have == c->body_len) { body_complete(c); return; }
  c->state = C_BODY;
}

static void head_complete(conn_t *c, size_t head_len) {
  lst_t *lst = c->lst;
  sbx__head_ctx_t ctx;
  sbx__head_result_t r;

  arm_timer(c, lst->request_ms);               /* request deadline starts */
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
    sbx__precheck_head_decide(c->buf, head_len, &pc, &r);
  } else {
    ctx.routes = lst->routes;
    ctx.nroutes = lst->nroutes;
    ctx.turn_ended = lst->turn_ended;
    ctx.busy = lst->in_flight || lst->budget <= 0;
    ctx.no_budget = lst->budget <= 0;
    sbx__head_decide(c->buf, head_len, &ctx, &r);
  }
  if (r.status != 0) {
    reply_text(c, r.status, r.body);
    report(lst, r.reason, r.status, r.routed ? (long)r.route : -1, 0, r.header, r.header_len);
    return;
  }
  accept_call(c, head_len, &r);
}

/* ---- reading ------------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  conn_t *c = h->data;
  (void)suggested;
  if (c->state == C_HEAD)
    *b = uv_buf_init(c->buf + c->len, (unsigned)(SBX_MAX_HEAD_BYTES + 1 - c->len));
  else if (c->state == C_BODY)
    *b = uv_buf_init(c->buf + c->len, (unsigned)(c->body_len - c->len));
  else
    *b = uv_buf_init(drain_buf, sizeof drain_buf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  conn_t *c = s->data;
  size_t end, from;
  (void)b;
  if (nread == 0 || c->state == C_CLOSING) return;
  if (nread < 0) {
    c->reading = 0;
    c->peer_eof = 1;
    if (nread != UV_EOF) {                      /* reset: the peer is gone */
      lst_t *lst = c->lst;
      int state = c->state;
      long route = (long)c->route;
      conn_destroy(c, loop_L(c), 1);
      if (state == C_BODY) report(lst, "malformed_json", 0, route, 1, NULL, 0);   /* 10 */
      return;
    }
    switch (c->state) {
    case C_BODY: fail_accepted(c, 502, SBX_BODY_CALL_FAILED, "malformed_json"); return;  /* 10 */
    case C_CALL:
      if (peer_hung_up(c)) conn_destroy(c, loop_L(c), 1);
      else start_polling(c);
      return;
    default: conn_destroy(c, loop_L(c), 1); return;   /* head, linger */
    }
  }
  switch (c->state) {
  case C_HEAD:
    from = c->len;
    c->len += (size_t)nread;
    end = sbx__head_end(c->buf, c->len, from);
    if (end == 0 && c->len <= SBX_MAX_HEAD_BYTES) return;
    if (end == 0 || end > SBX_MAX_HEAD_BYTES) {           /* step 0: too big */
      lst_t *lst = c->lst;
      reply_text(c, 400, SBX_BODY_BAD_REQUEST);
      report(lst, "header", 400, -1, 0, NULL, 0);
      return;
    }
    head_complete(c, end);
    return;
  case C_BODY:
    c->len += (size_t)nread;
    if (c->len == c->body_len) body_complete(c);
    return;
  case C_CALL:
    c->drained += (size_t)nread;
    if (c->drained > SBX_MAX_DISCARD_BYTES) { stop_read(c); start_polling(c); }
    return;
  case C_LINGER:
    c->drained += (size_t)nread;
    if (c->drained > SBX_MAX_LINGER_BYTES) conn_destroy(c, loop_L(c), 1);
    return;
  default:
    return;
  }
}

static void start_read(conn_t *c) {
  if (c->reading || c->peer_eof) return;
  if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0) c->reading = 1;
}

static void stop_read(conn_t *c) {
  if (!c->reading) return;
  uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = 0;
}

/* ---- accepting ---------------------------------------------------------- */

static void on_connection(uv_stream_t *server, int status) {
  lst_t *lst = server->data;
  conn_t *c;
  int pooled = 0;
  if (status == UV_EMFILE || status == UV_ENFILE) {
    /* libuv's own reserve was not enough: ours, then keep listening. */
    uv_os_fd_t fd;
    int n = 0;
    if (!lst->stopped && uv_fileno((uv_handle_t *)server, &fd) == 0) n = sbx__fd_emfile_drain(fd);
    while (n-- > 0) report(lst, "connections", 0, -1, 0, NULL, 0);
    return;
  }
  if (status < 0 || lst->stopped) return;
  if (lst->nconns >= SBX_FD_GUARANTEED_CONNS && lst->nconns < SBX_MAX_CONNECTIONS) {
    pooled = sbx__fd_pool_take();
  }
  if (lst->nconns >= SBX_MAX_CONNECTIONS || (lst->nconns >= SBX_FD_GUARANTEED_CONNS && !pooled)) {
    /* Over the cap, or over the turn's share with the pool empty: closed at
       once, nothing written. */
    sbx__pipe_refuse(server);
    report(lst, "connections", 0, -1, 0, NULL, 0);
    return;
  }
  c = calloc(1, sizeof *c);
  if (c == NULL) { if (pooled) sbx__fd_pool_give(); return; }
  c->buf = malloc(SBX_MAX_HEAD_BYTES + 1);
  if (c->buf == NULL) { free(c); if (pooled) sbx__fd_pool_give(); return; }
  c->lst = lst;
  c->pooled = pooled;
  c->call_ref = LUA_NOREF;
  c->why = "client_closed";
  c->state = C_HEAD;
  uv_pipe_init(server->loop, &c->pipe, 0);
  uv_timer_init(server->loop, &c->timer);
  c->pipe.data = c;
  c->timer.data = c;
  c->handles = 2;
  lst->refs++;
  c->next = lst->conns;
  if (lst->conns) lst->conns->prev = c;
  lst->conns = c;
  lst->nconns++;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) { conn_destroy(c, NULL, 0); return; }
  arm_timer(c, lst->head_ms);                    /* head deadline from accept */
  start_read(c);
  if (!c->reading) conn_destroy(c, NULL, 0);
}

/* ---- listener lifecycle ----------------------------------------------- */

static void server_closed(uv_handle_t *h) {
  lst_release(h->data);
}

/*
 * Forced stop: closes the listening socket (libuv unlinks its path on close)
 * and destroys every connection, firing pending calls' on_close on L (when L
 * is non-NULL). Idempotent.
 */
static void all_add(lst_t *lst) {
  lst->all_prev = NULL;
  lst->all_next = all_listeners;
  if (all_listeners) all_listeners->all_prev = lst;
  all_listeners = lst;
}

static void all_remove(lst_t *lst) {
  if (lst->all_prev) lst->all_prev->all_next = lst->all_next;
  else if (all_listeners == lst) all_listeners = lst->all_next;
  if (lst->all_next) lst->all_next->all_prev = lst->all_prev;
  lst->all_prev = lst->all_next = NULL;
}

static void lst_stop(lst_t *lst, lua_State *L) {
  conn_t *c;
  call_t *calls[SBX_MAX_CONNECTIONS];
  int refs[SBX_MAX_CONNECTIONS + 1];
  int n = 0, i;
  if (lst->stopped) return;
  lst->stopped = 1;
  all_remove(lst);
  uv_close((uv_handle_t *)&lst->server, server_closed);
  /* Close every connection first, then run the handlers: a handler may run
     the loop, whose close callbacks free connections. At most
     SBX_MAX_CONNECTIONS connections are in the list at once. */
  for (c = lst->conns; c != NULL; c = c->next) {
    call_t *call = conn_close(c, &refs[n]);
    if (call != NULL && n < SBX_MAX_CONNECTIONS) calls[n++] = call;
  }
  if (lst->lua_gone) L = NULL;
  for (i = 0; i < n; i++) call_closed(L, calls[i], refs[i], 1, "stopped");
  if (L != NULL) {
    sbx__unref(L, &lst->on_call_ref);
    sbx__unref(L, &lst->on_refused_ref);
    sbx__unref(L, &lst->self_ref);
  }
}

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
  lst->lp = lp;
  lst->on_call_ref = LUA_NOREF;
  lst->on_refused_ref = LUA_NOREF;
  lst->self_ref = LUA_NOREF;

  if (lua_getfield(L, 1, "path") != LUA_TSTRING)
    return luaL_error(L, "broker_listen: opts.path must be a string");
  path = lua_tolstring(L, -1, &path_len);       /* stays on the stack */
  read_routes(L, lst);
  lst->budget = sbx__opt_integer_field(L, 1, WHO, "max_calls", SBX_DEFAULT_MAX_CALLS, 1,
                                       SBX_MAX_CALLS_LIMIT);
  lst->head_ms = (uint64_t)sbx__opt_integer_field(L, 1, WHO, "header_timeout_ms",
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
  uv_pipe_init(&lp->uv, &lst->server, 0);
  lst->server.data = lst;
  lst->refs = 1;
  rc = sbx__pipe_listen_private(&lst->server, path, SBX_LISTEN_BACKLOG, on_connection,
                                server_closed);
  if (rc != 0) {
    char msg[128];
    lst->stopped = 1;
    snprintf(msg, sizeof msg, "cannot listen on the broker socket: %s", uv_strerror(rc));
    return sbx__push_failure(L, -rc, msg);
  }
  if (lua_type(L, -2) == LUA_TFUNCTION) lst->on_call_ref = sbx__ref(L, -2);
  if (lua_getfield(L, 1, "on_refused") == LUA_TFUNCTION) lst->on_refused_ref = sbx__ref(L, -1);
  lua_pop(L, 1);                                /* the box is the result again */
  all_add(lst);
  sbx__box_bind(box, lst, NULL);                /* the listener outlives its box */
  lst->refs++;                                  /* the userdata's */
  lst->self_ref = sbx__ref(L, -1);
  return 1;
}

/*
 * core.broker_reclaim(n) -> closed: closes up to n pooled connections that
 * hold nothing (still waiting for their head: no request, no call), from
 * the listeners holding the most connections first, so a new turn's charge
 * fits (fdbudget.c). Nothing is written to them and no Lua runs.
 */
static int l_broker_reclaim(lua_State *L) {
  lua_Integer want = luaL_checkinteger(L, 1);
  int closed = 0;
  while (closed < want) {
    lst_t *most = NULL, *l;
    conn_t *c, *victim = NULL;
    for (l = all_listeners; l != NULL; l = l->all_next) {
      int idle = 0;
      for (c = l->conns; c != NULL && !idle; c = c->next)
        if (c->pooled && c->state == C_HEAD) idle = 1;
      if (idle && (most == NULL || l->nconns > most->nconns)) most = l;
    }
    if (most == NULL) break;
    for (c = most->conns; c != NULL; c = c->next)
      if (c->pooled && c->state == C_HEAD) victim = c;
    conn_destroy(victim, NULL, 0);
    closed++;
  }
  lua_pushinteger(L, closed);
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
  if (lst != NULL) lst_stop(lst, L);
  return 0;
}

static int l_lst_stats(lua_State *L) {
  lst_t *lst = check_lst(L, 1);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, lst ? lst->nconns : 0);
  lua_setfield(L, -2, "connections");
  lua_pushinteger(L, lst ? lst->budget : 0);
  lua_setfield(L, -2, "budget");
  lua_pushboolean(L, lst ? lst->in_flight : 0);
  lua_setfield(L, -2, "in_flight");
  lua_pushboolean(L, lst ? lst->turn_ended : 0);
  lua_setfield(L, -2, "turn_ended");
  return 1;
}

static int l_lst_gc(lua_State *L) {
  lst_t *lst = sbx__box_detach(luaL_checkudata(L, 1, LISTENER_MT));
  if (lst == NULL) return 0;
  /* Only reached after stop() or at state close: never call Lua from here. */
  lst->lua_gone = 1;
  lst_stop(lst, NULL);
  lst_release(lst);
  return 0;
}

/* ---- call --------------------------------------------------------------- */

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
  lua_pushboolean(L, call->conn != NULL && call->conn->state == C_CALL);
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
  conn_t *c;
  int ref;

  luaL_argcheck(L, status >= 200 && status <= 599, 2, "status out of range");
  luaL_argcheck(L, ctlen > 0 && ctlen <= SBX_MAX_CONTENT_TYPE_BYTES, 4, "invalid content type");
  for (i = 0; i < ctlen; i++)
    luaL_argcheck(L, ct[i] >= 0x20 && ct[i] < 0x7f, 4, "invalid content type");
  if (call->replied) { lua_pushboolean(L, 0); return 1; }
  call->replied = 1;
  if (call->lst != NULL) call->lst->in_flight = 0;        /* step 14 */
  c = call->conn;
  if (c == NULL || c->state != C_CALL) { lua_pushboolean(L, 0); return 1; }
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
