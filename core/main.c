/*
 * main.c: the `sbx` command. A thin C shell: it makes the host Lua state
 * (state.c: standard libraries, `sandbox.core` preloaded, package.path at
 * the host Lua tree, the generational collector) and hands argv to the Lua
 * module `sandbox.cli`, whose return value is the exit status. All command
 * logic lives in Lua. The only errors printed here are the one-line ones of
 * finding and loading that tree (no traceback: they name SBX_LUA_DIR and the
 * executable as it really is, so a copied or renamed sbx names itself).
 * `sbx --version` / `sbx version` is answered here, before the tree is
 * looked for: the release is compiled in (sbx_version()), so a copied binary
 * still says which release it is.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#include "sbx.h"
#include "state.h"

/* The file that marks a host Lua tree (the directory package.path points at). */
#define TREE_PROBE "sandbox/cli/init.lua"

static int has_tree(const char *dir) {
  char probe[PATH_MAX];
  if ((size_t)snprintf(probe, sizeof probe, "%s/" TREE_PROBE, dir) >= sizeof probe) return 0;
  return access(probe, R_OK) == 0;
}

/*
 * Directory of the host Lua tree: $SBX_LUA_DIR when set; else, from the
 * executable's own directory, <exe dir>/../lua (a checkout: build/sbx) or
 * <exe dir>/../share/lua/5.4 (`make install`: PREFIX/bin/sbx, the modules
 * in PREFIX/share/lua/5.4, also under DESTDIR). Returns 0, or -1 after
 * printing the one-line error that names SBX_LUA_DIR.
 */
static int lua_dir(char *out, size_t cap) {
  static const char *const rel[] = {"../lua", "../share/lua/5.4"};
  const char *env = getenv("SBX_LUA_DIR");
  char exe[PATH_MAX], dir[PATH_MAX];
  ssize_t n;
  size_t i;
  char *slash;
  if (env != NULL && env[0] != '\0') {
    if (strlen(env) < cap && has_tree(env)) {
      strcpy(out, env);
      return 0;
    }
    fprintf(stderr, "sbx: SBX_LUA_DIR=%s holds no " TREE_PROBE "; set SBX_LUA_DIR to the directory "
            "that holds sandbox/ (the checkout's lua/, or PREFIX/share/lua/5.4)\n", env);
    return -1;
  }
  n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  slash = NULL;
  if (n > 0) {
    exe[n] = '\0';
    slash = strrchr(exe, '/');
  }
  if (slash == NULL) {
    fprintf(stderr, "sbx: cannot locate this executable to find the Lua tree; set SBX_LUA_DIR to the "
            "directory that holds sandbox/ (the checkout's lua/, or PREFIX/share/lua/5.4)\n");
    return -1;
  }
  memcpy(dir, exe, (size_t)(slash - exe));
  dir[slash - exe] = '\0';
  for (i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, rel[i]) < cap && has_tree(out)) return 0;
  }
  fprintf(stderr, "sbx: no Lua tree next to %s (looked in %s/%s and %s/%s); set SBX_LUA_DIR to the "
          "directory that holds sandbox/ (the checkout's lua/, or PREFIX/share/lua/5.4)\n",
          exe, dir, rel[0], dir, rel[1]);
  return -1;
}

/* Message handler of the first require: the message's first line only. */
static int first_line(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  const char *nl;
  if (msg == NULL) msg = "(error object is not a string)";
  nl = strchr(msg, '\n');
  lua_pushlstring(L, msg, nl != NULL ? (size_t)(nl - msg) : strlen(msg));
  return 1;
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

  if (argc == 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
    printf("sbx %s\n", sbx_version());
    return 0;
  }
  if (lua_dir(dir, sizeof dir) != 0) return 1;
  L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "sbx: out of memory\n");
    return 1;
  }
  sbx__state_open(L, dir);

  lua_pushcfunction(L, traceback);                      /* 1: for main */
  lua_pushcfunction(L, first_line);
  lua_getglobal(L, "require");
  lua_pushstring(L, "sandbox.cli");
  if (lua_pcall(L, 1, 1, 2) != LUA_OK) {
    fprintf(stderr, "sbx: cannot load the Lua tree %s: %s; set SBX_LUA_DIR to the directory that holds "
            "sandbox/ of this sbx's release\n", dir, lua_tostring(L, -1));
    lua_close(L);
    return 1;
  }
  lua_remove(L, 2);
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
