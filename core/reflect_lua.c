/*
 * reflect_lua.c: the Lua face of the credential reflection filter
 * (reflect.c, spec/broker.md section 12): core.reflect_filter(key) ->
 * filter with :hit(s) and :hit_value(v [, json_strings]). The filter's Lua
 * object is a box (aux.h) that owns it. hit_value decodes JSON strings
 * with json.c for the precheck rule; json.c itself needs only the pure
 * matcher (reflect.h), so the two files no longer include each other.
 */
#include <stddef.h>

#include "aux.h"
#include "json.h"
#include "parts.h"
#include "reflect.h"

/* The filter of the core.reflect_filter userdata at idx (raises otherwise). */
static const struct sbx_reflect *check_filter(lua_State *L, int idx) {
  const sbx_reflect_t *f = sbx__box_check(L, idx, SBX_REFLECT_MT);
  luaL_argcheck(L, f != NULL, idx, "reflection filter is closed");
  return f;
}

/* core.reflect_filter(key) -> filter | nil, err */
static int l_reflect_filter(lua_State *L) {
  size_t len;
  const char *key = luaL_checklstring(L, 1, &len);
  sbx__box_t *b;
  sbx_reflect_t *f = NULL;
  int rc;
  if (len == 0 || len > SBX_MAX_CREDENTIAL_BYTES) {
    lua_pushnil(L);
    lua_pushliteral(L, "invalid key length");
    return 2;
  }
  b = sbx__box_new(L, SBX_REFLECT_MT);
  rc = sbx_reflect_new(key, len, &f);
  if (rc != 0) {
    lua_pushnil(L);
    lua_pushstring(L, sbx_strerror(rc));
    return 2;
  }
  sbx__box_bind(b, f, NULL);
  return 1;
}

static int l_reflect_gc(lua_State *L) {
  sbx_reflect_free(sbx__box_detach(luaL_checkudata(L, 1, SBX_REFLECT_MT)));
  return 0;
}

/* filter:hit(s) -> boolean */
static int l_reflect_hit(lua_State *L) {
  const struct sbx_reflect *f = check_filter(L, 1);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  lua_pushboolean(L, sbx_reflect_hit(f, s, len));
  return 1;
}

/* Does s, after leading whitespace, start like JSON text worth decoding? */
static int looks_like_json(const char *s, size_t len) {
  size_t i = 0;
  while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' ||
                     s[i] == '\f' || s[i] == '\v'))
    i++;
  return i < len && (s[i] == '[' || s[i] == '{' || s[i] == '"');
}

/*
 * 1 when the value at idx holds a needle: a string, or a table whose keys
 * or values (recursively) do. Numbers, booleans, null never hit. Deeper
 * than SBX_MAX_JSON_DEPTH tables (or a cycle) count as a hit: a walk that
 * cannot finish must not pass a value on.
 *
 * json_strings (the precheck broker's rule, shared/spec/precheck.md 5.3):
 * a string or key that, trimmed, starts with '[', '{' or '"' is also decoded
 * as strict JSON and the value walked one level deeper; a string that does
 * not decode is only searched, except when it is too deep, which counts as
 * a hit (fail closed).
 */
static int hit_walk(lua_State *L, const struct sbx_reflect *f, int idx, int depth,
                    int json_strings) {
  size_t len;
  const char *s;
  int rc, hit;
  switch (lua_type(L, idx)) {
  case LUA_TSTRING:
    s = lua_tolstring(L, idx, &len);
    if (sbx_reflect_hit(f, s, len)) return 1;
    if (!json_strings || !looks_like_json(s, len)) return 0;
    if (depth + 1 >= SBX_MAX_JSON_DEPTH) return 1;
    luaL_checkstack(L, 2, "reflection walk");
    rc = sbx__json_decode(L, s, len, NULL);
    if (rc == SBX_EDEPTH) return 1;
    if (rc != 0) return 0;
    hit = hit_walk(L, f, lua_gettop(L), depth + 1, json_strings);
    lua_pop(L, 1);
    return hit;
  case LUA_TTABLE:
    if (depth >= SBX_MAX_JSON_DEPTH) return 1;
    luaL_checkstack(L, 4, "reflection walk");
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      int top = lua_gettop(L);
      if (hit_walk(L, f, top - 1, depth + 1, json_strings) ||
          hit_walk(L, f, top, depth + 1, json_strings)) {
        lua_pop(L, 2);
        return 1;
      }
      lua_pop(L, 1);
    }
    return 0;
  default:
    return 0;
  }
}

/* filter:hit_value(v [, json_strings]) -> boolean */
static int l_reflect_hit_value(lua_State *L) {
  const struct sbx_reflect *f = check_filter(L, 1);
  int json_strings;
  luaL_checkany(L, 2);
  json_strings = lua_toboolean(L, 3);
  lua_settop(L, 2);
  lua_pushboolean(L, hit_walk(L, f, 2, 0, json_strings));
  return 1;
}

void sbx__open_reflect(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"hit", l_reflect_hit}, {"hit_value", l_reflect_hit_value}, {NULL, NULL}};
  sbx__class(L, SBX_REFLECT_MT, methods, l_reflect_gc);
  lua_pushcfunction(L, l_reflect_filter);
  lua_setfield(L, -2, "reflect_filter");
}
