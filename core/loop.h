/*
 * loop.h: the libuv loop of a Lua state and the protected callback, what
 * every part that owns handles shares (loop.c).
 *
 * One libuv loop per Lua state. Callbacks from libuv into Lua run on the Lua
 * thread that called core.run() (sbx__loop(L)->L), through sbx__pcall, which
 * never lets a Lua error cross a libuv frame.
 */
#ifndef SBX_LOOP_H
#define SBX_LOOP_H

#include <uv.h>

#include "aux.h"

typedef struct sbx__loop {
  uv_loop_t uv;
  lua_State *L;       /* thread that runs callbacks: the caller of core.run() */
  int owned;          /* uv loop initialised by us; closed on __gc */
  int running;        /* inside core.run()'s uv_run: a nested run is refused */
} sbx__loop_t;

/* The loop bound to this Lua state (created on first use). Never NULL. */
sbx__loop_t *sbx__loop(lua_State *L);

/*
 * Calls the function below `nargs` arguments on L's stack in protected mode.
 * An error is logged without its text (it may hold payload) unless SBX_DEBUG
 * is set, and dropped. Returns 0 on success, -1 on error. Pops everything.
 */
int sbx__pcall(lua_State *L, int nargs);

#endif
