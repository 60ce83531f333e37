/*
 * stdio.c: the process edges of the worker that are not files or sockets
 * (worker/PRIMITIVES.md): stdin (read_stdin), stdout and the exit status
 * (emit, callable once), and the clock (now).
 */
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "sbxw.h"
#include "waux.h"

#define STDIN_CHUNK 65536

static int emitted_flag;
static int emitted_status;

int sbxw__emitted(int *status) {
  if (emitted_flag && status != NULL) *status = emitted_status;
  return emitted_flag;
}

/* sbxw.read_stdin(max_bytes) -> string | nil, "too large" | nil, "io" */
static int l_read_stdin(lua_State *L) {
  lua_Integer max = luaL_checkinteger(L, 1);
  sbxw__buf_t b;
  luaL_argcheck(L, max >= 0, 1, "max_bytes must not be negative");
  lua_settop(L, 1);
  sbxw__buf_init(L, &b);
  for (;;) {
    char *at = sbxw__buf_reserve(&b, STDIN_CHUNK);
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
  if (sbxw__write_all(1, s, len) != 0) {
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

void sbxw__open_stdio(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"read_stdin", l_read_stdin}, {"emit", l_emit}, {"now", l_now}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
