/*
 * main.c: the sealed worker binary `sbx-worker` (spec/worker.md sections 1,
 * 1.1, 2.2). A thin, fail-closed C shell around the worker's Lua:
 *
 *  - reads no arguments and no environment variable; LUA_PATH, LUA_CPATH and
 *    LUA_INIT mean nothing to it (the package library is not opened);
 *  - one Lua state whose allocator refuses to grow the heap past
 *    SBXW_MEM_CAP, so exhaustion is a Lua memory error, not an OOM kill;
 *  - opens base, string, table, math, utf8 and coroutine only; removes
 *    print, warn, loadfile, dofile and string.dump; `load` takes text only;
 *  - its own `require`: package.loaded, package.preload (sbxw, cjson), then
 *    SBXW_LUA_DIR/<name>.lua loaded as text (no C modules, no searchers);
 *  - runs require("worker").main() in protected mode. The exit status is the
 *    one sbxw.emit recorded; an error, or no emit at all, writes the generic
 *    failed reply (unless something was emitted already) and exits 1.
 *    Nothing is ever written to stderr (fd 2 is pointed at /dev/null).
 *
 * SBXW_LUA_DIR is fixed at compile time: /app/worker/lua in the image; test
 * builds (worker/worker.mk) point it at a directory relative to the repo.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lualib.h>

#include "sbxw.h"
#include "waux.h"

#ifndef SBXW_LUA_DIR
#define SBXW_LUA_DIR "/app/worker/lua"
#endif
#ifndef SBXW_MEM_CAP
#define SBXW_MEM_CAP ((size_t)256 * 1024 * 1024)
#endif
#ifndef SBXW_GC_PAUSE
#define SBXW_GC_PAUSE 100
#endif
#define MAX_MODULE_NAME 128

int luaopen_cjson(lua_State *L);

static const char failed_reply[] = "{\"ok\":false,\"text\":\"The sandbox worker failed.\"}";

typedef struct {
  size_t used, cap;
} heap_t;

/* lua_Alloc with a hard cap; shrinking never fails (Lua relies on it). */
static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  heap_t *h = ud;
  void *p;
  if (ptr == NULL) osize = 0;                  /* osize is a type tag then */
  if (nsize == 0) {
    free(ptr);
    h->used -= osize;
    return NULL;
  }
  if (nsize > osize && nsize - osize > h->cap - h->used) return NULL;
  p = realloc(ptr, nsize);
  if (p == NULL) return NULL;
  h->used = h->used - osize + nsize;
  return p;
}

/* 1 when name is [A-Za-z0-9_]+ segments joined by single dots. */
static int module_name_ok(const char *s, size_t n) {
  if (n == 0 || n > MAX_MODULE_NAME || s[0] == '.' || s[n - 1] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '.') {
      if (s[i + 1] == '.') return 0;
    } else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (c >= '0' && c <= '9') || c == '_')) {
      return 0;
    }
  }
  return 1;
}

/* require(name) -> module, loader data */
static int l_require(lua_State *L) {
  size_t n;
  const char *name = luaL_checklstring(L, 1, &n);
  char path[sizeof SBXW_LUA_DIR + MAX_MODULE_NAME + 8];
  lua_settop(L, 1);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);   /* 2 */
  if (lua_getfield(L, 2, name) != LUA_TNIL && lua_toboolean(L, -1)) return 1;
  lua_pop(L, 1);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);  /* 3 */
  if (lua_getfield(L, 3, name) == LUA_TFUNCTION) {            /* 4: loader */
    lua_pushliteral(L, ":preload:");                          /* 5 */
  } else {
    lua_pop(L, 1);
    if (!module_name_ok(name, n)) return luaL_error(L, "module '%s' not found", name);
    size_t d = sizeof SBXW_LUA_DIR - 1;
    memcpy(path, SBXW_LUA_DIR, d);
    path[d++] = '/';
    for (size_t i = 0; i < n; i++) path[d++] = name[i] == '.' ? '/' : name[i];
    memcpy(path + d, ".lua", sizeof ".lua");
    int rc = luaL_loadfilex(L, path, "t");                    /* 4 */
    if (rc == LUA_ERRFILE) return luaL_error(L, "module '%s' not found", name);
    if (rc != LUA_OK) return lua_error(L);
    lua_pushstring(L, path);                                  /* 5 */
  }
  lua_pushvalue(L, 4);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 5);
  lua_call(L, 2, 1);                                          /* 6: result */
  if (!lua_isnil(L, -1)) lua_setfield(L, 2, name);
  else lua_pop(L, 1);
  if (lua_getfield(L, 2, name) == LUA_TNIL) {
    lua_pushboolean(L, 1);
    lua_copy(L, -1, -2);
    lua_setfield(L, 2, name);
  }
  lua_insert(L, 5);
  return 2;                                                   /* module, data */
}

/* load(chunk [, chunkname [, mode [, env]]]) with mode forced to "t". */
static int l_load_text(lua_State *L) {
  int n = lua_gettop(L);
  if (n < 3) lua_settop(L, n = 3);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

static void open_libs(lua_State *L) {
  static const luaL_Reg libs[] = {
    {LUA_GNAME, luaopen_base}, {LUA_STRLIBNAME, luaopen_string},
    {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
    {LUA_UTF8LIBNAME, luaopen_utf8}, {LUA_COLIBNAME, luaopen_coroutine},
    {NULL, NULL}};
  static const char *const drop[] = {"print", "warn", "loadfile", "dofile"};
  for (const luaL_Reg *l = libs; l->func; l++) {
    luaL_requiref(L, l->name, l->func, 1);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, drop[i]);
  }
  lua_getfield(L, -1, "load");
  lua_pushcclosure(L, l_load_text, 1);
  lua_setfield(L, -2, "load");
  lua_getfield(L, -1, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  /* package: loaded, preload, path (informational), and require. */
  lua_createtable(L, 0, 3);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_setfield(L, -2, "loaded");
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_sbxw);
  lua_setfield(L, -2, "sbxw");
  lua_pushcfunction(L, luaopen_cjson);
  lua_setfield(L, -2, "cjson");
  lua_setfield(L, -2, "preload");
  lua_pushliteral(L, SBXW_LUA_DIR "/?.lua");
  lua_setfield(L, -2, "path");
  lua_setfield(L, -2, "package");
  lua_pushcfunction(L, l_require);
  lua_setfield(L, -2, "require");
  lua_pop(L, 1);
}

/* Protected body: open the libraries, then require("worker").main(). */
static int run(lua_State *L) {
  open_libs(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "worker");
  lua_call(L, 1, 1);
  if (lua_getfield(L, -1, "main") != LUA_TFUNCTION) return luaL_error(L, "no worker.main");
  lua_call(L, 0, 0);
  return 0;
}

int main(void) {
  static heap_t heap = {0, SBXW_MEM_CAP};
  lua_State *L;
  int status = 1, ok = 0, devnull;

  /* Nothing below reads the environment; clearing it makes sure of that
   * (glibc consults TZ only as local_time sets it, see localtime.c). */
  clearenv();
  signal(SIGPIPE, SIG_IGN);
  devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 2);
    if (devnull != 2) close(devnull);
  }
  L = lua_newstate(capped_alloc, &heap);       /* no warn function: silent */
  if (L != NULL) {
    /* GC pause 100: a new cycle starts as soon as one ends, instead of once
     * the heap doubled. Halves the peak RSS of a worst-case turn (10 -> 6
     * MiB with megabytes of history) for a few ms of CPU. */
    lua_gc(L, LUA_GCINC, SBXW_GC_PAUSE, 0, 0);
    lua_pushcfunction(L, run);
    ok = lua_pcall(L, 0, 0, 0) == LUA_OK;
  }
  if (!sbxw__emitted(&status)) {
    (void)sbxw__write_all(1, failed_reply, sizeof failed_reply - 1);
    status = 1;
  } else if (!ok) {
    status = 1;
  }
  /* No lua_close: finalizers could only do harm now; exit reclaims all. */
  return status;
}
