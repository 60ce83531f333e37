/*
 * main.c: the `sbx` command. A thin C shell: it makes the host Lua state
 * (state.c: standard libraries, `sandbox.core` preloaded, package.path at
 * the host Lua tree, the generational collector) and hands argv to the Lua
 * module `sandbox.cli`, whose return value is the exit status. All command
 * logic lives in Lua.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#include "state.h"

/* Directory of the host Lua tree: $SBX_LUA_DIR, else <exe dir>/../lua. */
static int lua_dir(char *out, size_t cap) {
  const char *env = getenv("SBX_LUA_DIR");
  char exe[PATH_MAX];
  ssize_t n;
  char *slash;
  if (env != NULL && env[0] != '\0') {
    if (strlen(env) >= cap) return -1;
    strcpy(out, env);
    return 0;
  }
  n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  slash = strrchr(exe, '/');
  if (slash == NULL) return -1;
  *slash = '\0';
  if ((size_t)snprintf(out, cap, "%s/../lua", exe) >= cap) return -1;
  return 0;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

int main(int argc, char **argv) {
  char dir[PATH_MAX];
  lua_State *L;
  int status = 1, i;

  if (lua_dir(dir, sizeof dir) != 0) {
    fprintf(stderr, "sbx: cannot locate the Lua tree; set SBX_LUA_DIR to the project's lua/ directory\n");
    return 1;
  }
  L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "sbx: out of memory\n");
    return 1;
  }
  sbx__state_open(L, dir);

  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushstring(L, "sandbox.cli");
  if (lua_pcall(L, 1, 1, 1) != LUA_OK) {
    fprintf(stderr, "sbx: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return 1;
  }
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 0);
  for (i = 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  if (lua_pcall(L, 1, 1, 1) != LUA_OK) {
    fprintf(stderr, "sbx: internal error: %s\n", lua_tostring(L, -1));
  } else {
    status = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  }
  lua_close(L);
  return status;
}
