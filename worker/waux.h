/*
 * waux.h: the helpers the parts of the worker's primitive module share (the
 * worker's lauxlib; core/aux.h is the core's): all-or-nothing writes, a
 * descriptor owned by a userdata, a growable buffer owned by a userdata.
 * Parts depend on these, never on sbxw.c (the module's list of parts).
 */
#ifndef SBXW_WAUX_H
#define SBXW_WAUX_H

#include <stddef.h>
#include <lua.h>
#include <lauxlib.h>

/* Writes all of buf to fd, retrying on EINTR and short writes; 0 or -1. */
int sbxw__write_all(int fd, const char *buf, size_t len);

/* A file descriptor owned by a full userdata whose __gc closes it, so an
 * error raised while it is open leaks no descriptor. Pushes the box (fd -1);
 * store the descriptor in *box; sbxw__fd_close closes it and sets -1. */
int *sbxw__fd_box(lua_State *L);
int sbxw__fd_close(int *box);

/* A growable byte buffer owned by a full userdata at stack slot idx: an
 * error raised while it is open leaks nothing (the collector owns it). */
typedef struct {
  lua_State *L;
  int idx;
  char *p;
  size_t len, cap;
} sbxw__buf_t;

/* Pushes an empty userdata buffer (slot recorded in b->idx). */
void sbxw__buf_init(lua_State *L, sbxw__buf_t *b);
/* Makes room for n more bytes; may raise a Lua memory error. */
char *sbxw__buf_reserve(sbxw__buf_t *b, size_t n);

#endif
