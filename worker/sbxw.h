/*
 * sbxw.h: the primitive module `sbxw` and its parts (worker/PRIMITIVES.md),
 * as Lua's lualib.h is to its libraries.
 *
 * The module is assembled by sbxw.c from small files, each owning one
 * concern and adding its functions to the module table on top of the stack:
 * stdio.c (stdin, stdout and the exit status, the clock), fs.c (files),
 * utf8.c (UTF-8 text), localtime.c (zones), broker_client.c (the Unix-socket
 * HTTP client) and the core's json.c. What they share is waux.h. main.c is
 * the static binary around them; built as a loadable module (SBXW_MODULE
 * defined) the same files become build/worker/sbxw.so.
 */
#ifndef SBXW_H
#define SBXW_H

#include <lua.h>
#include <lauxlib.h>

#include "bounds.h"
#include "http_head.h"

/* Bounds of spec/worker.md section 4 (the broker client): the head and body
 * bounds are the broker's own (core/bounds.h), the credential the listener's
 * one permitted value (core/http_head.h). */
#define SBXW_BROKER_SOCKET      "/broker/broker.sock"
#define SBXW_BROKER_DEADLINE_MS 65000
#define SBXW_MAX_HEAD_BYTES     SBX_MAX_HEAD_BYTES
#define SBXW_MAX_BODY_BYTES     SBX_MAX_REPLY_BYTES
#define SBXW_MAX_ROUTE_BYTES    1024
#define SBXW_DUMMY_AUTH         SBX_DUMMY_AUTHORIZATION

/* Zone files (spec/worker.md section 6). */
#define SBXW_ZONEINFO_DIR       "/usr/share/zoneinfo"
#define SBXW_MAX_ZONE_BYTES     255

/* Opens the module: a table with every primitive (luaopen_sbxw). */
__attribute__((visibility("default"))) int luaopen_sbxw(lua_State *L);

/* 1 once sbxw.emit ran; *status is the exit status it recorded (stdio.c,
 * for main.c). */
int sbxw__emitted(int *status);

/* The parts, each adding fields to the table at -1. The core's json part is
 * sbx__open_json (core/parts.h). */
void sbxw__open_stdio(lua_State *L);
void sbxw__open_fs(lua_State *L);
void sbxw__open_utf8(lua_State *L);
void sbxw__open_localtime(lua_State *L);
void sbxw__open_broker(lua_State *L);

#endif
