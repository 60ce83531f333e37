/*
 * json.h: what other parts use of strict JSON (json.c): the listener decodes
 * request bodies with it (spec/broker.md section 5 steps 10-11), the worker
 * compiles json.c into its own primitive module.
 */
#ifndef SBX_JSON_H
#define SBX_JSON_H

#include <stddef.h>
#include <lua.h>

struct sbx_reflect;

/*
 * Strict decode of buf into one Lua value pushed on L (spec/broker.md
 * section 8). When filter is non-NULL every decoded string, member names
 * included, is scanned and a hit fails the decode with SBX_EREFLECT.
 * Returns 0 or a negative SBX_E* code (nothing pushed then).
 */
int sbx__json_decode(lua_State *L, const char *buf, size_t len,
                     const struct sbx_reflect *filter);

/* The same with flags: SBX_JSON_LAST_WINS lets a repeated member name
 * replace the earlier value (the name keeps its first place) instead of
 * failing the decode. */
#define SBX_JSON_LAST_WINS 1
int sbx__json_decode_flags(lua_State *L, const char *buf, size_t len,
                           const struct sbx_reflect *filter, int flags);

/*
 * Bounded, shape-first decode (json_shape.c): buf is scanned first, building
 * nothing, against the shape table at stack index shape (0: none) and the
 * budget (bytes of Lua memory the decode may take, estimated upper bound);
 * only an acceptable body is then decoded. Returns 0 with the value pushed,
 * or a negative SBX_E* code with *why (a static string) and, when path is
 * given, where the scan stopped ("$.a[2].b").
 */
int sbx__json_decode_bounded(lua_State *L, const char *buf, size_t len,
                             const struct sbx_reflect *filter, int flags,
                             size_t budget, int shape, const char **why,
                             char *path, size_t path_cap);

/* 1 when the value at idx is a decoded JSON object (core.json_object_mt). */
int sbx__json_is_object(lua_State *L, int idx);

#endif
