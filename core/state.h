/*
 * state.h: the one Lua state setup the project's host processes share: the
 * `sbx` CLI (main.c), the embedding engine (ffi.c) and the fuzzers that run
 * host Lua (fuzz/model_fuzz.c).
 */
#ifndef SBX_STATE_H
#define SBX_STATE_H

#include <lua.h>

/*
 * Makes L what every host state is: the standard libraries, `sandbox.core`
 * in package.preload, package.path "<lua_dir>/?.lua;<lua_dir>/?/init.lua",
 * an empty package.cpath (no C module but the core), and Lua's generational
 * collector (the incremental collector's steps were the broker's p99 tail:
 * 4.3-5.4x a bare echo against 0.97-1.00x generational, bench/results.md).
 * A memory error raises, as luaL_openlibs does.
 */
void sbx__state_open(lua_State *L, const char *lua_dir);

#endif
