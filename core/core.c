/*
 * core.c: the Lua module `sandbox.core`, and nothing else (Lua's linit.c):
 * one table names every part, each opened in turn into one module table.
 * The parts are the other files of core/ (parts.h); what they share lives in
 * aux.c (helpers) and loop.c (the loop), never here.
 */
#include "loop.h"
#include "parts.h"

static const struct {
  const char *name;                 /* the file, for a reader */
  void (*open)(lua_State *L);
} parts[] = {
  {"loop", sbx__open_loop},
  {"constants", sbx__open_constants},
  {"crypto", sbx__open_crypto},
  {"json", sbx__open_json},
  {"json_shape", sbx__open_json_shape},
  {"reflect", sbx__open_reflect},
  {"reflect_stream", sbx__open_reflect_stream},
  {"sse_watch", sbx__open_sse_watch},
  {"fdbudget", sbx__open_fdbudget},
  {"listener", sbx__open_listener},
  {"listener_stream", sbx__open_listener_stream},
  {"upstream", sbx__open_upstream},
  {"upstream_stream", sbx__open_upstream_stream},
  {"fetch_lua", sbx__open_fetch_lua},
  {"netaddr", sbx__open_netaddr},
  {"http_server", sbx__open_http_server},
  {"process", sbx__open_process},
  {"unix_stream", sbx__open_unix_stream},
  {"docker_demux", sbx__open_docker_demux},
  {"fs", sbx__open_fs},
  {"fs_usage", sbx__open_fs_usage},
  {"atomic_file", sbx__open_atomic_file},
  {"dir_handle", sbx__open_dir_handle},
  {"scrub", sbx__open_scrub},
};

int luaopen_sandbox_core(lua_State *L) {
  size_t i;
  sbx__ignore_sigpipe();
  lua_newtable(L);
  sbx__loop(L);   /* created first, so finalized last (loop.c) */
  for (i = 0; i < sizeof parts / sizeof parts[0]; i++) parts[i].open(L);
  return 1;
}
