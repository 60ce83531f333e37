/*
 * waux.c: the helpers the worker's primitive parts share (see waux.h).
 * Buffers live in full userdata, never on the C heap, so a Lua memory error
 * raised mid-way leaks nothing.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "waux.h"

#define FD_BOX_MT "sbxw.fd"

int sbxw__write_all(int fd, const char *buf, size_t len) {
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

static int fd_box_gc(lua_State *L) {
  sbxw__fd_close(lua_touserdata(L, 1));
  return 0;
}

int *sbxw__fd_box(lua_State *L) {
  int *box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = -1;
  if (luaL_newmetatable(L, FD_BOX_MT)) {
    lua_pushcfunction(L, fd_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return box;
}

int sbxw__fd_close(int *box) {
  int rc = 0;
  if (box != NULL && *box >= 0) {
    rc = close(*box);
    *box = -1;
  }
  return rc;
}

void sbxw__buf_init(lua_State *L, sbxw__buf_t *b) {
  b->L = L;
  b->p = lua_newuserdatauv(L, 0, 0);
  b->idx = lua_gettop(L);
  b->len = 0;
  b->cap = 0;
}

char *sbxw__buf_reserve(sbxw__buf_t *b, size_t n) {
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
