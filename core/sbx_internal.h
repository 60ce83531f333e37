/*
 * sbx_internal.h: what the core's C files share and nothing else.
 *
 * The core is one Lua module, `sandbox.core`, assembled from small files, each
 * owning one concern (loop, json, reflect, crypto, listener, upstream). Each file
 * exports one `sbx__open_<name>(lua_State *L)` that adds its functions to the
 * module table on top of the stack; core.c calls them in turn.
 *
 * One libuv loop per Lua state. Callbacks from libuv into Lua run on the Lua
 * thread that called core.run() (sbx__loop(L)->L), through sbx__pcall, which
 * never lets a Lua error cross a libuv frame.
 */
#ifndef SBX_INTERNAL_H
#define SBX_INTERNAL_H

#include <stddef.h>
#include <uv.h>
#include <lua.h>
#include <lauxlib.h>

#include "sbx.h"
#include "sbx_limits.h"

typedef struct sbx__loop {
  uv_loop_t uv;
  lua_State *L;       /* thread that runs callbacks: the caller of core.run() */
  int owned;          /* uv loop initialised by us; closed on __gc */
  int running;        /* inside core.run()'s uv_run: a nested run is refused */
} sbx__loop_t;

/* The loop bound to this Lua state (created on first use). Never NULL. */
sbx__loop_t *sbx__loop(lua_State *L);

/* Registry references to Lua values (functions, userdata). */
int sbx__ref(lua_State *L, int idx);
void sbx__unref(lua_State *L, int *ref);   /* sets *ref to LUA_NOREF */

/*
 * Calls the function below `nargs` arguments on L's stack in protected mode.
 * An error is logged without its text (it may hold payload) unless SBX_DEBUG
 * is set, and dropped. Returns 0 on success, -1 on error. Pops everything.
 */
int sbx__pcall(lua_State *L, int nargs);

/* Operator log line on stderr: "sbx: <level>: <msg>". Never pass payloads. */
void sbx__log(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A write to a peer that left must fail with EPIPE, not kill the process:
 * SIGPIPE is ignored process-wide (when it was at its default) as soon as
 * sandbox.core is opened. */
void sbx__ignore_sigpipe(void);

/* Registers metatable `name` (once): __index = a table of `methods`, __gc =
 * gc. Leaves the stack as it was. The usual userdata class of the core.
 * Inline because the worker compiles some core files (reflect.c) without
 * core.c. */
static inline void sbx__class(lua_State *L, const char *name, const luaL_Reg *methods,
                              lua_CFunction gc) {
  if (luaL_newmetatable(L, name)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
}

/* Module openers, one per file. Each adds fields to the table at -1. */
void sbx__open_loop(lua_State *L);
void sbx__open_crypto(lua_State *L);
void sbx__open_json(lua_State *L);
void sbx__open_reflect(lua_State *L);
void sbx__open_listener(lua_State *L);
void sbx__open_upstream(lua_State *L);
void sbx__open_safefetch(lua_State *L);     /* core.fetch_attempt, core.fetch_resolve, core.local_addresses */
void sbx__open_netaddr(lua_State *L);       /* core.url_admit, core.url_resolve_ref, core.addr_classify, core.addr_parse */
void sbx__open_http_server(lua_State *L);   /* core.http_server, core.read_lines */
void sbx__open_process(lua_State *L);
void sbx__open_fs(lua_State *L);
void sbx__open_atomic_file(lua_State *L);   /* core.write_file_atomic, core.read_file_nofollow */
void sbx__open_scrub(lua_State *L);         /* core.scrub_diagnostic, core.scrub_trim, core.scrub_valid_limit */
/* core.unix_request (pipe_client.c); opened by sbx__open_listener. */
void sbx__open_pipe_client(lua_State *L);

/*
 * JSON (json.c). Strict decode of buf into one Lua value pushed on L
 * (spec/broker.md section 8). When filter is non-NULL every decoded string,
 * member names included, is scanned and a hit fails the decode with
 * SBX_EREFLECT. Returns 0 or a negative SBX_E* code (nothing pushed then).
 */
struct sbx_reflect;
int sbx__json_decode(lua_State *L, const char *buf, size_t len,
                     const struct sbx_reflect *filter);

/* The filter inside a core.reflect_filter userdata at idx (reflect.c). */
const struct sbx_reflect *sbx__reflect_check(lua_State *L, int idx);

#endif
