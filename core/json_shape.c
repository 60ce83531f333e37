/*
 * json_shape.c: bounded, shape-first decoding of untrusted request bodies
 * (issue 21 item 2): no body is decoded into Lua values before its size and
 * shape are known to be acceptable.
 *
 * Two passes over the text, the first building nothing at all:
 *
 *  1. scan: a strict validator with the decoder's grammar (json.c: UTF-8,
 *     escapes and surrogate pairs, the number grammar and a double's range,
 *     64 levels, nothing after the value) that walks the route's shape
 *     beside the text. A member an object's shape does not list is refused
 *     there and then ("unknown member at $.path"), or skipped when the shape
 *     drops unknown members; an array longer than its shape's max is refused.
 *     Meanwhile it adds up an upper bound of the Lua memory that decoding
 *     what is kept would take (tables, hash and array slots, the order
 *     lists, strings), and stops with "too large" the moment that passes
 *     the budget: a body of nested empty containers is refused after the
 *     scan has read budget/cost_of("{}") bytes, having allocated nothing.
 *  2. build: only then is the value built, with json.c's decoder
 *     (sbx__json_decode_flags) for every kept subtree; an object whose shape
 *     drops unknown members, and an array with an items shape, are built
 *     here member by member (element by element), so a dropped member is
 *     never decoded.
 *
 * A shape is a Lua table (read in place, nothing compiled or cached):
 *   { members = { name = <shape> | true, ... }, unknown = "refuse" | "drop" | "keep",
 *     items = <shape>, max = <n> }
 * `members` applies when the value is an object, `items`/`max` when it is an
 * array; a value of another kind is left to the route to judge (so its own
 * refusal texts stay), and `true` means any value. `unknown` defaults to
 * "refuse" when `members` is given. "drop" is honoured on the root object
 * and on objects reached from it through dropping objects and arrays with
 * an items shape only (below a refusing or keeping object a subtree is
 * decoded whole, and counted whole). A shape may refer to itself (a content
 * block holding content blocks): it is only walked as deep as the text.
 * Repeated members: with duplicates "last" (rich bodies) the last value wins
 * as in json.c; with "refuse", a repeated member that is dropped is not
 * noticed (it is never read), a kept one is refused.
 *
 * The cost model (COST_* below) is measured on Lua 5.4 x86-64 with glibc
 * (bench/body_memory_bench.lua prints the measured figures); it counts
 * allocator rounding and the power-of-two growth of array and hash parts,
 * so the estimate is above what the decoder really allocates.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

#include "aux.h"
#include "json.h"
#include "parts.h"
#include "reflect.h"
#include "sbx.h"
#include "utf8_put.h"

/* json.c's registry keys (the metatable of objects and the order table). */
#define SHAPE_OBJECT_MT_KEY "sbx.json.object_mt"
#define SHAPE_ORDER_KEY     "sbx.json.order"
#define SHAPE_ARRAY_MT_KEY  "sbx.json.array_mt"

/* Upper bounds, in bytes, of what json.c's decoder allocates. */
#define COST_TABLE      72     /* a Table (56) in its malloc chunk */
#define COST_OBJECT     (COST_TABLE * 2 + 64)  /* the table, its order list, its entry in the order table */
#define COST_ELEMENT    32     /* an array slot (16) with power-of-two growth */
#define COST_MEMBER     72     /* a hash node (24) with growth, plus its slot in the order list */
#define COST_STRING     40     /* a TString header (24) and malloc rounding, beside the bytes */
#define COST_BOX        48     /* the userdata an escaped string over 512 bytes is decoded in */
#define JSON_STR_STACK  512    /* json.c decodes escaped strings up to this size on the C stack */
#define NAME_MAX_BYTES  256    /* member names longer than this match no shape member */
#define PATH_MAX_BYTES  160
#define NUM_BUF         64
#define SLOTS_PER_LEVEL 8

typedef struct {
  lua_State *L;
  const unsigned char *p, *end;
  size_t cost, budget;
  int depth;
  const char *why;             /* the refusal, once set */
  char path[PATH_MAX_BYTES];   /* where: $.a.b[3] */
  size_t plen;
} scan_t;

static int fail(scan_t *s, const char *why) {
  if (s->why == NULL) s->why = why;
  return -1;
}

static int charge(scan_t *s, size_t n) {
  s->cost += n;
  if (s->cost > s->budget) return fail(s, "too large");
  return 0;
}

static void skip_ws(scan_t *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* ---- path of a refusal ---------------------------------------------------- */

static size_t path_push_name(scan_t *s, const char *name, size_t n) {
  size_t was = s->plen;
  if (s->plen + 2 >= sizeof s->path) return was;
  s->path[s->plen++] = '.';
  for (size_t i = 0; i < n && s->plen + 1 < sizeof s->path; i++) {
    unsigned char c = (unsigned char)name[i];
    int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    s->path[s->plen++] = plain ? (char)c : '?';
  }
  s->path[s->plen] = '\0';
  return was;
}

static size_t path_push_index(scan_t *s, lua_Integer i) {
  size_t was = s->plen;
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "[%lld]", (long long)i);
  if (n > 0 && s->plen + (size_t)n + 1 < sizeof s->path) {
    memcpy(s->path + s->plen, tmp, (size_t)n + 1);
    s->plen += (size_t)n;
  }
  return was;
}

static void path_pop(scan_t *s, size_t was) {
  s->plen = was;
  s->path[was] = '\0';
}

/* ---- strings -------------------------------------------------------------- */

/* Length of the valid multi-byte UTF-8 sequence at p (RFC 3629), or 0. */
static size_t utf8_seq(const unsigned char *p, size_t avail) {
  unsigned char c = p[0];
  if (c >= 0xC2 && c <= 0xDF) return avail >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return avail >= 3 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return avail >= 4 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80 ? 4 : 0;
  }
  return 0;
}

static long hex4(const unsigned char *p) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p[i];
    int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (h < 0) return -1;
    v = (v << 4) | h;
  }
  return v;
}

/*
 * A string, s->p just after its opening quote. When name is given, the
 * decoded bytes (up to NAME_MAX_BYTES) go there and *nlen is set, or to
 * NAME_MAX_BYTES + 1 when longer. *escaped tells whether it had escapes.
 */
static int scan_string(scan_t *s, char *name, size_t *nlen, int *escaped) {
  size_t n = 0;
  *escaped = 0;
  for (;;) {
    const unsigned char *run = s->p;
    while (s->p < s->end && *s->p >= 0x20 && *s->p < 0x80 && *s->p != '"' && *s->p != '\\') s->p++;
    if (name != NULL) {
      size_t k = (size_t)(s->p - run);
      if (n + k <= NAME_MAX_BYTES) memcpy(name + n, run, k);
      n += k;
    }
    if (s->p >= s->end) return fail(s, "invalid json");
    unsigned char c = *s->p;
    if (c == '"') {
      s->p++;
      break;
    }
    char out[4];
    size_t on = 0;
    if (c == '\\') {
      *escaped = 1;
      if (s->end - s->p < 2) return fail(s, "invalid json");
      unsigned char e = s->p[1];
      s->p += 2;
      switch (e) {
      case '"': case '\\': case '/': out[0] = (char)e; on = 1; break;
      case 'b': out[0] = '\b'; on = 1; break;
      case 'f': out[0] = '\f'; on = 1; break;
      case 'n': out[0] = '\n'; on = 1; break;
      case 'r': out[0] = '\r'; on = 1; break;
      case 't': out[0] = '\t'; on = 1; break;
      case 'u': {
        long cp, lo;
        if (s->end - s->p < 4 || (cp = hex4(s->p)) < 0) return fail(s, "invalid json");
        s->p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(s, "invalid json");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u') return fail(s, "invalid json");
          lo = hex4(s->p + 2);
          if (lo < 0xDC00 || lo > 0xDFFF) return fail(s, "invalid json");
          s->p += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        on = sbx__utf8_put(out, (unsigned long)cp);
        break;
      }
      default: return fail(s, "invalid json");
      }
    } else if (c >= 0x80) {
      on = utf8_seq(s->p, (size_t)(s->end - s->p));
      if (on == 0) return fail(s, "invalid json");
      memcpy(out, s->p, on);
      s->p += on;
    } else {
      return fail(s, "invalid json");                 /* raw control byte */
    }
    if (name != NULL) {
      if (n + on <= NAME_MAX_BYTES) memcpy(name + n, out, on);
      n += on;
    }
  }
  if (nlen != NULL) *nlen = n > NAME_MAX_BYTES ? NAME_MAX_BYTES + 1 : n;
  return 0;
}

/* ---- numbers -------------------------------------------------------------- */

static int digits(scan_t *s) {
  if (s->p >= s->end || *s->p < '0' || *s->p > '9') return 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') s->p++;
  return 1;
}

/* The number grammar, and a double's range (json.c refuses an overflow). */
static int scan_number(scan_t *s, int counted) {
  const unsigned char *start = s->p;
  int integral = 1;
  if (s->p < s->end && *s->p == '-') s->p++;
  if (s->p >= s->end) return fail(s, "invalid json");
  if (*s->p == '0') s->p++;
  else if (!digits(s)) return fail(s, "invalid json");
  if (s->p < s->end && *s->p == '.') {
    integral = 0;
    s->p++;
    if (!digits(s)) return fail(s, "invalid json");
  }
  if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
    integral = 0;
    s->p++;
    if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
    if (!digits(s)) return fail(s, "invalid json");
  }
  size_t n = (size_t)(s->p - start);
  if (integral && n <= 16) return 0;                   /* exact, never overflows */
  /* Long tokens: json.c converts a Lua string copy of them. */
  if (counted && n >= NUM_BUF && charge(s, n + COST_STRING) != 0) return -1;
  lua_State *L = s->L;
  char tmp[NUM_BUF];
  const char *z;
  if (n < sizeof tmp) {
    memcpy(tmp, start, n);
    tmp[n] = '\0';
    z = tmp;
  } else {
    z = lua_pushlstring(L, (const char *)start, n);
  }
  size_t ok = lua_stringtonumber(L, z);
  if (n >= sizeof tmp) lua_remove(L, ok ? -2 : -1);
  if (!ok) return fail(s, "invalid json");
  lua_Number f = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (isinf(f) || isnan(f)) return fail(s, "invalid json");
  return 0;
}

/* ---- values --------------------------------------------------------------- */

static int scan_value(scan_t *s, int shape, int counted, int honoured);

/* The field `key` of the shape table at idx pushed (nil when idx is 0). */
static int shape_field(lua_State *L, int idx, const char *key) {
  if (idx == 0) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  return lua_getfield(L, idx, key);
}

/* Finds name[0..n) among the keys of the members table at idx without
 * making a Lua string of it; pushes the member's shape (or true), or
 * nothing and returns 0. */
static int member_lookup(lua_State *L, int members, const char *name, size_t n) {
  if (n > NAME_MAX_BYTES) return 0;
  lua_pushnil(L);
  while (lua_next(L, members) != 0) {
    size_t kl;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &kl) : NULL;
    if (k != NULL && kl == n && memcmp(k, name, n) == 0) {
      lua_remove(L, -2);                              /* the key */
      return 1;
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* After a member or an element: 1 at ',' (another follows), 0 at the
 * closing byte, -1 otherwise. */
static int after_value(scan_t *s, unsigned char close) {
  skip_ws(s);
  if (s->p < s->end && *s->p == ',') {
    s->p++;
    return 1;
  }
  if (s->p < s->end && *s->p == close) {
    s->p++;
    return 0;
  }
  return fail(s, "invalid json");
}

/* Object, s->p just after '{'. unknown: 0 refuse, 1 drop, 2 keep. */
/* honoured: the build will make this value member by member (its parents
 * are all dropping objects or arrays with an items shape), so a member its
 * shape drops is never built and need not be counted. */
static int scan_object(scan_t *s, int shape, int counted, int honoured) {
  lua_State *L = s->L;
  int members = 0, unknown = 2, top = lua_gettop(L), more;
  char name[NAME_MAX_BYTES];
  if (shape != 0) {
    if (shape_field(L, shape, "members") == LUA_TTABLE) {
      members = lua_gettop(L);
      unknown = 0;
    } else {
      lua_pop(L, 1);
    }
    if (shape_field(L, shape, "unknown") == LUA_TSTRING) {
      const char *u = lua_tostring(L, -1);
      unknown = strcmp(u, "drop") == 0 ? 1 : strcmp(u, "keep") == 0 ? 2 : 0;
    }
    lua_pop(L, 1);
  }
  if (counted && charge(s, COST_OBJECT) != 0) return -1;
  skip_ws(s);
  if (s->p < s->end && *s->p == '}') {
    s->p++;
    lua_settop(L, top);
    return 0;
  }
  do {
    size_t nlen, raw;
    int escaped, sub = 0, keep = counted;
    skip_ws(s);
    if (s->p >= s->end || *s->p != '"') return fail(s, "invalid json");
    const unsigned char *nstart = ++s->p;
    if (scan_string(s, name, &nlen, &escaped) != 0) return -1;
    raw = (size_t)(s->p - nstart - 1);
    size_t was = path_push_name(s, name, nlen > NAME_MAX_BYTES ? NAME_MAX_BYTES : nlen);
    if (members != 0) {
      if (member_lookup(L, members, name, nlen)) {
        if (lua_type(L, -1) == LUA_TTABLE) sub = lua_gettop(L);
      } else if (unknown == 0) {
        s->why = NULL;
        return fail(s, "unknown member");
      } else if (unknown == 1) {
        if (honoured) keep = 0;              /* never built (else built whole: counted) */
      }
    }
    if (keep && charge(s, COST_MEMBER + COST_STRING + raw + (escaped && raw > JSON_STR_STACK ? raw + COST_BOX : 0)) != 0)
      return -1;
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':') return fail(s, "invalid json");
    s->p++;
    skip_ws(s);
    if (scan_value(s, sub, keep, honoured && unknown == 1 && members != 0) != 0) return -1;
    lua_settop(L, members != 0 ? members : top);
    path_pop(s, was);
    if ((more = after_value(s, '}')) < 0) return -1;
  } while (more);
  lua_settop(L, top);
  return 0;
}

static int scan_array(scan_t *s, int shape, int counted, int honoured) {
  lua_State *L = s->L;
  int items = 0, top = lua_gettop(L), more;
  lua_Integer max = -1, n = 0;
  if (shape != 0) {
    if (shape_field(L, shape, "items") == LUA_TTABLE) items = lua_gettop(L);
    else lua_pop(L, 1);
    if (shape_field(L, shape, "max") == LUA_TNUMBER) max = lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  if (counted && charge(s, COST_TABLE) != 0) return -1;
  skip_ws(s);
  if (s->p < s->end && *s->p == ']') {
    s->p++;
    lua_settop(L, top);
    return 0;
  }
  do {
    skip_ws(s);
    size_t was = path_push_index(s, n);
    if (max >= 0 && n >= max) return fail(s, "too many items");
    n++;
    if (counted && charge(s, COST_ELEMENT) != 0) return -1;
    if (scan_value(s, items, counted, honoured && items != 0) != 0) return -1;
    path_pop(s, was);
    if ((more = after_value(s, ']')) < 0) return -1;
  } while (more);
  lua_settop(L, top);
  return 0;
}

static int literal(scan_t *s, const char *lit, size_t n) {
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return fail(s, "invalid json");
  s->p += n;
  return 0;
}

static int scan_value(scan_t *s, int shape, int counted, int honoured) {
  int rc, escaped;
  if (s->p >= s->end) return fail(s, "invalid json");
  switch (*s->p) {
  case '{':
  case '[':
    if (s->depth >= SBX_MAX_JSON_DEPTH) return fail(s, "too deep");
    s->depth++;
    luaL_checkstack(s->L, SLOTS_PER_LEVEL, "json nesting");
    rc = *s->p++ == '{' ? scan_object(s, shape, counted, honoured) : scan_array(s, shape, counted, honoured);
    s->depth--;
    return rc;
  case '"': {
    const unsigned char *start = ++s->p;
    if (scan_string(s, NULL, NULL, &escaped) != 0) return -1;
    size_t raw = (size_t)(s->p - start - 1);
    if (!counted) return 0;
    return charge(s, COST_STRING + raw + (escaped && raw > JSON_STR_STACK ? raw + COST_BOX : 0));
  }
  case 't': return literal(s, "true", 4);
  case 'f': return literal(s, "false", 5);
  case 'n': return literal(s, "null", 4);
  default:
    if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) return scan_number(s, counted);
    return fail(s, "invalid json");
  }
}

/* Pass 1 over buf: 0, or -1 with s->why (and s->path) set. */
static int scan_all(scan_t *s, lua_State *L, const char *buf, size_t len, int shape, size_t budget) {
  memset(s, 0, sizeof *s);
  s->L = L;
  s->p = (const unsigned char *)buf;
  s->end = s->p + len;
  s->budget = budget;
  s->path[0] = '$';
  s->path[1] = '\0';
  s->plen = 1;
  skip_ws(s);
  if (scan_value(s, shape, 1, 1) != 0) return -1;
  skip_ws(s);
  if (s->p != s->end) return fail(s, "invalid json");
  return 0;
}

/* ---- pass 2: the build ---------------------------------------------------- */

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Past the validated string at p (its opening quote). */
static const unsigned char *skip_string(const unsigned char *p, const unsigned char *end) {
  p++;
  for (;;) {
    const unsigned char *q = memchr(p, '"', (size_t)(end - p)), *b;
    if (q == NULL) return end;
    for (b = q; b > p && b[-1] == '\\'; b--) {}
    if (((q - b) & 1) == 0) return q + 1;      /* an even run of backslashes: the closing quote */
    p = q + 1;
  }
}

/* Past the validated value at p (no whitespace before it). */
static const unsigned char *skip_value(const unsigned char *p, const unsigned char *end) {
  if (p >= end) return end;
  if (*p == '"') return skip_string(p, end);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (p < end) {
      unsigned char c = *p;
      if (c == '"') {
        p = skip_string(p, end);
        continue;
      }
      if (c == '{' || c == '[') depth++;
      else if ((c == '}' || c == ']') && --depth == 0) return p + 1;
      p++;
    }
    return end;
  }
  while (p < end && *p != ',' && *p != '}' && *p != ']' && !is_ws(*p)) p++;
  return p;
}

typedef struct {
  lua_State *L;
  const struct sbx_reflect *filter;
  int flags;
} build_t;

static int build_value(build_t *b, const unsigned char *p, const unsigned char *end, int shape,
                       const unsigned char **next);
static int build_object(build_t *b, const unsigned char *p, const unsigned char *end, int shape,
                        const unsigned char **next);

/* An object whose shape drops unknown members, at p ('{'), into a new
 * table with json.c's metatable and order list, read in one pass (*next:
 * past its '}'). Pushes it; 0 or SBX_E*. */
static int build_object(build_t *b, const unsigned char *p, const unsigned char *end, int shape,
                        const unsigned char **next) {
  lua_State *L = b->L;
  int members, obj, names, rc;
  lua_Integer n = 0;
  luaL_checkstack(L, SLOTS_PER_LEVEL * 2, "json nesting");
  lua_getfield(L, shape, "members");
  members = lua_gettop(L);
  lua_newtable(L);
  obj = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, SHAPE_OBJECT_MT_KEY);
  lua_setmetatable(L, obj);
  lua_newtable(L);
  names = lua_gettop(L);
  p++;                                                      /* '{' */
  for (;;) {
    while (p < end && (is_ws(*p) || *p == ',')) p++;
    if (p >= end || *p == '}') break;
    const unsigned char *ns = p, *ne = skip_string(p, end);
    p = ne;
    while (p < end && (is_ws(*p) || *p == ':')) p++;
    const unsigned char *vs = p;
    int found;
    if ((size_t)(ne - ns) - 2 > 6 * NAME_MAX_BYTES) {
      found = 0;                                            /* matches no member: never made */
    } else if (b->filter == NULL && memchr(ns, '\\', (size_t)(ne - ns)) == NULL) {
      /* A plain name: looked up as it stands, made a string only when kept. */
      found = member_lookup(L, members, (const char *)ns + 1, (size_t)(ne - ns) - 2);
      if (found) {
        lua_pushlstring(L, (const char *)ns + 1, (size_t)(ne - ns) - 2);
        lua_insert(L, -2);
      }
    } else {
      size_t nl;
      const char *nm;
      if ((rc = sbx__json_decode_flags(L, (const char *)ns, (size_t)(ne - ns), b->filter, b->flags)) != 0) return rc;
      nm = lua_tolstring(L, -1, &nl);
      found = member_lookup(L, members, nm, nl);
      if (!found) lua_pop(L, 1);
    }
    if (!found) {                                           /* dropped: skipped, never decoded */
      p = skip_value(vs, end);
      continue;
    }
    /* stack: ... name, its shape (or true) */
    if ((rc = build_value(b, vs, end, lua_type(L, -1) == LUA_TTABLE ? lua_gettop(L) : 0, &p)) != 0) return rc;
    lua_remove(L, -2);                                      /* the shape: name, value */
    lua_pushvalue(L, -2);
    if (lua_rawget(L, obj) != LUA_TNIL) {
      lua_pop(L, 1);
      if (!(b->flags & SBX_JSON_LAST_WINS)) return SBX_EINVAL;      /* repeated */
    } else {
      lua_pop(L, 1);
      lua_pushvalue(L, -2);
      lua_rawseti(L, names, ++n);
    }
    lua_rawset(L, obj);
  }
  lua_getfield(L, LUA_REGISTRYINDEX, SHAPE_ORDER_KEY);
  lua_pushvalue(L, obj);
  lua_pushvalue(L, names);
  lua_rawset(L, -3);
  lua_settop(L, obj);
  lua_remove(L, members);
  *next = p < end ? p + 1 : end;
  return 0;
}

/* An array whose shape has an items shape, at p ('['): each element built
 * by build_value with it, into a table with json.c's array metatable, in one
 * pass (*next: past its ']'). */
static int build_array(build_t *b, const unsigned char *p, const unsigned char *end, int items,
                       const unsigned char **next) {
  lua_State *L = b->L;
  lua_Integer n = 0;
  int arr, rc;
  luaL_checkstack(L, SLOTS_PER_LEVEL, "json nesting");
  lua_newtable(L);
  arr = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, SHAPE_ARRAY_MT_KEY);
  lua_setmetatable(L, arr);
  p++;                                                      /* '[' */
  for (;;) {
    while (p < end && (is_ws(*p) || *p == ',')) p++;
    if (p >= end || *p == ']') break;
    if ((rc = build_value(b, p, end, items, &p)) != 0) return rc;
    lua_rawseti(L, arr, ++n);
  }
  *next = p < end ? p + 1 : end;
  return 0;
}

/* The items shape of the array shape at idx, pushed, or 0 (nothing pushed). */
static int items_of(lua_State *L, int shape) {
  if (shape == 0) return 0;
  if (lua_getfield(L, shape, "items") == LUA_TTABLE) return lua_gettop(L);
  lua_pop(L, 1);
  return 0;
}

static int dropping(lua_State *L, int shape) {
  int yes;
  if (shape == 0) return 0;
  lua_getfield(L, shape, "unknown");
  yes = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "drop") == 0;
  lua_pop(L, 1);
  if (yes) {
    yes = lua_getfield(L, shape, "members") == LUA_TTABLE;
    lua_pop(L, 1);
  }
  return yes;
}

/* The value at p (validated; no whitespace before it), pushed; *next is
 * set past it. Made member by member where its shape drops or has items,
 * else decoded whole by json.c. */
static int build_value(build_t *b, const unsigned char *p, const unsigned char *end, int shape,
                       const unsigned char **next) {
  int items, rc;
  if (p < end && *p == '{' && dropping(b->L, shape)) return build_object(b, p, end, shape, next);
  if (p < end && *p == '[' && (items = items_of(b->L, shape)) != 0) {
    rc = build_array(b, p, end, items, next);
    if (rc == 0) lua_remove(b->L, items);                /* the array stays */
    return rc;
  }
  *next = skip_value(p, end);
  return sbx__json_decode_flags(b->L, (const char *)p, (size_t)(*next - p), b->filter, b->flags);
}

int sbx__json_decode_bounded(lua_State *L, const char *buf, size_t len, const struct sbx_reflect *filter,
                             int flags, size_t budget, int shape, const char **why, char *path, size_t path_cap) {
  scan_t s;
  build_t b = {L, filter, flags};
  int top = lua_gettop(L), rc;
  const unsigned char *p = (const unsigned char *)buf, *end = p + len;
  if (shape != 0) shape = lua_absindex(L, shape);
  *why = NULL;
  if (scan_all(&s, L, buf, len, shape, budget) != 0) {
    lua_settop(L, top);
    *why = s.why;
    if (path != NULL && path_cap > 0) snprintf(path, path_cap, "%s", s.path);
    return strcmp(s.why, "too large") == 0 ? SBX_ETOOBIG : strcmp(s.why, "too deep") == 0 ? SBX_EDEPTH : SBX_EINVAL;
  }
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  while (end > p && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\r' || end[-1] == '\t')) end--;
  rc = build_value(&b, p, end, shape, &p);
  if (rc != 0) {
    lua_settop(L, top);
    *why = rc == SBX_EREFLECT ? "reflection" : rc == SBX_EDEPTH ? "too deep" : "invalid json";
  }
  return rc;
}

/* ---- Lua functions -------------------------------------------------------- */

/* opts at idx: budget, duplicates, shape, filter. */
static void read_opts(lua_State *L, int idx, size_t *budget, int *flags, int *shape, const struct sbx_reflect **f) {
  lua_Integer bud;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_getfield(L, idx, "budget");
  bud = luaL_checkinteger(L, -1);
  luaL_argcheck(L, bud >= 0, idx, "opts.budget must not be negative");
  *budget = (size_t)bud;
  lua_pop(L, 1);
  *flags = 0;
  if (lua_getfield(L, idx, "duplicates") != LUA_TNIL) {
    const char *mode = lua_tostring(L, -1);
    luaL_argcheck(L, mode != NULL && (strcmp(mode, "last") == 0 || strcmp(mode, "refuse") == 0), idx,
                  "opts.duplicates must be \"last\" or \"refuse\"");
    if (strcmp(mode, "last") == 0) *flags |= SBX_JSON_LAST_WINS;
  }
  lua_pop(L, 1);
  *shape = 0;
  *f = NULL;
  if (lua_getfield(L, idx, "filter") != LUA_TNIL) {
    *f = sbx__box_check(L, lua_gettop(L), SBX_REFLECT_MT);
    luaL_argcheck(L, *f != NULL, idx, "reflection filter is closed");
  }
  /* left on the stack: keeps the filter alive */
  if (lua_getfield(L, idx, "shape") != LUA_TNIL) {
    luaL_checktype(L, -1, LUA_TTABLE);
    *shape = lua_gettop(L);
  }
}

/* core.json_decode_bounded(s, opts) -> value | nil, why [, path]
 * opts = {budget = bytes, duplicates = "last"|"refuse", shape = <shape>,
 * filter = core.reflect_filter}. why: "invalid json", "too deep", "too
 * large", "too many items", "unknown member" (path: where), "reflection". */
static int l_json_decode_bounded(lua_State *L) {
  size_t len, budget;
  const char *s = luaL_checklstring(L, 1, &len);
  int flags, shape;
  const struct sbx_reflect *f;
  const char *why;
  char path[PATH_MAX_BYTES];
  path[0] = '\0';
  lua_settop(L, 2);
  read_opts(L, 2, &budget, &flags, &shape, &f);
  if (sbx__json_decode_bounded(L, s, len, f, flags, budget, shape, &why, path, sizeof path) == 0) return 1;
  lua_pushnil(L);
  lua_pushstring(L, why);
  if (path[0] == '\0') return 2;
  lua_pushstring(L, path);
  return 3;
}

/* core.json_cost(s [, shape]) -> the estimated decode cost in bytes (of
 * what is kept) | nil, why [, path]. No budget: for specs and benches. */
static int l_json_cost(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  scan_t sc;
  int shape = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    shape = 2;
  }
  lua_settop(L, 2);
  if (scan_all(&sc, L, s, len, shape, SIZE_MAX) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, sc.why);
    lua_pushstring(L, sc.path);
    return 3;
  }
  lua_pushinteger(L, (lua_Integer)sc.cost);
  return 1;
}

/* core.json_shape_check(s, shape [, budget]) -> true | nil, why, path:
 * pass 1 alone, to name where a body is refused. */
static int l_json_shape_check(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_Integer bud = luaL_optinteger(L, 3, (lua_Integer)(SIZE_MAX >> 1));
  scan_t sc;
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  if (scan_all(&sc, L, s, len, 2, (size_t)bud) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, sc.why);
    lua_pushstring(L, sc.path);
    return 3;
  }
  lua_pushboolean(L, 1);
  return 1;
}

void sbx__open_json_shape(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"json_decode_bounded", l_json_decode_bounded}, {"json_cost", l_json_cost},
    {"json_shape_check", l_json_shape_check}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
