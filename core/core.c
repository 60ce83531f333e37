/*
 * core.c: assembles the Lua module `sandbox.core` from the per-concern files
 * and holds the helpers they share (loop lookup, registry refs, protected
 * callbacks, the operator log).
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx_internal.h"

#define SBX_LOOP_KEY "sbx.loop"        /* registry slot of the loop userdata */
#define SBX_LOOP_MT  "sbx.loop_mt"     /* its metatable (a different name!) */

static void count_open(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) (*(int *)arg)++;
}

/* The loop is created first, so at lua_close it is finalized last: every
 * other object has already asked libuv to close its handles. When only
 * closing handles remain, run their close callbacks (where their memory is
 * freed) and close the loop. A handle nobody closed (a timer still pending at
 * exit) could call into the Lua state being closed, so then the loop is not
 * run at all and is left to the process exit. */
static int loop_gc(lua_State *L) {
  sbx__loop_t *lp = luaL_checkudata(L, 1, SBX_LOOP_MT);
  int open = 0;
  if (!lp->owned) return 0;
  uv_walk(&lp->uv, count_open, &open);
  if (open > 0) return 0;
  uv_run(&lp->uv, UV_RUN_NOWAIT);
  if (uv_loop_close(&lp->uv) == 0) lp->owned = 0;
  return 0;
}

sbx__loop_t *sbx__loop(lua_State *L) {
  sbx__loop_t *lp;
  if (lua_getfield(L, LUA_REGISTRYINDEX, SBX_LOOP_KEY) == LUA_TUSERDATA) {
    lp = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return lp;
  }
  lua_pop(L, 1);
  lp = lua_newuserdatauv(L, sizeof *lp, 0);
  memset(lp, 0, sizeof *lp);
  if (uv_loop_init(&lp->uv) != 0) luaL_error(L, "cannot initialise the event loop");
  lp->owned = 1;
  lp->uv.data = lp;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lp->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  if (luaL_newmetatable(L, SBX_LOOP_MT)) {
    lua_pushcfunction(L, loop_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, SBX_LOOP_KEY);
  return lp;
}

int sbx__ref(lua_State *L, int idx) {
  lua_pushvalue(L, idx);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

void sbx__unref(lua_State *L, int *ref) {
  if (*ref != LUA_NOREF && *ref != LUA_REFNIL) luaL_unref(L, LUA_REGISTRYINDEX, *ref);
  *ref = LUA_NOREF;
}

int sbx__pcall(lua_State *L, int nargs) {
  if (lua_pcall(L, nargs, 0, 0) != LUA_OK) {
    if (getenv("SBX_DEBUG") != NULL)
      sbx__log("error", "callback raised: %s", luaL_tolstring(L, -1, NULL));
    else
      sbx__log("error", "a host callback raised an error (details suppressed; set SBX_DEBUG=1 to see them)");
    lua_settop(L, 0);
    return -1;
  }
  return 0;
}

void sbx__log(const char *level, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "sbx: %s: %s\n", level, msg);
}

void sbx__ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
  }
}

int luaopen_sandbox_core(lua_State *L) {
  sbx__ignore_sigpipe();
  lua_newtable(L);
  sbx__loop(L);
  sbx__open_loop(L);
  sbx__open_crypto(L);
  sbx__open_json(L);
  sbx__open_reflect(L);
  sbx__open_listener(L);
  sbx__open_upstream(L);
  sbx__open_safefetch(L);
  sbx__open_netaddr(L);
  sbx__open_http_server(L);
  sbx__open_process(L);
  sbx__open_fs(L);
  sbx__open_atomic_file(L);
  sbx__open_scrub(L);
  return 1;
}
