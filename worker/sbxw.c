/*
 * sbxw.c: the primitive module `sbxw` (worker/PRIMITIVES.md): assembles the
 * table from the other files' parts and owns the process edges that are not
 * files or sockets: stdin (read_stdin), stdout and the exit status (emit,
 * callable once), and the clock (now). Strict JSON is core/json.c, opened
 * into the same table.
 *
 * Buffers live in full userdata (sbxw_buf_t), never on the C heap, so a Lua
 * memory error raised mid-way leaks nothing.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sbxw.h"

#define STDIN_CHUNK 65536

static int emitted_flag;
static int emitted_status;

int sbxw_emitted(int *status) {
  if (emitted_flag && status != NULL) *status = emitted_status;
  return emitted_flag;
}

int sbxw_write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

#define FD_BOX_MT "sbxw.fd"

static int fd_box_gc(lua_State *L) {
  sbxw_fd_close(lua_touserdata(L, 1));
  return 0;
}

int *sbxw_fd_box(lua_State *L) {
  int *box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = -1;
  if (luaL_newmetatable(L, FD_BOX_MT)) {
    lua_pushcfunction(L, fd_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return box;
}

int sbxw_fd_close(int *box) {
  int rc = 0;
  if (box != NULL && *box >= 0) {
    rc = close(*box);
    *box = -1;
  }
  return rc;
}

void sbxw_buf_init(lua_State *L, sbxw_buf_t *b) {
  b->L = L;
  b->p = lua_newuserdatauv(L, 0, 0);
  b->idx = lua_gettop(L);
  b->len = 0;
  b->cap = 0;
}

char *sbxw_buf_reserve(sbxw_buf_t *b, size_t n) {
  size_t need = b->len + n, cap;
  char *np;
  if (n > (size_t)-1 / 2 - b->len) luaL_error(b->L, "buffer too large");
  if (need <= b->cap) return b->p + b->len;
  cap = b->cap ? b->cap : 4096;
  while (cap < need) cap *= 2;
  np = lua_newuserdatauv(b->L, cap, 0);
  if (b->len) memcpy(np, b->p, b->len);
  lua_replace(b->L, b->idx);
  b->p = np;
  b->cap = cap;
  return b->p + b->len;
}

/* sbxw.read_stdin(max_bytes) -> string | nil, "too large" | nil, "io" */
static int l_read_stdin(lua_State *L) {
  lua_Integer max = luaL_checkinteger(L, 1);
  sbxw_buf_t b;
  luaL_argcheck(L, max >= 0, 1, "max_bytes must not be negative");
  lua_settop(L, 1);
  sbxw_buf_init(L, &b);
  for (;;) {
    char *at = sbxw_buf_reserve(&b, STDIN_CHUNK);
    ssize_t n = read(0, at, STDIN_CHUNK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      lua_pushnil(L);
      lua_pushliteral(L, "io");
      return 2;
    }
    if (n == 0) break;
    b.len += (size_t)n;
    if (b.len > (size_t)max) {
      lua_pushnil(L);
      lua_pushliteral(L, "too large");
      return 2;
    }
  }
  lua_pushlstring(L, b.p, b.len);
  return 1;
}

/* sbxw.emit(bytes, status) -> true | nil, "io"; a second call raises. */
static int l_emit(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_Integer status = luaL_checkinteger(L, 2);
  luaL_argcheck(L, status >= 0 && status <= 125, 2, "status must be 0..125");
  if (emitted_flag) return luaL_error(L, "sbxw.emit called twice");
  emitted_flag = 1;
  emitted_status = (int)status;
  if (sbxw_write_all(1, s, len) != 0) {
    emitted_status = 1;
    lua_pushnil(L);
    lua_pushliteral(L, "io");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* sbxw.now() -> seconds since the epoch (float). */
static int l_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
  return 1;
}

int luaopen_sbxw(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"read_stdin", l_read_stdin}, {"emit", l_emit}, {"now", l_now}, {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  sbx__open_json(L);
  sbxw_open_fs(L);
  sbxw_open_utf8(L);
  sbxw_open_localtime(L);
  sbxw_open_broker(L);
  return 1;
}
