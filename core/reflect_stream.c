/*
 * reflect_stream.c: the bounded reflection stream of spec/rich-mode.md 11.5
 * (sbx_reflect_stream_*, sbx.h) and its Lua face, core.reflect_stream.
 *
 * An upstream body reaches the worker chunk by chunk. Each chunk is scanned
 * together with the bytes held back from the one before (`carry` = the
 * longest of the six forms minus one), so a form split anywhere across
 * chunks is still one contiguous run of `data`: the stream's answer is
 * exactly a scan of the whole body so far, chunk by chunk. What is emitted
 * is `data` without its last `carry` bytes; the end emits the rest.
 *
 * Memory: one buffer owned by the stream, as long as the longest chunk plus
 * the carry; the emitted bytes are its front and stay valid until the next
 * call, when the kept tail moves to the front. Pure: no I/O, no Lua below
 * the binding.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aux.h"
#include "parts.h"
#include "reflect.h"

#define STREAM_MT "sbx.reflect_stream"

struct sbx_reflect_stream {
  const sbx_reflect_t *f;
  size_t carry, max_total, total;
  char *buf;
  size_t len, cap;
  size_t emitted;          /* front bytes handed out by the last push */
  int failed;              /* 0, SBX_EREFLECT or SBX_ETOOBIG */
  int finished;
};

int sbx_reflect_stream_new(const sbx_reflect_t *f, size_t max_total, sbx_reflect_stream_t **out) {
  sbx_reflect_stream_t *s;
  *out = NULL;
  if (f == NULL) return SBX_EINVAL;
  s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  s->f = f;
  s->carry = sbx_reflect_carry(f);
  s->max_total = max_total;
  *out = s;
  return 0;
}

/* Drops the front the previous push handed out: the kept tail moves up. */
static void shift(sbx_reflect_stream_t *s) {
  if (s->emitted == 0) return;
  memmove(s->buf, s->buf + s->emitted, s->len - s->emitted);
  s->len -= s->emitted;
  s->emitted = 0;
}

int sbx_reflect_stream_push(sbx_reflect_stream_t *s, const char *chunk, size_t n,
                            const char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (s->failed) return s->failed;
  if (s->finished) return SBX_EINVAL;
  shift(s);
  if (sbx__reserve(&s->buf, &s->cap, s->len, n, s->carry + n, SIZE_MAX) != 0) return -ENOMEM;
  if (n > 0) memcpy(s->buf + s->len, chunk, n);
  s->len += n;
  if (sbx_reflect_hit(s->f, s->buf, s->len)) return s->failed = SBX_EREFLECT;
  s->total += n;
  if (s->total > s->max_total || s->total < n) return s->failed = SBX_ETOOBIG;
  s->emitted = s->len > s->carry ? s->len - s->carry : 0;
  *out = s->buf != NULL ? s->buf : "";
  *out_len = s->emitted;
  return 0;
}

int sbx_reflect_stream_finish(sbx_reflect_stream_t *s, const char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (s->failed) return s->failed;
  if (s->finished) return SBX_EINVAL;
  shift(s);
  s->finished = 1;
  *out = s->buf != NULL ? s->buf : "";
  *out_len = s->len;
  s->emitted = s->len;
  return 0;
}

size_t sbx_reflect_stream_total(const sbx_reflect_stream_t *s) {
  return s->total;
}

void sbx_reflect_stream_free(sbx_reflect_stream_t *s) {
  if (s == NULL) return;
  free(s->buf);
  free(s);
}

/* ---- Lua: core.reflect_stream(filter | key [, max_bytes]) ------------------ */

/* The stream userdata holds the one pointer to the C stream it owns; its
 * user value is the filter userdata, which must outlive it. A key is turned
 * into a filter by core.reflect_filter's own constructor (upvalue 1). */

static sbx_reflect_stream_t *check_stream(lua_State *L) {
  sbx_reflect_stream_t **p = luaL_checkudata(L, 1, STREAM_MT);
  luaL_argcheck(L, *p != NULL, 1, "reflection stream is closed");
  return *p;
}

static int push_result(lua_State *L, int rc, const char *out, size_t len) {
  if (rc == 0) { lua_pushlstring(L, out, len); return 1; }
  if (rc == SBX_EINVAL) return luaL_error(L, "reflection stream already finished");
  if (rc == -ENOMEM) return luaL_error(L, "out of memory");
  lua_pushnil(L);
  lua_pushstring(L, rc == SBX_EREFLECT ? "reflected" : "too large");
  return 2;
}

static int l_stream_push(lua_State *L) {
  sbx_reflect_stream_t *s = check_stream(L);
  size_t n, len;
  const char *chunk = luaL_checklstring(L, 2, &n), *out;
  int rc = sbx_reflect_stream_push(s, chunk, n, &out, &len);
  return push_result(L, rc, out, len);
}

static int l_stream_finish(lua_State *L) {
  sbx_reflect_stream_t *s = check_stream(L);
  size_t len;
  const char *out;
  int rc = sbx_reflect_stream_finish(s, &out, &len);
  return push_result(L, rc, out, len);
}

static int l_stream_carry(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)check_stream(L)->carry);
  return 1;
}

static int l_stream_total(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)sbx_reflect_stream_total(check_stream(L)));
  return 1;
}

static int l_stream_gc(lua_State *L) {
  sbx_reflect_stream_t **p = luaL_checkudata(L, 1, STREAM_MT);
  sbx_reflect_stream_free(*p);
  *p = NULL;
  return 0;
}

static int l_reflect_stream(lua_State *L) {
  lua_Integer max = luaL_optinteger(L, 2, SBX_STREAM_MAX_RESPONSE_BYTES);
  const struct sbx_reflect *f;
  sbx_reflect_stream_t **p;
  luaL_argcheck(L, max >= 0, 2, "max_bytes must be >= 0");
  lua_settop(L, 2);
  if (lua_type(L, 1) == LUA_TSTRING) {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushvalue(L, 1);
    lua_call(L, 1, 2);
    if (lua_isnil(L, -2)) return 2;              /* nil, "invalid key length" */
    lua_pop(L, 1);
    lua_replace(L, 1);
  }
  f = sbx__box_check(L, 1, SBX_REFLECT_MT);
  luaL_argcheck(L, f != NULL, 1, "reflection filter is closed");
  p = lua_newuserdatauv(L, sizeof *p, 1);
  *p = NULL;
  luaL_setmetatable(L, STREAM_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);                   /* the filter outlives the stream */
  if (sbx_reflect_stream_new(f, (size_t)max, p) != 0) return luaL_error(L, "out of memory");
  return 1;
}

void sbx__open_reflect_stream(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"push", l_stream_push}, {"finish", l_stream_finish}, {"carry", l_stream_carry},
    {"total", l_stream_total}, {NULL, NULL}};
  sbx__class(L, STREAM_MT, methods, l_stream_gc);
  lua_getfield(L, -1, "reflect_filter");        /* opened before (core.c) */
  lua_pushcclosure(L, l_reflect_stream, 1);
  lua_setfield(L, -2, "reflect_stream");
}
