/*
 * unix_stream.c: core.unix_stream, a duplex byte stream over a Unix socket
 * with data delivered as it arrives. The Engine API container driver
 * (lua/sandbox/drivers/engine.lua) speaks HTTP/1.1 to the local Docker
 * daemon over it, including the attach endpoint's hijacked stream, where
 * stdin may only be written after the daemon's 101 answer has been read
 * (bytes sent earlier are dropped by the daemon).
 *
 *   core.unix_stream(path, on_event) -> stream | nil, "ENAME: message", "ENAME"
 *     on_event("data", bytes)   per chunk read (at most 64 KiB each)
 *     on_event("end", err)      once: err nil at EOF, "connect" or "io"
 *   stream:write(bytes)         queued until connected; false once ended
 *   stream:shutdown()           half-close the write side after the writes
 *   stream:close()              abort; no event after this
 *
 * One stream = one heap block owning a uv_pipe_t, freed in the pipe's close
 * callback only. The Lua userdata points at it; both sides clear the pointer
 * when they go away, so a dropped userdata does not abort the stream (the
 * callback is held in the registry until "end" or close). Lua enforces any
 * size cap (it sees every chunk and closes the stream). Nothing here logs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "loop.h"
#include "parts.h"

#define STREAM_MT "sbx.unix_stream"
#define STREAM_READ_CHUNK 65536
#define STREAM_MAX_WRITE (64 * 1024 * 1024)

typedef struct stream {
  uv_pipe_t pipe;
  uv_connect_t creq;
  uv_shutdown_t sreq;
  sbx__box_t *box;
  int cb_ref;
  int done;             /* "end" delivered or closed: no more events */
  int connected;
  int shut, shut_pending;
  char *early;          /* writes queued before the connect completed */
  size_t early_len;
} stream_t;

typedef struct {
  uv_write_t w;
  char data[];
} wreq_t;

static void stream_closed(uv_handle_t *h) {
  stream_t *s = h->data;
  sbx__box_unbind(s->box);
  free(s->early);
  free(s);
}

static void stream_close(stream_t *s, lua_State *L) {
  if (!s->done) {
    s->done = 1;
    if (L != NULL) sbx__unref(L, &s->cb_ref);
  }
  if (!uv_is_closing((uv_handle_t *)&s->pipe)) uv_close((uv_handle_t *)&s->pipe, stream_closed);
}

/* Delivers on_event("end", err) once and closes. */
static void stream_end(stream_t *s, const char *err) {
  sbx__loop_t *lp = s->pipe.loop->data;
  lua_State *L = lp->L;
  int ref = s->cb_ref;
  if (s->done) return;
  s->done = 1;
  s->cb_ref = LUA_NOREF;
  stream_close(s, NULL);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_pushliteral(L, "end");
  if (err != NULL) lua_pushstring(L, err); else lua_pushnil(L);
  sbx__pcall(L, 2);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)h;
  (void)suggested;
  b->base = malloc(STREAM_READ_CHUNK);
  b->len = b->base != NULL ? STREAM_READ_CHUNK : 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  stream_t *s = st->data;
  if (s->done) {
    free(b->base);
    return;
  }
  if (nread > 0) {
    sbx__loop_t *lp = s->pipe.loop->data;
    lua_State *L = lp->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->cb_ref);
    lua_pushliteral(L, "data");
    lua_pushlstring(L, b->base, (size_t)nread);
    free(b->base);
    sbx__pcall(L, 2);   /* may close s; its memory lives until the close cb */
    return;
  }
  free(b->base);
  if (nread == UV_EOF) stream_end(s, NULL);
  else if (nread < 0) stream_end(s, "io");
}

static void on_write(uv_write_t *w, int status) {
  (void)status;           /* the read side decides the outcome */
  free(w);
}

static int stream_write(stream_t *s, const char *p, size_t n) {
  wreq_t *w;
  uv_buf_t b;
  if (n == 0) return 0;
  w = malloc(sizeof *w + n);
  if (w == NULL) return UV_ENOMEM;
  memcpy(w->data, p, n);
  b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->w, (uv_stream_t *)&s->pipe, &b, 1, on_write) != 0) {
    free(w);
    return UV_EPIPE;
  }
  return 0;
}

static void on_shutdown(uv_shutdown_t *r, int status) {
  (void)r;
  (void)status;
}

static void stream_shutdown(stream_t *s) {
  if (s->shut) return;
  s->shut = 1;
  uv_shutdown(&s->sreq, (uv_stream_t *)&s->pipe, on_shutdown);
}

static void on_connect(uv_connect_t *c, int status) {
  stream_t *s = c->data;
  if (s->done) return;
  if (status < 0) {
    stream_end(s, "connect");
    return;
  }
  s->connected = 1;
  if (uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read) != 0) {
    stream_end(s, "io");
    return;
  }
  stream_write(s, s->early, s->early_len);
  free(s->early);
  s->early = NULL;
  s->early_len = 0;
  if (s->shut_pending) stream_shutdown(s);
}

static stream_t *check_stream(lua_State *L) {
  return sbx__box_check(L, 1, STREAM_MT);
}

/* core.unix_stream(path, on_event) -> stream | nil, err */
static int l_unix_stream(lua_State *L) {
  struct sockaddr_un sun;
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  sbx__loop_t *lp = sbx__loop(L);
  sbx__box_t *box;
  stream_t *s;
  int ref;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (len == 0 || len >= sizeof sun.sun_path || strlen(path) != len)
    return sbx__push_error(L, len >= sizeof sun.sun_path ? ENAMETOOLONG : EINVAL, "invalid socket path");
  box = sbx__box_new(L, STREAM_MT);
  ref = sbx__ref(L, 2);
  s = calloc(1, sizeof *s);   /* nothing below raises */
  if (s == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return sbx__push_error(L, ENOMEM, NULL);
  }
  s->cb_ref = ref;
  sbx__box_bind(box, s, &s->box);
  uv_pipe_init(&lp->uv, &s->pipe, 0);
  s->pipe.data = s;
  s->creq.data = s;
  s->sreq.data = s;
  uv_pipe_connect(&s->creq, &s->pipe, path, on_connect);
  return 1;
}

static int l_write(lua_State *L) {
  stream_t *s = check_stream(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  luaL_argcheck(L, n <= STREAM_MAX_WRITE, 2, "too large");
  if (s == NULL || s->done || s->shut || s->shut_pending) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (!s->connected) {
    char *q = realloc(s->early, s->early_len + n + 1);
    if (q == NULL) return luaL_error(L, "out of memory");
    memcpy(q + s->early_len, p, n);
    s->early = q;
    s->early_len += n;
  } else if (stream_write(s, p, n) != 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_shutdown(lua_State *L) {
  stream_t *s = check_stream(L);
  if (s == NULL || s->done) return 0;
  if (!s->connected) s->shut_pending = 1;
  else stream_shutdown(s);
  return 0;
}

static int l_close(lua_State *L) {
  stream_t *s = check_stream(L);
  if (s != NULL) stream_close(s, L);
  return 0;
}

void sbx__open_unix_stream(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"write", l_write}, {"shutdown", l_shutdown}, {"close", l_close}, {NULL, NULL}};
  sbx__class(L, STREAM_MT, methods, sbx__box_gc);   /* a dropped stream goes on */
  lua_pushcfunction(L, l_unix_stream);
  lua_setfield(L, -2, "unix_stream");
}
