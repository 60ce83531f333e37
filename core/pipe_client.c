/*
 * pipe_client.c: core.unix_request, a raw client for Unix stream sockets.
 * Specs and CLI tools use it to send bytes exactly as given (hostile heads
 * included), to hold idle connections open and dribble requests, and to see
 * whether the server closed without writing anything (data == "").
 *
 * One request = one heap block (req_t) owning a uv_pipe_t and a uv_timer_t,
 * freed when both close callbacks have run and the Lua handle (a userdata
 * holding a pointer to it) has been collected: the block is reference
 * counted (handles: 1, userdata: 1). Each write owns its own small request
 * block, freed in its write callback. The result callback runs once, on the
 * thread running core.run(), unless handle:close() came first.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "sbx_internal.h"

#define CLIENT_MT "sbx.unix_request"
#define CLIENT_READ_CHUNK 65536

typedef struct req {
  uv_pipe_t pipe;
  uv_timer_t timer;
  uv_connect_t creq;
  uv_shutdown_t sreq;
  sbx__loop_t *lp;
  int refs;               /* handles (until both closed) + the userdata */
  int handles;
  int cb_ref;
  int done;               /* result delivered, or aborted by close() */
  int connected;
  int keep_open;
  int shut;               /* shutdown requested */
  int shut_pending;       /* requested before the connect completed */
  char *early;            /* bytes written before the connect completed */
  size_t early_len;
  char *in;               /* what was read */
  size_t in_len, in_cap, max_bytes;
} req_t;

typedef struct { req_t *r; } req_box_t;

typedef struct {
  uv_write_t w;
  size_t len;
  char data[];
} wreq_t;

typedef struct {
  req_t *r;
  const char *error;      /* NULL: ok */
} result_t;

static void req_release(req_t *r) {
  if (--r->refs > 0) return;
  free(r->in);
  free(r->early);
  free(r);
}

static void req_handle_closed(uv_handle_t *h) {
  req_t *r = h->data;
  if (--r->handles == 0) req_release(r);
}

/* Ends the exchange: closes both handles; no callback after this. */
static void req_close(req_t *r, lua_State *L) {
  if (r->done) return;
  r->done = 1;
  uv_close((uv_handle_t *)&r->pipe, req_handle_closed);
  uv_close((uv_handle_t *)&r->timer, req_handle_closed);
  if (L != NULL) sbx__unref(L, &r->cb_ref);
}

/* Protected: builds the result table and calls the callback with it. */
static int deliver(lua_State *L) {
  result_t *res = lua_touserdata(L, 1);
  req_t *r = res->r;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->cb_ref);   /* r is alive until lua_call */
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, res->error == NULL);
  lua_setfield(L, -2, "ok");
  if (res->error != NULL) {
    lua_pushstring(L, res->error);
    lua_setfield(L, -2, "error");
  }
  lua_pushlstring(L, r->in ? r->in : "", r->in_len);
  lua_setfield(L, -2, "data");
  lua_call(L, 1, 0);
  return 0;
}

static void finish(req_t *r, const char *error) {
  lua_State *L = r->lp->L;
  result_t res;
  int ref = r->cb_ref;
  if (r->done) return;
  req_close(r, NULL);
  res.r = r;
  res.error = error;
  lua_pushcfunction(L, deliver);
  lua_pushlightuserdata(L, &res);
  /* r may be freed once this returns (the callback can run the loop and
     collect the handle): only locals from here on. */
  sbx__pcall(L, 1);
  sbx__unref(L, &ref);
}

static void on_timeout(uv_timer_t *t) {
  finish(t->data, "timeout");
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  req_t *r = h->data;
  size_t limit = r->max_bytes + 1;       /* one byte over tells "too large" */
  (void)suggested;
  if (r->in_cap - r->in_len < CLIENT_READ_CHUNK && r->in_cap < limit) {
    size_t cap = r->in_cap ? r->in_cap * 2 : CLIENT_READ_CHUNK;
    char *p;
    if (cap < r->in_len + CLIENT_READ_CHUNK) cap = r->in_len + CLIENT_READ_CHUNK;
    if (cap > limit) cap = limit;
    p = realloc(r->in, cap);
    if (p != NULL) { r->in = p; r->in_cap = cap; }
  }
  *b = uv_buf_init(r->in ? r->in + r->in_len : NULL, (unsigned)(r->in_cap - r->in_len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  req_t *r = s->data;
  (void)b;
  if (r->done || nread == 0) return;
  if (nread == UV_EOF) { finish(r, NULL); return; }
  if (nread < 0) { finish(r, "io"); return; }
  r->in_len += (size_t)nread;
  if (r->in_len > r->max_bytes) {
    r->in_len = r->max_bytes;
    finish(r, "too large");
  }
}

static void on_write(uv_write_t *w, int status) {
  /* A failed write (the server closed early) is not the result: the read
     side decides, so a reply written before the close is still seen. */
  (void)status;
  free(w->data);
}

static int req_write(req_t *r, const char *s, size_t n) {
  wreq_t *w;
  uv_buf_t b;
  if (n == 0) return 0;
  w = malloc(sizeof *w + n);
  if (w == NULL) return UV_ENOMEM;
  memcpy(w->data, s, n);
  w->len = n;
  w->w.data = w;
  b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->w, (uv_stream_t *)&r->pipe, &b, 1, on_write) != 0) {
    free(w);
    return UV_EPIPE;
  }
  return 0;
}

static void on_shutdown(uv_shutdown_t *s, int status) {
  (void)s;
  (void)status;
}

static int req_shutdown(req_t *r) {
  if (r->shut) return 0;
  r->shut = 1;
  r->sreq.data = r;
  return uv_shutdown(&r->sreq, (uv_stream_t *)&r->pipe, on_shutdown);
}

static void on_connect(uv_connect_t *c, int status) {
  req_t *r = c->data;
  if (r->done) return;
  if (status < 0) { finish(r, "connect"); return; }
  r->connected = 1;
  if (uv_read_start((uv_stream_t *)&r->pipe, on_alloc, on_read) != 0) {
    finish(r, "io");
    return;
  }
  req_write(r, r->early, r->early_len);
  free(r->early);
  r->early = NULL;
  r->early_len = 0;
  if (r->shut_pending) req_shutdown(r);
}

static req_t *check_req(lua_State *L) {
  req_box_t *b = luaL_checkudata(L, 1, CLIENT_MT);
  return b->r;
}

static lua_Integer opt_int(lua_State *L, int t, const char *k, lua_Integer dflt,
                           lua_Integer lo, lua_Integer hi) {
  lua_Integer v;
  int isnum;
  if (lua_getfield(L, t, k) == LUA_TNIL) { lua_pop(L, 1); return dflt; }
  v = lua_tointegerx(L, -1, &isnum);
  if (!isnum || v < lo || v > hi) luaL_error(L, "unix_request: opts.%s out of range", k);
  lua_pop(L, 1);
  return v;
}

static int opt_bool(lua_State *L, int t, const char *k, int dflt) {
  int v;
  if (lua_getfield(L, t, k) == LUA_TNIL) { lua_pop(L, 1); return dflt; }
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* core.unix_request(path, bytes, opts, cb) -> handle | nil, err */
static int l_unix_request(lua_State *L) {
  struct sockaddr_un sun;
  size_t path_len, n;
  const char *path = luaL_checklstring(L, 1, &path_len);
  const char *bytes = luaL_checklstring(L, 2, &n);
  sbx__loop_t *lp = sbx__loop(L);
  lua_Integer timeout_ms, max_bytes;
  int keep_open, half_close, cb_ref;
  req_box_t *box;
  req_t *r;

  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  else { lua_newtable(L); lua_replace(L, 3); }
  luaL_checktype(L, 4, LUA_TFUNCTION);
  timeout_ms = opt_int(L, 3, "timeout_ms", SBX_CLIENT_TIMEOUT_MS, 1, 86400000);
  max_bytes = opt_int(L, 3, "max_bytes", SBX_CLIENT_MAX_BYTES, 0, (lua_Integer)1 << 30);
  keep_open = opt_bool(L, 3, "keep_open", 0);
  half_close = opt_bool(L, 3, "half_close", 1);
  if (path_len == 0 || path_len >= sizeof sun.sun_path || strlen(path) != path_len) {
    lua_pushnil(L);
    lua_pushliteral(L, "invalid socket path");
    return 2;
  }
  box = lua_newuserdatauv(L, sizeof *box, 0);
  box->r = NULL;
  luaL_setmetatable(L, CLIENT_MT);
  cb_ref = sbx__ref(L, 4);
  /* Nothing below raises, so nothing can leak. */
  r = calloc(1, sizeof *r);
  if (r != NULL && n > 0 && (r->early = malloc(n)) == NULL) { free(r); r = NULL; }
  if (r == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, cb_ref);
    lua_pushnil(L);
    lua_pushliteral(L, "out of memory");
    return 2;
  }
  if (n > 0) memcpy(r->early, bytes, n);
  r->early_len = n;
  r->lp = lp;
  r->max_bytes = (size_t)max_bytes;
  r->keep_open = keep_open;
  r->shut_pending = !keep_open && half_close;
  r->cb_ref = cb_ref;
  uv_pipe_init(&lp->uv, &r->pipe, 0);
  uv_timer_init(&lp->uv, &r->timer);
  r->pipe.data = r;
  r->timer.data = r;
  r->handles = 2;
  r->refs = 2;
  box->r = r;
  r->creq.data = r;
  uv_pipe_connect(&r->creq, &r->pipe, path, on_connect);
  uv_timer_start(&r->timer, on_timeout, (uint64_t)timeout_ms, 0);
  return 1;
}

/* handle:write(bytes) -> true | nil, err  (opts.keep_open requests only) */
static int l_req_write(lua_State *L) {
  req_t *r = check_req(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  int rc = 0;
  if (r == NULL || r->done || !r->keep_open || r->shut) {
    lua_pushnil(L);
    lua_pushliteral(L, "not writable");
    return 2;
  }
  if (!r->connected) {
    char *p = realloc(r->early, r->early_len + n + 1);
    if (p == NULL) return luaL_error(L, "out of memory");
    memcpy(p + r->early_len, s, n);
    r->early = p;
    r->early_len += n;
  } else {
    rc = req_write(r, s, n);
  }
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, uv_err_name(rc));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* handle:shutdown(): half-close the write side (keep_open requests). */
static int l_req_shutdown(lua_State *L) {
  req_t *r = check_req(L);
  if (r == NULL || r->done) return 0;
  if (!r->connected) r->shut_pending = 1;
  else req_shutdown(r);
  return 0;
}

/* handle:close(): abort; the callback never runs after this. */
static int l_req_close(lua_State *L) {
  req_t *r = check_req(L);
  if (r != NULL) req_close(r, L);
  return 0;
}

static int l_req_gc(lua_State *L) {
  req_box_t *b = luaL_checkudata(L, 1, CLIENT_MT);
  /* A collected handle does not abort the exchange; it only lets go. */
  if (b->r != NULL) req_release(b->r);
  b->r = NULL;
  return 0;
}

void sbx__open_pipe_client(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"write", l_req_write}, {"shutdown", l_req_shutdown}, {"close", l_req_close},
    {NULL, NULL}};
  sbx__class(L, CLIENT_MT, methods, l_req_gc);
  lua_pushcfunction(L, l_unix_request);
  lua_setfield(L, -2, "unix_request");
}
