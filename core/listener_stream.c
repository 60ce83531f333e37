/*
 * listener_stream.c: rich mode's streaming request policy over the
 * connection engine (conn.c), core.stream_listen (spec/rich-mode.md 8):
 * HTTP/1.1 on a private Unix socket, one request per connection, handed to
 * Lua as a request object whose body is read on demand and whose response
 * is written whole or streamed with backpressure. Routing and the order of
 * checks (section 9) are Lua's.
 *
 * conn.c owns the connection exactly as it does for the sealed broker's
 * listener (listener.c): accept, the connection cap (opts.max_connections,
 * at most 16), the descriptor pool and EMFILE drain of
 * shared/spec/hardening.md 2 (two connections guaranteed, the rest from the
 * shared pool; core.broker_reclaim may close an idle pooled one), the head
 * deadline, the hang-up probe, the write queue and its high-water mark,
 * shutdown and linger, close accounting and the refusal of a connection
 * over the cap. This file keeps the policy: the head is framed with
 * http_head.c's sbx__head_frame and refused only when malformed or when a
 * header name repeats (400 `bad request`); the request body is framed by
 * http_parser (Content-Length or chunked), fed with a synthetic head, so no
 * HTTP is parsed by hand here; responses are written whole or streamed.
 *
 * Objects and who frees what (libuv's rule: memory a handle uses is freed in
 * its close callback and nowhere else):
 *  - slst_t, the listener: conn.c's sbx__srv_t first (counted: the server
 *    handle, the Lua userdata and every connection hold a reference).
 *  - sconn_t, one connection: conn.c's sbx__conn_t first (its handles:
 *    the pipe, the timer, the hang-up probe and the tick that delivers a
 *    read_body result known at once on the next loop turn), then the body
 *    buffer; freed by conn.c's close callback. A response chunk is written
 *    from its Lua string where it lies, anchored until its write callback.
 *  - sreq_t, the request userdata (Lua's memory): points at its connection
 *    until the request ends (response flushed, client gone, silence, destroy,
 *    forced stop); the connection anchors it (a registry ref) until then, so
 *    it is never collected while it can still be called back. Afterwards
 *    every method is a harmless no-op.
 *
 * Timers of a connection (section 8): the head deadline from accept until
 * the head is complete (conn.c: destroyed silently); the silence timer
 * (idle_ms) only for methods other than GET and HEAD, restarted by every
 * request-body chunk, by the response head and by every response chunk,
 * stopped once the whole body has arrived and when the response is
 * complete; when it fires the connection is torn down and on_close("idle")
 * runs. No total cap.
 *
 * Lua is called only from libuv callbacks through sbx__loop(L)->L, never
 * from inside a method (results known at once wait for the tick), and never
 * once the listener userdata was collected. What C refuses on its own (the
 * connection over the cap or the pool, a head past its deadline, a
 * malformed head) is reported to opts.on_refused(reason, status) as data,
 * for the audit line (spec/operations.md 3): the reason only, never a byte
 * of the request. Nothing here logs a payload, header value, credential or
 * path.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <http_parser.h>

#include "conn.h"
#include "http_head.h"
#include "loop.h"
#include "parts.h"

#define SLST_MT "sbx.stream_listener"
#define SREQ_MT "sbx.stream_request"
#define WHO     "stream_listen"

#define CT_PLAIN "text/plain; charset=utf-8"

/* Bounds on what a handler may write in a response head. */
#define RESP_MAX_HEADERS     64
#define RESP_MAX_NAME        256
#define RESP_MAX_VALUE       8192
#define BODY_BUF_START       16384

/* request userdata user values */
enum { UV_FIELDS = 1, UV_ON_CLOSE, UV_ON_DRAIN, UV_READ_CB, UV_COUNT = UV_READ_CB };

typedef struct slst slst_t;
typedef struct sconn sconn_t;
typedef struct sreq sreq_t;

struct slst {
  sbx__srv_t srv;          /* first: conn.c's listener */
  uint64_t idle_ms;
  size_t max_body;
};

/* Body read: not started, reading, over (result delivered or pending). */
enum { B_IDLE, B_READING, B_OVER };
/* Response: nothing sent, head sent (streaming), complete. */
enum { R_NONE, R_OPEN, R_DONE };
/* A read result waiting to be delivered. */
enum { RES_NONE, RES_BODY, RES_ERROR };

struct sconn {
  sbx__conn_t base;        /* first: conn.c's connection (its buf holds the head) */
  int idle_rule;           /* not GET/HEAD: the silence timer applies */
  int head_method;         /* a HEAD request: responses carry no body */
  int minor;               /* HTTP/1.<minor> of the request */
  size_t head_len;
  /* request body */
  int body;                /* B_* */
  int has_body, chunked, expect;
  uint64_t declared;
  http_parser bp;
  int bcomplete;
  char *bbuf;
  size_t blen, bcap, blimit;
  int bres;                /* RES_* */
  int berr;                /* errno of RES_ERROR */
  const char *bmsg;        /* its message (static text) */
  /* response */
  int resp;                /* R_* */
  int resp_chunked;        /* chunked framing */
  int resp_nobody;         /* HEAD, 204, 205, 304 */
  sreq_t *req;             /* the request userdata until the request ends */
  int req_ref;
};

struct sreq {
  sconn_t *conn;           /* NULL once the request ended */
  size_t max_body;
  int started;             /* a response head was sent */
  int closed;              /* the request ended (on_close fired or due) */
  const char *reason;      /* why: "finished", "gone", "idle", "destroyed", "stopped" */
};

static void reply_plain(sconn_t *c, int status, const char *body);

/* ---- helpers ----------------------------------------------------------- */

static slst_t *lst_of(sconn_t *c) { return (slst_t *)c->base.srv; }

/* Protected: (fn, refusal) -> fn(reason, status): "connections" (0: nothing
 * written), "header_deadline" (0) or "header" (400). */
static int push_refusal(lua_State *L) {
  const sbx__refusal_t *r = lua_touserdata(L, 2);
  lua_settop(L, 1);
  lua_pushstring(L, r->reason);
  lua_pushinteger(L, r->status);
  lua_call(L, 2, 0);
  return 0;
}

/* A head C refuses itself: 400 `bad request`, reported. */
static void refuse_head(sconn_t *c) {
  sbx__srv_t *srv = c->base.srv;
  sbx__refusal_t r = {"header", 400, -1, 0, NULL, 0};
  reply_plain(c, 400, SBX_BODY_BAD_REQUEST);
  sbx__srv_report(srv, &r);
}

/* The silence rule of section 8: (re)start on activity, for POST & co only. */
static void idle_kick(sconn_t *c) {
  if (c->idle_rule && c->base.state == SBX_CONN_REQUEST) sbx__conn_arm(&c->base, lst_of(c)->idle_ms);
}

/* Queues pre .. data .. post as one write. 0, or -1 when the connection was
 * torn down instead. */
static int conn_send(sconn_t *c, const char *pre, size_t pn, const char *data, size_t dn,
                     const char *post, size_t qn) {
  uv_buf_t parts[3];
  parts[0] = uv_buf_init((char *)pre, (unsigned)pn);
  parts[1] = uv_buf_init((char *)data, (unsigned)dn);
  parts[2] = uv_buf_init((char *)post, (unsigned)qn);
  return sbx__conn_write(&c->base, parts, 3);
}

/* ---- delivering to Lua ----------------------------------------------------- */

/*
 * Calls the read_body callback of the request anchored by ref with the
 * pending result (the body, or nil, "ENAME: message", "ENAME"), once. The
 * body buffer is handed over and freed. Touches c only before calling Lua.
 */
static void deliver_read(lua_State *L, sconn_t *c, int ref) {
  int nargs, kind = c->bres;
  c->bres = RES_NONE;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  if (lua_getiuservalue(L, -1, UV_READ_CB) != LUA_TFUNCTION) {
    lua_pop(L, 2);
    return;
  }
  lua_pushnil(L);
  lua_setiuservalue(L, -3, UV_READ_CB);
  lua_remove(L, -2);                     /* the ref keeps the request alive */
  if (kind == RES_BODY) {
    lua_pushlstring(L, c->bbuf != NULL ? c->bbuf : "", c->blen);
    nargs = 1;
  } else {
    nargs = sbx__push_error(L, c->berr, c->bmsg);
  }
  free(c->bbuf);
  c->bbuf = NULL;
  c->blen = c->bcap = 0;
  sbx__pcall(L, nargs);
}

/*
 * The request ends: the request userdata is detached, a body read still
 * owed a result gets one (the reason's error), then on_close(reason) runs
 * once, then the anchor goes. Safe to call more than once.
 */
static void req_end(sconn_t *c, const char *reason) {
  sreq_t *r = c->req;
  int ref = c->req_ref;
  lua_State *L = sbx__conn_L(&c->base);
  c->req = NULL;
  c->req_ref = LUA_NOREF;
  if (r == NULL) return;
  r->conn = NULL;
  r->closed = 1;
  r->reason = reason;
  if (L == NULL) return;     /* state closing: one registry slot stays, harmless */
  if (c->body == B_READING && c->bres == RES_NONE) {
    c->bres = RES_ERROR;
    if (strcmp(reason, "gone") == 0) { c->berr = ECONNRESET; c->bmsg = "the client went away"; }
    else if (strcmp(reason, "idle") == 0) { c->berr = ETIMEDOUT; c->bmsg = "the request went silent"; }
    else { c->berr = ECANCELED; c->bmsg = "the request was ended"; }
  }
  c->body = B_OVER;
  if (c->bres != RES_NONE) deliver_read(L, c, ref);
  sbx__conn_call_uservalue(L, ref, UV_ON_CLOSE, reason);
  sbx__unref(L, &ref);
}

/* Queues one chunk of a streamed response without copying it: the Lua
 * string at idx, between its chunk-size line and CRLF (chunked) or alone.
 * 0, or -1 when the connection was torn down instead. */
static int conn_send_string(sconn_t *c, lua_State *L, int idx, int chunked) {
  char frame[24];
  size_t n;
  int fn = 0;
  lua_tolstring(L, idx, &n);
  if (chunked) fn = snprintf(frame, sizeof frame, "%zx\r\n", n);
  return sbx__conn_write_lua(&c->base, L, idx, frame, (size_t)fn, "\r\n", chunked ? 2 : 0);
}

/* ---- conn.c's hooks ------------------------------------------------------------- */

static void on_closing(sbx__conn_t *base, lua_State *L, const char *why) {
  (void)L;                 /* the request's handlers run on the loop's thread */
  req_end((sconn_t *)base, why);
}

static void on_free(sbx__conn_t *base) {
  free(((sconn_t *)base)->bbuf);
}

/* Every byte of the response was written and our side shut down: the
 * request is over (conn.c lingers next). */
static void on_finished(sbx__conn_t *base) {
  req_end((sconn_t *)base, "finished");
}

static void on_drain(sbx__conn_t *base) {
  sconn_t *c = (sconn_t *)base;
  lua_State *L = sbx__conn_L(base);
  if (L == NULL || c->req == NULL) return;
  sbx__conn_call_uservalue(L, c->req_ref, UV_ON_DRAIN, NULL);
}

/* The response is complete (queued): stop the silence timer; conn.c stops
 * reading and shuts our side down once the queue has drained. */
static void begin_close(sconn_t *c) {
  if (c->base.state != SBX_CONN_REQUEST) return;
  c->resp = R_DONE;
  sbx__conn_timer_stop(&c->base);
  sbx__conn_end(&c->base);
}

/* A complete plain answer written by C (a malformed head, a handler that
 * failed before its head): status line, content-type, content-length and
 * connection: close, then the body. */
static void reply_plain(sconn_t *c, int status, const char *body) {
  char head[256];
  size_t blen = strlen(body);
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\ncontent-type: " CT_PLAIN "\r\ncontent-length: %zu\r\n"
                   "connection: close\r\n\r\n", status, sbx__http_reason(status), blen);
  if (c->base.state != SBX_CONN_REQUEST) return;
  if (c->req != NULL) c->req->started = 1;
  c->resp = R_OPEN;
  if (conn_send(c, head, (size_t)n, body, blen, NULL, 0) == 0) begin_close(c);
}

/* ---- the request body ---------------------------------------------------------- */

static int on_body_bytes(http_parser *p, const char *at, size_t n) {
  sconn_t *c = p->data;
  int rc = sbx__reserve(&c->bbuf, &c->bcap, c->blen, n, BODY_BUF_START, c->blimit);
  if (rc != 0) { c->berr = rc == -1 ? EFBIG : ENOMEM; return 1; }
  memcpy(c->bbuf + c->blen, at, n);
  c->blen += n;
  return 0;
}

static int on_body_complete(http_parser *p) {
  sconn_t *c = p->data;
  c->bcomplete = 1;
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings body_settings = {
  .on_body = on_body_bytes, .on_message_complete = on_body_complete};

static void body_result(sconn_t *c, int err, const char *msg) {
  c->body = B_OVER;
  sbx__conn_read_stop(&c->base);
  if (err == 0) {
    c->bres = RES_BODY;
    sbx__conn_timer_stop(&c->base);          /* the whole body has arrived */
  } else {
    c->bres = RES_ERROR;
    c->berr = err;
    c->bmsg = msg;
    free(c->bbuf);
    c->bbuf = NULL;
    c->blen = c->bcap = 0;
  }
}

static void body_error(sconn_t *c, int err) {
  switch (err) {
  case EFBIG: body_result(c, EFBIG, "request body too large"); break;
  case ENOMEM: body_result(c, ENOMEM, NULL); break;
  default: body_result(c, EBADMSG, "malformed request body"); break;
  }
}

/* Feeds body bytes to the parser; 1 when the read is over. */
static int body_feed(sconn_t *c, const char *p, size_t n) {
  c->berr = 0;
  http_parser_execute(&c->bp, &body_settings, p, n);
  if (c->bcomplete) { body_result(c, 0, NULL); return 1; }
  if (HTTP_PARSER_ERRNO(&c->bp) != HPE_OK) { body_error(c, c->berr); return 1; }
  return 0;
}

/* Delivers a result the read path just produced from a libuv callback. */
static void deliver_now(sconn_t *c) {
  lua_State *L = sbx__conn_L(&c->base);
  if (L != NULL && c->req != NULL && c->bres != RES_NONE) deliver_read(L, c, c->req_ref);
}


/* ---- reading ---------------------------------------------------------------------- */

static void head_complete(sconn_t *c);

/* conn.c's head(): the head is complete in buf[0..end) (0: too big). */
static void on_head(sbx__conn_t *base, size_t end) {
  sconn_t *c = (sconn_t *)base;
  sbx__conn_read_stop(base);
  sbx__conn_timer_stop(base);
  base->state = SBX_CONN_REQUEST;
  sbx__conn_probe(base, 1);
  if (end == 0) { refuse_head(c); return; }
  c->head_len = end;
  head_complete(c);
}

static int on_alloc(sbx__conn_t *base, uv_buf_t *b) {
  (void)base;
  (void)b;
  return 0;                /* conn.c's scratch: body bytes are fed at once */
}

static void on_data(sbx__conn_t *base, const char *p, size_t n) {
  sconn_t *c = (sconn_t *)base;
  if (c->body != B_READING) return;
  idle_kick(c);
  if (body_feed(c, p, n)) deliver_now(c);
}

static void on_eof(sbx__conn_t *base, ssize_t nread) {
  sconn_t *c = (sconn_t *)base;
  if (nread != UV_EOF) { sbx__conn_close(base, SBX_CONN_GONE); return; }
  if (c->body == B_READING) {
    body_result(c, ECONNABORTED, "the client ended the request before its body");
    deliver_now(c);
  }
  /* A half-close is not "gone": the probe sees a full close. */
}

/* The silence timer. */
static void on_deadline(sbx__conn_t *base) {
  sbx__conn_close(base, "idle");
}

static void on_deferred(sbx__conn_t *base) {
  deliver_now((sconn_t *)base);
}

static void on_open(sbx__conn_t *base) {
  ((sconn_t *)base)->req_ref = LUA_NOREF;
}

static void srv_free(sbx__srv_t *srv) {
  free(srv);
}

static const sbx__conn_ops_t stream_ops = {
  sizeof(sconn_t), on_open, on_head, on_alloc, on_data, on_eof, on_deadline,
  on_drain, on_deferred, on_finished, on_closing, on_free, srv_free, push_refusal};

/* ---- the request object ---------------------------------------------------------- */

/* Protected: builds the request userdata for c (light userdata 1) from the
 * framed head (light userdata 2) and anchors it in c. */
static int build_req(lua_State *L) {
  sconn_t *c = lua_touserdata(L, 1);
  const sbx__head_req_t *rq = lua_touserdata(L, 2);
  sreq_t *r;
  size_t i;
  r = lua_newuserdatauv(L, sizeof *r, UV_COUNT);
  memset(r, 0, sizeof *r);
  luaL_setmetatable(L, SREQ_MT);
  lua_createtable(L, 0, 4);
  lua_pushlstring(L, rq->method, rq->mlen);
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, rq->target, rq->tlen);
  lua_setfield(L, -2, "target");
  lua_pushstring(L, rq->minor == 0 ? "HTTP/1.0" : "HTTP/1.1");
  lua_setfield(L, -2, "version");
  lua_createtable(L, 0, (int)rq->nfields);
  for (i = 0; i < rq->nfields; i++) {
    const sbx__head_field_t *f = &rq->fields[i];
    char name[SBX_MAX_HEAD_BYTES];
    size_t k;
    for (k = 0; k < f->nlen; k++) {
      char ch = f->name[k];
      name[k] = (ch >= 'A' && ch <= 'Z') ? (char)(ch + 32) : ch;
    }
    lua_pushlstring(L, name, f->nlen);
    lua_pushlstring(L, f->value, f->vlen);
    lua_rawset(L, -3);
  }
  lua_setfield(L, -2, "headers");
  lua_setiuservalue(L, -2, UV_FIELDS);
  c->req_ref = sbx__ref(L, -1);
  /* Nothing below can raise. */
  r->conn = c;
  r->max_body = lst_of(c)->max_body;
  c->req = r;
  return 1;
}

/* The value of header `name` (lower case) among the framed fields, or NULL. */
static const sbx__head_field_t *field(const sbx__head_req_t *rq, const char *name) {
  size_t i;
  for (i = 0; i < rq->nfields; i++)
    if (sbx__head_name_is(rq->fields[i].name, rq->fields[i].nlen, name)) return &rq->fields[i];
  return NULL;
}

static void head_complete(sconn_t *c) {
  sbx__head_req_t *rq = malloc(sizeof *rq);
  const sbx__head_field_t *f;
  lua_State *L = sbx__conn_L(&c->base);
  sreq_t *r;
  if (rq == NULL || L == NULL) { free(rq); sbx__conn_close(&c->base, "destroyed"); return; }
  if (sbx__head_frame(c->base.buf, c->head_len, rq) != 0 || rq->repeated || rq->total > rq->nfields) {
    free(rq);
    refuse_head(c);                                  /* before routing: no budget */
    return;
  }
  if (rq->te) {
    f = field(rq, "transfer-encoding");
    if (f == NULL || !sbx__head_name_is(f->value, f->vlen, "chunked")) {
      free(rq);
      refuse_head(c);
      return;
    }
    c->chunked = 1;
  }
  c->has_body = c->chunked || (rq->has_length && rq->length > 0);
  c->declared = rq->has_length ? rq->length : 0;
  f = field(rq, "expect");
  c->expect = f != NULL && sbx__head_name_is(f->value, f->vlen, "100-continue");
  c->minor = rq->minor;
  c->head_method = rq->mlen == 4 && memcmp(rq->method, "HEAD", 4) == 0;
  c->idle_rule = !c->head_method && !(rq->mlen == 3 && memcmp(rq->method, "GET", 3) == 0);
  if (c->has_body) idle_kick(c);               /* the body is still to come */

  lua_pushcfunction(L, build_req);
  lua_pushlightuserdata(L, c);
  lua_pushlightuserdata(L, rq);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
    lua_pop(L, 1);
    free(rq);
    reply_plain(c, 400, SBX_BODY_BAD_REQUEST);
    return;
  }
  free(rq);
  r = c->req;
  /* The request stays on the stack below the call, so r cannot be
   * collected before it is read again (sbx__pcall clears the stack only
   * after an error, when nothing allocates any more). */
  lua_rawgeti(L, LUA_REGISTRYINDEX, lst_of(c)->srv.handler_ref);
  lua_pushvalue(L, -2);
  if (sbx__pcall(L, 1) == 0) {
    lua_pop(L, 1);
  } else if (r->conn != NULL) {
    /* A handler error: 400 before the head, destroyed after (section 8). */
    sconn_t *cc = r->conn;
    if (cc->resp == R_NONE) reply_plain(cc, 400, SBX_BODY_BAD_REQUEST);
    else sbx__conn_close(&cc->base, "destroyed");
  }
}

/* ---- listener lifecycle ---------------------------------------------------------- */

static slst_t *check_lst(lua_State *L, int idx) {
  return sbx__box_check(L, idx, SLST_MT);
}

/* core.stream_listen(opts) -> listener | nil, message, ENAME */
static int l_stream_listen(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  const char *path;
  size_t path_len;
  slst_t *lst;
  sbx__box_t *box;
  lua_Integer max_conns, head_ms, idle_ms, max_body;
  int rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_getfield(L, 1, "path") != LUA_TSTRING)
    return luaL_error(L, WHO ": opts.path must be a string");
  path = lua_tolstring(L, -1, &path_len);       /* stays on the stack */
  if (strlen(path) != path_len || path_len == 0)
    return luaL_error(L, WHO ": opts.path must be a non-empty path");
  max_conns = sbx__opt_integer_field(L, 1, WHO, "max_connections", SBX_STREAM_MAX_CONNECTIONS, 1,
                                     SBX_STREAM_MAX_CONNECTIONS);
  head_ms = sbx__opt_integer_field(L, 1, WHO, "header_timeout_ms", SBX_STREAM_HEADER_DEADLINE_MS, 1,
                                   SBX_STREAM_HEADER_DEADLINE_MS);
  idle_ms = sbx__opt_integer_field(L, 1, WHO, "idle_ms", SBX_STREAM_IDLE_MS, 1, SBX_STREAM_IDLE_MS);
  max_body = sbx__opt_integer_field(L, 1, WHO, "max_body", SBX_STREAM_MAX_BODY_BYTES, 0,
                                    SBX_STREAM_MAX_BODY_BYTES);
  if (lua_getfield(L, 1, "on_request") != LUA_TFUNCTION)
    return luaL_error(L, WHO ": opts.on_request must be a function");
  if (lua_getfield(L, 1, "on_refused") != LUA_TNIL && !lua_isfunction(L, -1))
    return luaL_error(L, WHO ": opts.on_refused must be a function");
  if (path_len > SBX_MAX_SOCKET_PATH)
    return sbx__push_failure(L, ENAMETOOLONG, "broker socket path too long");

  box = sbx__box_new(L, SLST_MT);                /* may raise: before any C memory */
  lst = calloc(1, sizeof *lst);
  if (lst == NULL) return sbx__push_error(L, ENOMEM, NULL);
  lst->srv.max_conns = (int)max_conns;
  lst->srv.head_ms = (uint64_t)head_ms;
  lst->idle_ms = (uint64_t)idle_ms;
  lst->max_body = (size_t)max_body;
  rc = sbx__srv_listen(&lst->srv, lp, &stream_ops, path);
  if (rc != 0) return sbx__srv_push_listen_failure(L, rc);
  lst->srv.handler_ref = sbx__ref(L, -3);
  sbx__srv_adopt(L, &lst->srv, box, -2);
  return 1;
}

/* listener:stop([force]) */
static int l_lst_stop(lua_State *L) {
  slst_t *lst = check_lst(L, 1);
  if (lst != NULL) sbx__srv_stop(&lst->srv, L, lua_toboolean(L, 2));
  return 0;
}

static int l_lst_stats(lua_State *L) {
  slst_t *lst = check_lst(L, 1);
  sbx__srv_push_stats(L, lst ? &lst->srv : NULL, 1);
  lua_pushboolean(L, lst ? lst->srv.stopped : 1);
  lua_setfield(L, -2, "stopped");
  return 1;
}

static int l_lst_gc(lua_State *L) {
  return sbx__srv_gc_box(L, SLST_MT);
}

/* ---- request methods ---------------------------------------------------------------- */

static sreq_t *check_req(lua_State *L) {
  return luaL_checkudata(L, 1, SREQ_MT);
}

/* The open connection of r for a response, or NULL. */
static sconn_t *open_conn(sreq_t *r) {
  return r->conn != NULL && r->conn->base.state == SBX_CONN_REQUEST ? r->conn : NULL;
}

/* req:read_body([limit,] cb) -> true | nil, err, ENAME. cb(body) or
 * cb(nil, "ENAME: message", "ENAME"), once, from the loop. */
static int l_req_read_body(lua_State *L) {
  sreq_t *r = check_req(L);
  lua_Integer limit;
  int cbi = 3;
  sconn_t *c;
  if (lua_isfunction(L, 2)) { cbi = 2; limit = (lua_Integer)r->max_body; }
  else limit = luaL_optinteger(L, 2, (lua_Integer)r->max_body);
  luaL_checktype(L, cbi, LUA_TFUNCTION);
  luaL_argcheck(L, limit >= 0 && (size_t)limit <= r->max_body, 2, "limit out of range");
  c = open_conn(r);
  if (c == NULL) return sbx__push_error(L, ECONNABORTED, "the request has ended");
  if (c->body != B_IDLE) return sbx__push_error(L, EALREADY, "the body is already read");
  if (c->resp != R_NONE) return sbx__push_error(L, ECANCELED, "a response was started");
  lua_pushvalue(L, cbi);
  lua_setiuservalue(L, 1, UV_READ_CB);
  c->blimit = (size_t)limit;
  c->body = B_READING;
  if (!c->has_body) {
    body_result(c, 0, NULL);
  } else if (!c->chunked && c->declared > (uint64_t)limit) {
    body_result(c, EFBIG, "request body too large");      /* refused unread */
  } else {
    static const char cl_head[] = "POST / HTTP/1.1\r\nContent-Length: %llu\r\n\r\n";
    static const char te_head[] = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    char synth[96];
    int n = c->chunked ? snprintf(synth, sizeof synth, "%s", te_head)
                       : snprintf(synth, sizeof synth, cl_head, (unsigned long long)c->declared);
    http_parser_init(&c->bp, HTTP_REQUEST);
    c->bp.data = c;
    http_parser_execute(&c->bp, &body_settings, synth, (size_t)n);
    if (c->expect && c->minor == 1) {
      static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      if (conn_send(c, cont, sizeof cont - 1, NULL, 0, NULL, 0) != 0) {
        lua_pushboolean(L, 1);                /* torn down: cb ran with the error */
        return 1;
      }
    }
    if (c->base.len > c->head_len && body_feed(c, c->base.buf + c->head_len, c->base.len - c->head_len)) {
      /* the whole body came with the head */
    } else {
      sbx__conn_read_start(&c->base);
    }
  }
  if (c->bres != RES_NONE) sbx__conn_defer(&c->base);
  lua_pushboolean(L, 1);
  return 1;
}

/* Ends a body read still running when a response starts (its cb gets
 * ECANCELED on the next turn). */
static void cancel_read(sconn_t *c) {
  if (c->body != B_READING) return;
  body_result(c, ECANCELED, "a response was started before the body was read");
  sbx__conn_defer(&c->base);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int is_reserved(const char *name, size_t n) {
  return sbx__head_name_is(name, n, "content-length") ||
         sbx__head_name_is(name, n, "transfer-encoding") ||
         sbx__head_name_is(name, n, "connection");
}

/*
 * Pushes the response head for status, the headers table at hidx (nil: none;
 * names are tokens of at most RESP_MAX_NAME bytes, values strings without
 * CR, LF, NUL or other controls but HT, at most RESP_MAX_VALUE bytes; the
 * framing names are the listener's) written in name order, then `framing`
 * (a "name: value\r\n" line or "") and `connection: close`. Raises on a
 * malformed argument.
 */
static void push_head(lua_State *L, int status, int hidx, const char *framing) {
  const char *names[RESP_MAX_HEADERS];
  int n = 0, i;
  luaL_Buffer b;
  if (!lua_isnoneornil(L, hidx)) {
    luaL_checktype(L, hidx, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, hidx) != 0) {
      size_t nl, vl, k;
      const char *name, *value;
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "response headers must map names to strings");
      name = lua_tolstring(L, -2, &nl);
      value = lua_tolstring(L, -1, &vl);
      if (nl == 0 || nl > RESP_MAX_NAME) luaL_error(L, "invalid response header name");
      for (k = 0; k < nl; k++)
        if (!sbx__http_is_tchar((unsigned char)name[k])) luaL_error(L, "invalid response header name");
      if (is_reserved(name, nl)) luaL_error(L, "the %s header is set by the listener", name);
      if (vl > RESP_MAX_VALUE) luaL_error(L, "response header value too long");
      for (k = 0; k < vl; k++) {
        unsigned char ch = (unsigned char)value[k];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
          luaL_error(L, "response header value holds a control character");
      }
      if (n == RESP_MAX_HEADERS) luaL_error(L, "too many response headers");
      names[n++] = name;                  /* anchored by the table */
      lua_pop(L, 1);
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_names);
  }
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "HTTP/1.1 %d %s\r\n", status, sbx__http_reason(status));
  luaL_addvalue(&b);
  for (i = 0; i < n; i++) {
    luaL_addstring(&b, names[i]);
    luaL_addlstring(&b, ": ", 2);
    lua_getfield(L, hidx, names[i]);
    luaL_addvalue(&b);
    luaL_addlstring(&b, "\r\n", 2);
  }
  luaL_addstring(&b, framing);
  luaL_addstring(&b, "connection: close\r\n\r\n");
  luaL_pushresult(&b);
}

static int check_status(lua_State *L) {
  lua_Integer status = luaL_checkinteger(L, 2);
  luaL_argcheck(L, status >= 200 && status <= 599, 2, "status out of range");
  return (int)status;
}

static int no_body_status(int status) {
  return status == 204 || status == 205 || status == 304;
}

/* req:respond(status, headers, body) -> true if queued, false when the
 * request has ended or a response was already started. */
static int l_req_respond(lua_State *L) {
  sreq_t *r = check_req(L);
  int status = check_status(L);
  size_t blen = 0, hlen;
  const char *body = luaL_optlstring(L, 4, "", &blen);
  const char *head;
  char framing[64];
  sconn_t *c;
  if (status == 204 || status == 304) framing[0] = '\0';
  else snprintf(framing, sizeof framing, "content-length: %zu\r\n", status == 205 ? (size_t)0 : blen);
  push_head(L, status, 3, framing);
  head = lua_tolstring(L, -1, &hlen);
  c = open_conn(r);
  if (c == NULL || c->resp != R_NONE) { lua_pushboolean(L, 0); return 1; }
  cancel_read(c);
  r->started = 1;
  c->resp = R_OPEN;
  if (c->head_method || no_body_status(status)) blen = 0;
  if (conn_send(c, head, hlen, body, blen, NULL, 0) == 0) begin_close(c);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:start(status, headers) -> true if queued, false otherwise. */
static int l_req_start(lua_State *L) {
  sreq_t *r = check_req(L);
  int status = check_status(L);
  sconn_t *c = open_conn(r);
  int nobody, chunked;
  size_t hlen;
  const char *head;
  nobody = (c != NULL && c->head_method) || no_body_status(status);
  chunked = !nobody && c != NULL && c->minor == 1;
  push_head(L, status, 3, status == 205 ? "content-length: 0\r\n"
                          : chunked ? "transfer-encoding: chunked\r\n" : "");
  head = lua_tolstring(L, -1, &hlen);
  if (c == NULL || c->resp != R_NONE) { lua_pushboolean(L, 0); return 1; }
  cancel_read(c);
  r->started = 1;
  c->resp = R_OPEN;
  c->resp_nobody = nobody;
  c->resp_chunked = chunked;
  if (conn_send(c, head, hlen, NULL, 0, NULL, 0) != 0) { lua_pushboolean(L, 0); return 1; }
  idle_kick(c);                                  /* the response head restarts it */
  lua_pushboolean(L, 1);
  return 1;
}

/* req:write(chunk) -> ok, backpressured */
static int l_req_write(lua_State *L) {
  sreq_t *r = check_req(L);
  size_t n;
  sconn_t *c;
  int pressured;
  luaL_checklstring(L, 2, &n);
  c = open_conn(r);
  if (c == NULL || c->resp != R_OPEN) {
    lua_pushboolean(L, 0);
    lua_pushboolean(L, 0);
    return 2;
  }
  if (n > 0 && !c->resp_nobody) {
    if (conn_send_string(c, L, 2, c->resp_chunked) != 0) {
      lua_pushboolean(L, 0);
      lua_pushboolean(L, 0);
      return 2;
    }
    idle_kick(c);                                /* every response chunk restarts it */
  }
  pressured = sbx__conn_pressured(&c->base);
  lua_pushboolean(L, 1);
  lua_pushboolean(L, pressured);
  return 2;
}

/* req:finish() -> true if the end of the response was queued. */
static int l_req_finish(lua_State *L) {
  sreq_t *r = check_req(L);
  sconn_t *c = open_conn(r);
  if (c == NULL || c->resp != R_OPEN) { lua_pushboolean(L, 0); return 1; }
  if (c->resp_chunked && conn_send(c, "0\r\n\r\n", 5, NULL, 0, NULL, 0) != 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  begin_close(c);
  lua_pushboolean(L, 1);
  return 1;
}

/* req:destroy(): tears the connection down now (on_close("destroyed")). */
static int l_req_destroy(lua_State *L) {
  sreq_t *r = check_req(L);
  if (r->conn != NULL) sbx__conn_close(&r->conn->base, "destroyed");
  return 0;
}

/* req:fail(): the handler failed: 400 `bad request` when no head was sent,
 * else the connection is destroyed (section 8). */
static int l_req_fail(lua_State *L) {
  sreq_t *r = check_req(L);
  sconn_t *c = open_conn(r);
  if (c == NULL) {
    if (r->conn != NULL) sbx__conn_close(&r->conn->base, "destroyed");
    return 0;
  }
  if (c->resp == R_NONE) {
    cancel_read(c);
    reply_plain(c, 400, SBX_BODY_BAD_REQUEST);
  } else {
    sbx__conn_close(&c->base, "destroyed");
  }
  return 0;
}

/* req:on_close(fn): fn(reason) once when the request ends; at once when it
 * already has. */
static int l_req_on_close(lua_State *L) {
  sreq_t *r = check_req(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 1, UV_ON_CLOSE);
  if (r->closed) {
    lua_pushstring(L, r->reason);
    lua_call(L, 1, 0);
  }
  return 0;
}

/* req:on_drain(fn): fn() each time the queue falls below the high-water
 * mark after a write reported backpressure. */
static int l_req_on_drain(lua_State *L) {
  check_req(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_setiuservalue(L, 1, UV_ON_DRAIN);
  return 0;
}

static int l_req_is_open(lua_State *L) {
  lua_pushboolean(L, open_conn(check_req(L)) != NULL);
  return 1;
}

static int l_req_headers_sent(lua_State *L) {
  lua_pushboolean(L, check_req(L)->started);
  return 1;
}

static int l_req_queued(lua_State *L) {
  sconn_t *c = open_conn(check_req(L));
  lua_pushinteger(L, c ? (lua_Integer)sbx__conn_queued(&c->base) : 0);
  return 1;
}

/* __index: a method, else a field (method, target, version, headers). */
static int l_req_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  if (lua_getiuservalue(L, 1, UV_FIELDS) != LUA_TTABLE) return 1;
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

static int l_req_gc(lua_State *L) {
  sreq_t *r = lua_touserdata(L, 1);
  /* Only at state close (the connection anchors it while open). */
  if (r->conn != NULL) {
    r->conn->req = NULL;
    r->conn->req_ref = LUA_NOREF;
    r->conn = NULL;
  }
  return 0;
}

void sbx__open_listener_stream(lua_State *L) {
  static const luaL_Reg lst_methods[] = {{"stop", l_lst_stop}, {"stats", l_lst_stats}, {NULL, NULL}};
  static const luaL_Reg req_methods[] = {
    {"read_body", l_req_read_body}, {"respond", l_req_respond}, {"start", l_req_start},
    {"write", l_req_write}, {"finish", l_req_finish}, {"destroy", l_req_destroy},
    {"fail", l_req_fail}, {"on_close", l_req_on_close}, {"on_drain", l_req_on_drain},
    {"is_open", l_req_is_open}, {"headers_sent", l_req_headers_sent}, {"queued", l_req_queued},
    {NULL, NULL}};
  sbx__class(L, SLST_MT, lst_methods, l_lst_gc);
  if (luaL_newmetatable(L, SREQ_MT)) {
    lua_newtable(L);
    luaL_setfuncs(L, req_methods, 0);
    lua_pushcclosure(L, l_req_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_req_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_stream_listen);
  lua_setfield(L, -2, "stream_listen");
}
