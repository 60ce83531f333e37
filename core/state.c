/*
 * state.c: sbx__state_open, the Lua state the project's hosts run (see
 * state.h). The collector mode is set here, in C, so no Lua module has to
 * decide it for a state it does not own.
 */
#include <lauxlib.h>
#include <lualib.h>

#include "parts.h"
#include "state.h"

void sbx__state_open(lua_State *L, const char *lua_dir) {
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_sandbox_core);
  lua_setfield(L, -2, "sandbox.core");
  lua_pop(L, 1);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua", lua_dir, lua_dir);
  lua_setfield(L, -2, "path");
  lua_pushliteral(L, "");
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  lua_gc(L, LUA_GCGEN, 0, 0);
}
