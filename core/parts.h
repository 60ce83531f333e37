/*
 * parts.h: the parts of the Lua module `sandbox.core`, one opener per file
 * (Lua's lualib.h). Each adds its functions and constants to the module
 * table on top of the stack. core.c lists every one of them in a single
 * table, in the order they are opened; no part opens another.
 */
#ifndef SBX_PARTS_H
#define SBX_PARTS_H

#include <lua.h>

/* Opens the Lua module `sandbox.core` (core.c): exported by the Lua C module
 * core.so only, never by libsbx.so (core/libsbx.map). */
int luaopen_sandbox_core(lua_State *L);

void sbx__open_loop(lua_State *L);          /* core.run, timer, on_signal, now, log, ... */
void sbx__open_constants(lua_State *L);     /* core.limits (bounds.h), core.version */
void sbx__open_crypto(lua_State *L);        /* core.sha256_hex, base64, hex, random_hex */
void sbx__open_json(lua_State *L);          /* core.json_decode, json_encode, utf8_valid */
void sbx__open_json_shape(lua_State *L);    /* core.json_decode_bounded, json_cost, json_shape_check */
void sbx__open_reflect(lua_State *L);       /* core.reflect_filter */
void sbx__open_reflect_stream(lua_State *L); /* core.reflect_stream */
void sbx__open_sse_watch(lua_State *L);     /* core.sse_watch */
void sbx__open_fdbudget(lua_State *L);      /* core.fd_raise, fd_count, fd_budget, fd_turn_acquire/release */
void sbx__open_listener(lua_State *L);      /* core.broker_listen, broker_reclaim */
void sbx__open_docker_demux(lua_State *L);  /* core.docker_demux */
void sbx__open_listener_stream(lua_State *L); /* core.stream_listen */
void sbx__open_upstream(lua_State *L);      /* core.http_post */
void sbx__open_upstream_stream(lua_State *L); /* core.http_stream */
void sbx__open_fetch_lua(lua_State *L);     /* core.fetch_start, assert_url_start, fetch_opts_check, fetch_attempt */
void sbx__open_netaddr(lua_State *L);       /* core.url_admit, addr_classify, addr_parse */
void sbx__open_http_server(lua_State *L);   /* core.http_server, read_lines */
void sbx__open_process(lua_State *L);       /* core.spawn */
void sbx__open_unix_stream(lua_State *L);   /* core.unix_stream */
void sbx__open_fs(lua_State *L);            /* core.fs_*, realpath, lock_dir */
void sbx__open_fs_usage(lua_State *L);      /* core.fs_usage, fs_statfs */
void sbx__open_atomic_file(lua_State *L);   /* core.write_file_atomic, read_file_nofollow */
void sbx__open_dir_handle(lua_State *L);    /* core.dir_open (handle:write_new, close) */
void sbx__open_scrub(lua_State *L);         /* core.scrub_diagnostic, scrub_trim, scrub_valid_limit */

#endif
