/*
 * json_fuzz.c: libFuzzer harness for the strict JSON parser and encoder
 * (core/json.c) through the C entry point the listener uses.
 *
 * Each input is decoded twice, without and with a reflection filter, and
 * the two outcomes must agree (a filtered success implies an unfiltered
 * success whose value the filter walk does not hit; an unfiltered success
 * that the filter refuses must be a value the walk hits). A decoded value
 * is encoded, the encoding decoded and encoded again: both encodings must
 * be byte-identical (round-trip stability). The shape-aware decoder of the
 * worker's reply (core.json_decode_shape with the reply's members) must
 * agree with the full decoder: it accepts exactly the documents the full
 * decoder reads as an object of those members only, each of its kind, with
 * the same values (hardening.md 7). Any disagreement aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lua.h>
#include <lualib.h>
#include <lauxlib.h>

#include "json.h"
#include "parts.h"
#include "sbx.h"

/* Two keys: "key" has a 3-byte needle (the SSE2 scan), "model" needles of
 * 5+ bytes (the skipping scan). The input's size picks one. */
static const char *const fuzz_keys[2] = {"key", "model"};

static lua_State *fuzz_L;
static sbx_reflect_t *fuzz_filter[2];

static void die(const char *what) {
  fprintf(stderr, "json_fuzz: %s\n", what);
  abort();
}

static int shape_ref = LUA_NOREF;   /* {ok="boolean", text="string", ...} */

/* 1 when the decoded value at idx is an object whose every member is one
 * of the reply's, of its kind. */
static int reply_shaped(lua_State *L, int idx) {
  int ok = 1;
  idx = lua_absindex(L, idx);
  if (!sbx__json_is_object(L, idx)) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, shape_ref);
  lua_pushnil(L);
  while (ok && lua_next(L, idx) != 0) {
    const char *kind = NULL;
    if (lua_type(L, -2) == LUA_TSTRING) {
      lua_pushvalue(L, -2);
      if (lua_rawget(L, -4) == LUA_TSTRING) kind = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
    if (kind == NULL) ok = 0;
    else if (strcmp(kind, "boolean") == 0) ok = lua_type(L, -1) == LUA_TBOOLEAN;
    else ok = lua_type(L, -1) == LUA_TSTRING;
    lua_pop(L, 1);
  }
  if (!ok) lua_pop(L, 1);                                    /* the key */
  lua_pop(L, 1);                                             /* the shape */
  return ok;
}

/* The shape decoder against the full one (plain == 0: its value at 3). */
static void check_shape(lua_State *L, const char *buf, size_t len, int plain) {
  int top = lua_gettop(L), shaped, expected = plain == 0 && reply_shaped(L, 3);
  if (lua_getfield(L, 1, "json_decode_shape") != LUA_TFUNCTION) die("json_decode_shape missing");
  lua_pushlstring(L, buf, len);
  lua_rawgeti(L, LUA_REGISTRYINDEX, shape_ref);
  lua_call(L, 2, 2);
  shaped = lua_istable(L, -2);
  if (shaped != expected) die(shaped ? "the shape decoder accepted what is not a reply" : "the shape decoder refused a reply");
  if (shaped) {
    lua_pushnil(L);
    while (lua_next(L, 3) != 0) {                            /* every member, the same value */
      lua_pushvalue(L, -2);
      lua_rawget(L, top + 1);
      if (!lua_rawequal(L, -1, -2)) die("the shape decoder read another value");
      lua_pop(L, 2);
    }
  }
  lua_settop(L, top);
}

/* Calls core[fn](value at idx [, extra]) and leaves its results (2 slots). */
static void call_core(lua_State *L, const char *fn, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, 1, fn) != LUA_TFUNCTION) die("core function missing");
  lua_pushvalue(L, idx);
  lua_call(L, 1, 2);
}

/* Encodes the value at idx; returns the string (pushed) or aborts. */
static const char *encode(lua_State *L, int idx, size_t *len) {
  call_core(L, "json_encode", idx);
  if (lua_type(L, -2) != LUA_TSTRING) die("a decoded value did not encode");
  lua_pop(L, 1);
  return lua_tolstring(L, -1, len);
}

/* Runs in protected mode: stack 1 = core module, 2 = filter userdata
 * (the Lua twin of fuzz_filter[which]), 3 = input, 4 = size, 5 = which. */
static int one_input(lua_State *L) {
  const char *buf = lua_touserdata(L, 3);
  size_t len = (size_t)lua_tointeger(L, 4);
  const sbx_reflect_t *filter = fuzz_filter[lua_tointeger(L, 5)];
  int plain, filtered;
  lua_settop(L, 2);

  plain = sbx__json_decode(L, buf, len, NULL);               /* -> 3 if ok */
  filtered = sbx__json_decode(L, buf, len, filter);
  if (plain != 0 && plain != SBX_EINVAL && plain != SBX_EDEPTH) die("bad code");
  if (filtered == 0) {
    if (plain != 0) die("filtered decode accepted what the plain one refused");
    if (lua_getfield(L, 2, "hit_value") != LUA_TFUNCTION) die("hit_value missing");
    lua_pushvalue(L, 2);
    lua_pushvalue(L, -3);
    lua_call(L, 2, 1);
    if (lua_toboolean(L, -1)) die("filter passed a value its walk hits");
    lua_pop(L, 2);                                            /* bool, value */
  } else if (filtered == SBX_EREFLECT) {
    if (plain == 0) {
      if (lua_getfield(L, 2, "hit_value") != LUA_TFUNCTION) die("hit_value missing");
      lua_pushvalue(L, 2);
      lua_pushvalue(L, 3);
      lua_call(L, 2, 1);
      if (!lua_toboolean(L, -1)) die("filter refused a value its walk does not hit");
      lua_pop(L, 1);
    }
  } else if (filtered != plain) {
    die("filtered and plain decodes disagree");
  }
  check_shape(L, buf, len, plain);
  if (plain != 0) return 0;

  /* Round trip: encode, decode, encode; the two encodings must be equal. */
  size_t n1, n2;
  const char *e1 = encode(L, 3, &n1);                         /* 4 */
  if (sbx__json_decode(L, e1, n1, NULL) != 0) die("an encoding did not decode");  /* 5 */
  const char *e2 = encode(L, 5, &n2);                         /* 6 */
  if (n1 != n2 || memcmp(e1, e2, n1) != 0) die("encoding is not stable");
  lua_settop(L, 2);
  return 0;
}

/* Main stack: 1 = core module, 2 and 3 = Lua filters for the two keys. */
static void setup(void) {
  lua_State *L = luaL_newstate();
  if (L == NULL) die("no lua state");
  luaL_openlibs(L);
  luaL_requiref(L, "sandbox.core", luaopen_sandbox_core, 0);   /* 1 */
  for (int i = 0; i < 2; i++) {
    lua_getfield(L, 1, "reflect_filter");
    lua_pushstring(L, fuzz_keys[i]);
    lua_call(L, 1, 1);                                          /* 2, 3 */
    if (sbx_reflect_new(fuzz_keys[i], strlen(fuzz_keys[i]), &fuzz_filter[i]) != 0)
      die("no filter");
  }
  lua_createtable(L, 0, 4);
  lua_pushliteral(L, "boolean");
  lua_setfield(L, -2, "ok");
  lua_pushliteral(L, "string");
  lua_setfield(L, -2, "text");
  lua_pushliteral(L, "boolean");
  lua_setfield(L, -2, "truncated");
  lua_pushliteral(L, "string");
  lua_setfield(L, -2, "reason");
  shape_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  fuzz_L = L;
}

static int traceback(lua_State *L) {
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L;
  if (fuzz_L == NULL) setup();
  int which = (int)(size & 1);
  L = fuzz_L;
  lua_settop(L, 3);
  lua_pushcfunction(L, traceback);                              /* 4 */
  lua_pushcfunction(L, one_input);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2 + which);
  lua_pushlightuserdata(L, (void *)data);
  lua_pushinteger(L, (lua_Integer)size);
  lua_pushinteger(L, which);
  if (lua_pcall(L, 5, 0, 4) != LUA_OK) {
    fprintf(stderr, "json_fuzz: lua error: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 3);
  return 0;
}
