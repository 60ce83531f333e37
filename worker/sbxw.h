/*
 * sbxw.h: what the worker's C files share (worker/PRIMITIVES.md).
 *
 * The primitive module `sbxw` is assembled from small files, each owning one
 * concern and adding its functions to the module table on top of the stack:
 * sbxw.c (stdin, stdout, clock, module assembly), fs.c (files), utf8.c
 * (UTF-8 text), localtime.c (zones) and broker_client.c (the Unix-socket HTTP
 * client). main.c is the static binary around them; built as a loadable
 * module (SBXW_MODULE defined) the same files become build/worker/sbxw.so.
 */
#ifndef SBXW_H
#define SBXW_H

#include <stddef.h>
#include <lua.h>
#include <lauxlib.h>

/* Bounds of spec/worker.md section 4 (the broker client). */
#define SBXW_BROKER_SOCKET      "/broker/broker.sock"
#define SBXW_BROKER_DEADLINE_MS 65000
#define SBXW_MAX_HEAD_BYTES     16384
#define SBXW_MAX_BODY_BYTES     1048576
#define SBXW_MAX_ROUTE_BYTES    1024
#define SBXW_DUMMY_AUTH         "Bearer sandbox-dummy-key"

/* Zone files (spec/worker.md section 6). */
#define SBXW_ZONEINFO_DIR       "/usr/share/zoneinfo"
#define SBXW_MAX_ZONE_BYTES     255

/* Opens the module: a table with every primitive (luaopen_sbxw). */
__attribute__((visibility("default"))) int luaopen_sbxw(lua_State *L);

/* 1 once sbxw.emit ran; *status is the exit status it recorded. */
int sbxw_emitted(int *status);

/* Writes all of buf to fd, retrying on EINTR and short writes; 0 or -1. */
int sbxw_write_all(int fd, const char *buf, size_t len);

/* Module parts, each adding fields to the table at -1. */
void sbxw_open_fs(lua_State *L);
void sbxw_open_utf8(lua_State *L);
void sbxw_open_localtime(lua_State *L);
void sbxw_open_broker(lua_State *L);

/* core/json.c and core/reflect.c (compiled in): adds json_decode,
 * json_encode, utf8_valid, json_null and the metatables. */
void sbx__open_json(lua_State *L);

/* A growable byte buffer owned by a full userdata at stack slot idx: an
 * error raised while it is open leaks nothing (the collector owns it). */
typedef struct {
  lua_State *L;
  int idx;
  char *p;
  size_t len, cap;
} sbxw_buf_t;

/* A file descriptor owned by a full userdata whose __gc closes it, so an
 * error raised while it is open leaks no descriptor. Pushes the box (fd -1);
 * store the descriptor in *box; sbxw_fd_close closes it and sets -1. */
int *sbxw_fd_box(lua_State *L);
int sbxw_fd_close(int *box);

/* Pushes an empty userdata buffer (slot recorded in b->idx). */
void sbxw_buf_init(lua_State *L, sbxw_buf_t *b);
/* Makes room for n more bytes; may raise a Lua memory error. */
char *sbxw_buf_reserve(sbxw_buf_t *b, size_t n);

#endif
