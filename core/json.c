/*
 * json.c: strict JSON (spec/broker.md section 8) between bytes and Lua values.
 *
 * Decoding is a hand-written recursive-descent parser that builds Lua values
 * directly: objects are tables with metatable json_object_mt whose member
 * names, in received order, are kept in the weak-keyed table json_order;
 * arrays are tables with metatable json_array_mt; null is the light userdata
 * NULL (json_null). The parser refuses everything the spec refuses (BOM,
 * invalid UTF-8, unpaired surrogate escapes, repeated member names, nesting
 * deeper than SBX_MAX_JSON_DEPTH, anything but whitespace after the value,
 * numbers overflowing a double) and, given a reflection filter, scans every
 * decoded string and member name with it. With SBX_JSON_LAST_WINS (rich
 * mode's bodies, spec/rich-mode.md 19) a repeated member name is not refused:
 * the last value wins and the name keeps its first place in the order.
 *
 * Memory: neither direction uses the C heap. The decoder builds on the Lua
 * stack (strings with escapes are decoded on the C stack or, when long, in
 * a plain userdata); the encoder writes into a full userdata it replaces
 * when it grows, and sorts keys in another userdata. A Lua memory error
 * raised mid-way therefore leaks nothing: the garbage collector owns every
 * byte. No luaL_Buffer is left open on an error path (see
 * parse_string_slow).
 *
 * The metatables and the order table live in the registry (created on first
 * use), so C callers such as the listener can decode without the module
 * table at hand.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aux.h"
#include "json.h"
#include "parts.h"
#include "reflect.h"
#include "utf8_put.h"

#define JSON_OBJECT_MT_KEY "sbx.json.object_mt"
#define JSON_ARRAY_MT_KEY  "sbx.json.array_mt"
#define JSON_ORDER_KEY     "sbx.json.order"

/* Integers whose magnitude is at most 2^53 are exact in a double. */
#define JSON_MAX_EXACT     9007199254740992LL
/* Default bound of core.json_encode when max_bytes is not given. */
#define JSON_ENCODE_DEFAULT_MAX ((size_t)64 * 1024 * 1024)
/* Stack slots one nesting level may use, checked before descending. */
#define JSON_SLOTS_PER_LEVEL 12
/* Escaped strings up to this many raw bytes are decoded on the C stack. */
#define JSON_STR_STACK 512
/* Number tokens up to this length are converted from a C stack copy. */
#define JSON_NUM_BUF 64

/* ------------------------------------------------------------------ */
/* Registry: metatables and the order table                           */
/* ------------------------------------------------------------------ */

static void new_mt(lua_State *L, const char *key, const char *name) {
  lua_createtable(L, 0, 1);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  lua_setfield(L, LUA_REGISTRYINDEX, key);
}

/* Makes sure the registry holds the two metatables and the order table. */
static void ensure_registry(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, JSON_ORDER_KEY) == LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 1);
  new_mt(L, JSON_OBJECT_MT_KEY, "json.object");
  new_mt(L, JSON_ARRAY_MT_KEY, "json.array");
  lua_newtable(L);                       /* order table */
  lua_createtable(L, 0, 1);              /* its metatable: weak keys */
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, JSON_ORDER_KEY);
}

int sbx__json_is_object(lua_State *L, int idx) {
  int ok;
  if (lua_type(L, idx) != LUA_TTABLE || !lua_getmetatable(L, idx)) return 0;
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_OBJECT_MT_KEY);
  ok = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return ok;
}

/* ------------------------------------------------------------------ */
/* UTF-8                                                               */
/* ------------------------------------------------------------------ */

/*
 * Length of the valid multi-byte UTF-8 sequence starting at s[0] (a byte
 * >= 0x80), or 0 when it is invalid: overlong, a surrogate, above
 * U+10FFFF, truncated, or a stray continuation byte (RFC 3629 table).
 */
static size_t utf8_seq(const unsigned char *s, size_t avail) {
  unsigned char c = s[0];
  if (c >= 0xC2 && c <= 0xDF) {
    if (avail < 2 || (s[1] & 0xC0) != 0x80) return 0;
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;            /* overlong */
    if (c == 0xED) hi = 0x9F;            /* surrogates */
    if (avail < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xF0) lo = 0x90;            /* overlong */
    if (c == 0xF4) hi = 0x8F;            /* above U+10FFFF */
    if (avail < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 ||
        (s[3] & 0xC0) != 0x80)
      return 0;
    return 4;
  }
  return 0;
}

/* 1 when s[0..len) is strict UTF-8. ASCII runs go eight bytes at a time. */
static int utf8_valid(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    if (s[i] < 0x80) {
      while (i + 8 <= len) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL) break;
        i += 8;
      }
      while (i < len && s[i] < 0x80) i++;
      continue;
    }
    size_t n = utf8_seq(s + i, len - i);
    if (n == 0) return 0;
    i += n;
  }
  return 1;
}

/* ------------------------------------------------------------------ */
/* Decoder                                                             */
/* ------------------------------------------------------------------ */

/* 1 for the bytes that end a plain run inside a string: '"', '\\', a
 * control character, or a byte >= 0x80 (checked as UTF-8). */
static inline int str_stop(unsigned char c) {
  return (unsigned char)(c - 0x20) >= 0x60 || c == '"' || c == '\\';
}

typedef struct {
  lua_State *L;
  const unsigned char *p;      /* next byte */
  const unsigned char *end;    /* one past the last byte */
  const struct sbx_reflect *filter;
  int check_plain;             /* scan strings without escapes too */
  int last_wins;               /* a repeated member name replaces the value */
  int depth;                   /* containers currently open */
  int order_idx;               /* stack slots of the registry values */
  int obj_mt_idx;
  int arr_mt_idx;
} dec_t;

static void skip_ws(dec_t *d) {
  while (d->p < d->end &&
         (*d->p == ' ' || *d->p == '\n' || *d->p == '\r' || *d->p == '\t'))
    d->p++;
}

static int filter_hit(const dec_t *d, const char *s, size_t n) {
  return d->filter != NULL && sbx_reflect_hit(d->filter, s, n);
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Reads the four hex digits after "\u" at d->p; -1 when malformed. */
static long read_hex4(dec_t *d) {
  long v = 0;
  if (d->end - d->p < 4) return -1;
  for (int i = 0; i < 4; i++) {
    int h = hexval(d->p[i]);
    if (h < 0) return -1;
    v = (v << 4) | h;
  }
  d->p += 4;
  return v;
}

/*
 * Decodes one escape; d->p is just after the backslash. Writes the UTF-8
 * bytes to out (at least 4 bytes) and returns their count, or 0 on error.
 */
static size_t decode_escape(dec_t *d, char *out) {
  unsigned char c;
  long cp, lo;
  if (d->p >= d->end) return 0;
  c = *d->p++;
  switch (c) {
  case '"': out[0] = '"'; return 1;
  case '\\': out[0] = '\\'; return 1;
  case '/': out[0] = '/'; return 1;
  case 'b': out[0] = '\b'; return 1;
  case 'f': out[0] = '\f'; return 1;
  case 'n': out[0] = '\n'; return 1;
  case 'r': out[0] = '\r'; return 1;
  case 't': out[0] = '\t'; return 1;
  case 'u': break;
  default: return 0;
  }
  cp = read_hex4(d);
  if (cp < 0) return 0;
  if (cp >= 0xDC00 && cp <= 0xDFFF) return 0;          /* lone low half */
  if (cp >= 0xD800 && cp <= 0xDBFF) {                  /* needs its low half */
    if (d->end - d->p < 2 || d->p[0] != '\\' || d->p[1] != 'u') return 0;
    d->p += 2;
    lo = read_hex4(d);
    if (lo < 0xDC00 || lo > 0xDFFF) return 0;
    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
  }
  return sbx__utf8_put(out, (unsigned long)cp);
}

/*
 * Escaped string: start..d->p is a plain run already validated and d->p is
 * at a backslash. Finds the closing quote first: the raw length bounds the
 * decoded one (escapes only shrink), so the value is decoded into a C stack
 * array or, when longer, into a plain full userdata of that size, then
 * pushed. No luaL_Buffer: its to-be-closed box, left open on an error path
 * and closed by lua_settop, hits a Lua 5.4.4 bug (settop may use a stale
 * stack pointer). A userdata is just garbage after an error.
 */
static int parse_string_slow(dec_t *d, const unsigned char *start) {
  char stack_buf[JSON_STR_STACK];
  char *out = stack_buf;
  const unsigned char *q = d->p;
  size_t raw, n;
  int boxed = 0;
  while (q < d->end && *q != '"') q += (*q == '\\') ? 2 : 1;
  if (q >= d->end) return SBX_EINVAL;                  /* unterminated */
  raw = (size_t)(q - start);
  if (raw > sizeof stack_buf) {
    out = lua_newuserdatauv(d->L, raw, 0);
    boxed = 1;
  }
  n = (size_t)(d->p - start);
  memcpy(out, start, n);
  for (;;) {
    const unsigned char *run = d->p;
    while (d->p < d->end && !str_stop(*d->p)) d->p++;
    memcpy(out + n, run, (size_t)(d->p - run));
    n += (size_t)(d->p - run);
    if (d->p >= d->end) return SBX_EINVAL;
    unsigned char c = *d->p;
    if (c == '"') {
      d->p++;
      break;
    }
    if (c == '\\') {
      d->p++;
      size_t en = decode_escape(d, out + n);
      if (en == 0) return SBX_EINVAL;
      n += en;
    } else if (c >= 0x80) {
      size_t un = utf8_seq(d->p, (size_t)(d->end - d->p));
      if (un == 0) return SBX_EINVAL;
      memcpy(out + n, d->p, un);
      n += un;
      d->p += un;
    } else {
      return SBX_EINVAL;                               /* raw control byte */
    }
  }
  if (filter_hit(d, out, n)) return SBX_EREFLECT;
  lua_pushlstring(d->L, out, n);
  if (boxed) lua_remove(d->L, -2);
  return 0;
}

/* Parses a string (d->p just after the opening quote) and pushes it. */
static int parse_string(dec_t *d) {
  const unsigned char *start = d->p;
  for (;;) {
    while (d->p < d->end && !str_stop(*d->p)) d->p++;
    if (d->p >= d->end) return SBX_EINVAL;
    unsigned char c = *d->p;
    if (c == '"') break;
    if (c == '\\') return parse_string_slow(d, start);
    if (c < 0x80) return SBX_EINVAL;                   /* raw control byte */
    size_t n = utf8_seq(d->p, (size_t)(d->end - d->p));
    if (n == 0) return SBX_EINVAL;
    d->p += n;
  }
  /* No escapes: the bytes are the value. The whole-text prefilter in
   * sbx__json_decode has cleared them unless it matched (check_plain). */
  size_t len = (size_t)(d->p - start);
  d->p++;
  if (d->check_plain && filter_hit(d, (const char *)start, len)) return SBX_EREFLECT;
  lua_pushlstring(d->L, (const char *)start, len);
  return 0;
}

/* Converts the validated number token s[0..n) and pushes it. */
static int push_number_token(dec_t *d, const char *s, size_t n, int integral) {
  lua_State *L = d->L;
  char tmp[JSON_NUM_BUF];
  const char *z;
  int pushed_str = 0;

  /* Fast path: short integers are exact in both lua_Integer and double. */
  if (integral && n <= 16) {
    size_t i = (s[0] == '-');
    long long v = 0;
    for (; i < n; i++) v = v * 10 + (s[i] - '0');
    if (s[0] == '-') {
      if (v == 0) {
        lua_pushnumber(L, -0.0);                       /* keep the sign */
        return 0;
      }
      v = -v;
    }
    if (v <= JSON_MAX_EXACT && v >= -JSON_MAX_EXACT) {
      lua_pushinteger(L, (lua_Integer)v);
      return 0;
    }
    lua_pushnumber(L, (lua_Number)v);                  /* correctly rounded */
    return 0;
  }
  /* Everything else: Lua's own locale-safe strtod conversion. */
  if (n < sizeof tmp) {
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    z = tmp;
  } else {
    z = lua_pushlstring(L, s, n);                     /* NUL-terminated copy */
    pushed_str = 1;
  }
  if (lua_stringtonumber(L, z) == 0) {
    if (pushed_str) lua_pop(L, 1);
    return SBX_EINVAL;
  }
  if (pushed_str) lua_remove(L, -2);
  if (lua_isinteger(L, -1)) {                          /* integral, > 16 digits */
    lua_Integer v = lua_tointeger(L, -1);
    if (v > JSON_MAX_EXACT || v < -JSON_MAX_EXACT) {
      lua_pop(L, 1);
      lua_pushnumber(L, (lua_Number)v);
    }
    return 0;
  }
  lua_Number f = lua_tonumber(L, -1);
  if (isinf(f) || isnan(f)) {                          /* overflowed a double */
    lua_pop(L, 1);
    return SBX_EINVAL;
  }
  if (integral && f == 0 && s[0] == '-') {
    lua_pop(L, 1);
    lua_pushnumber(L, -0.0);
  }
  return 0;
}

/* Number per the JSON grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(dec_t *d) {
  const unsigned char *s = d->p;
  int integral = 1;
  if (d->p < d->end && *d->p == '-') d->p++;
  if (d->p >= d->end) return SBX_EINVAL;
  if (*d->p == '0') {
    d->p++;
  } else if (*d->p >= '1' && *d->p <= '9') {
    while (d->p < d->end && *d->p >= '0' && *d->p <= '9') d->p++;
  } else {
    return SBX_EINVAL;
  }
  if (d->p < d->end && *d->p == '.') {
    integral = 0;
    d->p++;
    if (d->p >= d->end || *d->p < '0' || *d->p > '9') return SBX_EINVAL;
    while (d->p < d->end && *d->p >= '0' && *d->p <= '9') d->p++;
  }
  if (d->p < d->end && (*d->p == 'e' || *d->p == 'E')) {
    integral = 0;
    d->p++;
    if (d->p < d->end && (*d->p == '+' || *d->p == '-')) d->p++;
    if (d->p >= d->end || *d->p < '0' || *d->p > '9') return SBX_EINVAL;
    while (d->p < d->end && *d->p >= '0' && *d->p <= '9') d->p++;
  }
  return push_number_token(d, (const char *)s, (size_t)(d->p - s), integral);
}

static int parse_value(dec_t *d);

static int enter(dec_t *d) {
  if (d->depth >= SBX_MAX_JSON_DEPTH) return SBX_EDEPTH;
  d->depth++;
  luaL_checkstack(d->L, JSON_SLOTS_PER_LEVEL, "json nesting");
  return 0;
}

/* Array: d->p just after '['. Pushes the table. */
static int parse_array(dec_t *d) {
  lua_State *L = d->L;
  lua_Integer n = 0;
  int rc = enter(d);
  if (rc != 0) return rc;
  lua_newtable(L);
  lua_pushvalue(L, d->arr_mt_idx);
  lua_setmetatable(L, -2);
  skip_ws(d);
  if (d->p < d->end && *d->p == ']') {
    d->p++;
    d->depth--;
    return 0;
  }
  for (;;) {
    skip_ws(d);
    if ((rc = parse_value(d)) != 0) return rc;
    lua_rawseti(L, -2, ++n);
    skip_ws(d);
    if (d->p >= d->end) return SBX_EINVAL;
    if (*d->p == ',') {
      d->p++;
      continue;
    }
    if (*d->p == ']') {
      d->p++;
      break;
    }
    return SBX_EINVAL;
  }
  d->depth--;
  return 0;
}

/*
 * Object: d->p just after '{'. Pushes the table and records its member
 * names, in order, as order[obj]. A repeated name (after escape decoding)
 * is found by a raw lookup in the table being built: values are never nil.
 */
static int parse_object(dec_t *d) {
  lua_State *L = d->L;
  lua_Integer n = 0;
  int obj, names;
  int rc = enter(d);
  if (rc != 0) return rc;
  lua_newtable(L);
  obj = lua_gettop(L);
  lua_pushvalue(L, d->obj_mt_idx);
  lua_setmetatable(L, obj);
  lua_newtable(L);
  names = lua_gettop(L);
  skip_ws(d);
  if (d->p < d->end && *d->p == '}') {
    d->p++;
  } else {
    for (;;) {
      skip_ws(d);
      if (d->p >= d->end || *d->p != '"') return SBX_EINVAL;
      d->p++;
      if ((rc = parse_string(d)) != 0) return rc;       /* key at names+1 */
      lua_pushvalue(L, -1);
      if (lua_rawget(L, obj) != LUA_TNIL) {                 /* repeated */
        if (!d->last_wins) return SBX_EINVAL;
        lua_pop(L, 1);                   /* its first place in the order stays */
      } else {
        lua_pop(L, 1);
        lua_pushvalue(L, -1);
        lua_rawseti(L, names, ++n);
      }
      skip_ws(d);
      if (d->p >= d->end || *d->p != ':') return SBX_EINVAL;
      d->p++;
      skip_ws(d);
      if ((rc = parse_value(d)) != 0) return rc;
      lua_rawset(L, obj);
      skip_ws(d);
      if (d->p >= d->end) return SBX_EINVAL;
      if (*d->p == ',') {
        d->p++;
        continue;
      }
      if (*d->p == '}') {
        d->p++;
        break;
      }
      return SBX_EINVAL;
    }
  }
  lua_pushvalue(L, obj);
  lua_pushvalue(L, names);
  lua_rawset(L, d->order_idx);                          /* order[obj] = names */
  lua_pop(L, 1);                                        /* names */
  d->depth--;
  return 0;
}

static int match_literal(dec_t *d, const char *lit, size_t n) {
  if ((size_t)(d->end - d->p) < n || memcmp(d->p, lit, n) != 0) return 0;
  d->p += n;
  return 1;
}

/* Parses one value at d->p (whitespace already skipped) and pushes it. */
static int parse_value(dec_t *d) {
  if (d->p >= d->end) return SBX_EINVAL;
  switch (*d->p) {
  case '{':
    d->p++;
    return parse_object(d);
  case '[':
    d->p++;
    return parse_array(d);
  case '"':
    d->p++;
    return parse_string(d);
  case 't':
    if (!match_literal(d, "true", 4)) return SBX_EINVAL;
    lua_pushboolean(d->L, 1);
    return 0;
  case 'f':
    if (!match_literal(d, "false", 5)) return SBX_EINVAL;
    lua_pushboolean(d->L, 0);
    return 0;
  case 'n':
    if (!match_literal(d, "null", 4)) return SBX_EINVAL;
    lua_pushlightuserdata(d->L, NULL);
    return 0;
  default:
    if (*d->p == '-' || (*d->p >= '0' && *d->p <= '9')) return parse_number(d);
    return SBX_EINVAL;
  }
}

int sbx__json_decode(lua_State *L, const char *buf, size_t len,
                     const struct sbx_reflect *filter) {
  return sbx__json_decode_flags(L, buf, len, filter, 0);
}

int sbx__json_decode_flags(lua_State *L, const char *buf, size_t len,
                           const struct sbx_reflect *filter, int flags) {
  int base = lua_gettop(L);
  int rc;
  dec_t d;
  luaL_checkstack(L, JSON_SLOTS_PER_LEVEL, "json decode");
  ensure_registry(L);
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ORDER_KEY);
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_OBJECT_MT_KEY);
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ARRAY_MT_KEY);
  d.L = L;
  d.p = (const unsigned char *)buf;
  d.end = d.p + len;
  d.filter = filter;
  d.last_wins = (flags & SBX_JSON_LAST_WINS) != 0;
  d.depth = 0;
  d.order_idx = base + 1;
  d.obj_mt_idx = base + 2;
  d.arr_mt_idx = base + 3;
  /* Prefilter: a string without escapes decodes to a substring of the text,
   * so when no needle occurs anywhere in the text, no such string can hold
   * one and only escaped strings (parse_string_slow) need their own scan.
   * When the text does match somewhere (maybe inside a number, or across a
   * string's edge), every string is scanned exactly, as the rule says. */
  d.check_plain = filter != NULL && sbx_reflect_hit(filter, buf, len);
  /* A byte-order mark (EF BB BF) is not whitespace: it fails below. */
  skip_ws(&d);
  rc = parse_value(&d);
  if (rc == 0) {
    skip_ws(&d);
    if (d.p != d.end) rc = SBX_EINVAL;                  /* trailing bytes */
  }
  if (rc != 0) {
    lua_settop(L, base);
    return rc;
  }
  lua_rotate(L, base + 1, 1);                           /* value to base+1 */
  lua_settop(L, base + 1);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Encoder                                                             */
/* ------------------------------------------------------------------ */

#define ENC_OK        0
#define ENC_TOOLARGE  1
#define ENC_INVALID   2
#define ENC_DEEP      3
#define ENC_UTF8      4

typedef struct {
  lua_State *L;
  int buf_idx;          /* stack slot of the userdata holding the bytes */
  char *buf;
  size_t len, cap;
  size_t max;           /* output bound */
  int depth;
  int order_idx, obj_mt_idx, arr_mt_idx;
} enc_t;

/* Makes room for n more bytes: grows by replacing the buffer userdata. */
static int enc_reserve(enc_t *e, size_t n) {
  size_t need, cap;
  char *nb;
  if (n > e->max - e->len) return ENC_TOOLARGE;
  need = e->len + n;
  if (need <= e->cap) return ENC_OK;
  cap = e->cap ? e->cap : 256;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  if (cap > e->max) cap = e->max;
  nb = lua_newuserdatauv(e->L, cap, 0);
  if (e->len) memcpy(nb, e->buf, e->len);
  lua_replace(e->L, e->buf_idx);
  e->buf = nb;
  e->cap = cap;
  return ENC_OK;
}

static int enc_add(enc_t *e, const char *s, size_t n) {
  int rc = enc_reserve(e, n);
  if (rc != ENC_OK) return rc;
  memcpy(e->buf + e->len, s, n);
  e->len += n;
  return ENC_OK;
}

static int enc_char(enc_t *e, char c) {
  return enc_add(e, &c, 1);
}

/* Bytes that need an escape in a JSON string: '"', '\\' and controls. */
static inline int str_esc(unsigned char c) {
  return c < 0x20 || c == '"' || c == '\\';
}

static int enc_string(enc_t *e, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run;
  int rc;
  if (!utf8_valid(u, n)) return ENC_UTF8;
  if ((rc = enc_char(e, '"')) != ENC_OK) return rc;
  while (i < n) {
    run = i;
    while (i < n && !str_esc(u[i])) i++;
    if (i > run && (rc = enc_add(e, s + run, i - run)) != ENC_OK) return rc;
    if (i >= n) break;
    char esc[6] = {'\\', 0, 0, 0, 0, 0};
    size_t en = 2;
    switch (u[i]) {
    case '"': esc[1] = '"'; break;
    case '\\': esc[1] = '\\'; break;
    case '\b': esc[1] = 'b'; break;
    case '\f': esc[1] = 'f'; break;
    case '\n': esc[1] = 'n'; break;
    case '\r': esc[1] = 'r'; break;
    case '\t': esc[1] = 't'; break;
    default:
      esc[1] = 'u';
      esc[2] = '0';
      esc[3] = '0';
      esc[4] = hex[u[i] >> 4];
      esc[5] = hex[u[i] & 15];
      en = 6;
    }
    if ((rc = enc_add(e, esc, en)) != ENC_OK) return rc;
    i++;
  }
  return enc_char(e, '"');
}

/* Formats a finite float: integral values within 2^53 as integers, others
 * in the shortest of %.15g/%.16g/%.17g that reads back to the same double. */
static int enc_float(enc_t *e, double v) {
  char tmp[40];
  int n = 0;
  if (isnan(v) || isinf(v)) return ENC_INVALID;
  if (v == floor(v) && fabs(v) <= (double)JSON_MAX_EXACT) {
    if (v == 0 && signbit(v))
      n = snprintf(tmp, sizeof tmp, "-0");
    else
      n = snprintf(tmp, sizeof tmp, "%lld", (long long)v);
  } else {
    for (int prec = 15; prec <= 17; prec++) {
      n = snprintf(tmp, sizeof tmp, "%.*g", prec, v);
      if (prec == 17 || strtod(tmp, NULL) == v) break;
    }
    /* Under a locale with another decimal point, write '.'. */
    for (int i = 0; i < n; i++)
      if (!((tmp[i] >= '0' && tmp[i] <= '9') || tmp[i] == '-' || tmp[i] == '+' ||
            tmp[i] == 'e' || tmp[i] == 'E'))
        tmp[i] = '.';
  }
  if (n <= 0 || (size_t)n >= sizeof tmp) return ENC_INVALID;
  return enc_add(e, tmp, (size_t)n);
}

static int enc_value(enc_t *e, int idx);

/* One member: "name":value, with the value at the stack top (popped). */
static int enc_member(enc_t *e, const char *name, size_t nlen, int *first) {
  int rc;
  if (!*first && (rc = enc_char(e, ',')) != ENC_OK) return rc;
  *first = 0;
  if ((rc = enc_string(e, name, nlen)) != ENC_OK) return rc;
  if ((rc = enc_char(e, ':')) != ENC_OK) return rc;
  rc = enc_value(e, lua_gettop(e->L));
  lua_pop(e->L, 1);
  return rc;
}

/* Elements 1..n of the table at idx. A nil element is invalid. */
static int enc_array(enc_t *e, int idx, lua_Integer n) {
  int rc;
  if ((rc = enc_char(e, '[')) != ENC_OK) return rc;
  for (lua_Integer i = 1; i <= n; i++) {
    if (i > 1 && (rc = enc_char(e, ',')) != ENC_OK) return rc;
    lua_rawgeti(e->L, idx, i);
    rc = enc_value(e, lua_gettop(e->L));
    lua_pop(e->L, 1);
    if (rc != ENC_OK) return rc;
  }
  return enc_char(e, ']');
}

typedef struct {
  const char *s;
  size_t n;
} key_ref_t;

static int key_cmp(const void *a, const void *b) {
  const key_ref_t *x = a, *y = b;
  size_t m = x->n < y->n ? x->n : y->n;
  int c = memcmp(x->s, y->s, m);
  if (c != 0) return c;
  return (x->n > y->n) - (x->n < y->n);
}

/*
 * Members of the table at idx: first the names of order_list (at
 * order_idx, 0 when none) whose value is not nil, each once, then every
 * other string key in byte order. The key strings stay alive while they
 * are keys of the table, which is on the stack and only read raw.
 */
static int enc_object(enc_t *e, int idx, int order_list) {
  lua_State *L = e->L;
  int first = 1, rc, seen = 0;
  size_t nkeys = 0, nrest = 0, k = 0;
  key_ref_t *rest;
  if ((rc = enc_char(e, '{')) != ENC_OK) return rc;
  /* Count keys; refuse non-string keys. */
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      lua_pop(L, 1);
      return ENC_INVALID;
    }
    nkeys++;
  }
  if (order_list != 0) {
    lua_Integer on = (lua_Integer)lua_rawlen(L, order_list);
    lua_newtable(L);                                 /* names written */
    seen = lua_gettop(L);
    for (lua_Integer i = 1; i <= on; i++) {
      size_t nlen;
      const char *name;
      if (lua_rawgeti(L, order_list, i) != LUA_TSTRING) {
        lua_pop(L, 1);
        continue;
      }
      lua_pushvalue(L, -1);
      if (lua_rawget(L, seen) != LUA_TNIL) {         /* listed twice */
        lua_pop(L, 2);
        continue;
      }
      lua_pop(L, 1);
      lua_pushvalue(L, -1);
      if (lua_rawget(L, idx) == LUA_TNIL) {          /* member removed */
        lua_pop(L, 2);
        continue;
      }
      lua_pushvalue(L, -2);
      lua_pushboolean(L, 1);
      lua_rawset(L, seen);
      name = lua_tolstring(L, -2, &nlen);
      rc = enc_member(e, name, nlen, &first);        /* pops the value */
      lua_pop(L, 1);                                 /* name */
      if (rc != ENC_OK) return rc;
      k++;
    }
  }
  if (k < nkeys) {
    rest = lua_newuserdatauv(L, (nkeys - k) * sizeof *rest, 0);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      lua_pop(L, 1);
      if (seen != 0) {
        lua_pushvalue(L, -1);
        int was = lua_rawget(L, seen) != LUA_TNIL;
        lua_pop(L, 1);
        if (was) continue;
      }
      if (nrest < nkeys - k) {
        rest[nrest].s = lua_tolstring(L, -1, &rest[nrest].n);
        nrest++;
      }
    }
    qsort(rest, nrest, sizeof *rest, key_cmp);
    for (size_t i = 0; i < nrest; i++) {
      lua_pushlstring(L, rest[i].s, rest[i].n);
      lua_rawget(L, idx);
      if ((rc = enc_member(e, rest[i].s, rest[i].n, &first)) != ENC_OK) return rc;
    }
  }
  return enc_char(e, '}');
}

/* 1 when the plain table at idx is a non-empty sequence 1..n; sets *n. */
static int is_sequence(lua_State *L, int idx, lua_Integer *n) {
  lua_Integer count = 0, max = 0;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1)) {
      lua_pop(L, 1);
      return 0;
    }
    lua_Integer k = lua_tointeger(L, -1);
    if (k < 1) {
      lua_pop(L, 1);
      return 0;
    }
    if (k > max) max = k;
    count++;
  }
  *n = count;
  return count > 0 && max == count;
}

static int enc_table(enc_t *e, int idx) {
  lua_State *L = e->L;
  int top = lua_gettop(L), rc;
  lua_Integer n;
  if (e->depth >= SBX_MAX_JSON_DEPTH) return ENC_DEEP;
  e->depth++;
  luaL_checkstack(L, JSON_SLOTS_PER_LEVEL, "json nesting");
  if (lua_getmetatable(L, idx)) {
    int is_arr = lua_rawequal(L, -1, e->arr_mt_idx);
    int is_obj = lua_rawequal(L, -1, e->obj_mt_idx);
    lua_pop(L, 1);
    if (is_arr) {
      rc = enc_array(e, idx, (lua_Integer)lua_rawlen(L, idx));
      goto done;
    }
    if (is_obj) {
      lua_pushvalue(L, idx);
      int list = lua_rawget(L, e->order_idx) == LUA_TTABLE ? lua_gettop(L) : 0;
      rc = enc_object(e, idx, list);
      goto done;
    }
  }
  if (is_sequence(L, idx, &n))
    rc = enc_array(e, idx, n);
  else
    rc = enc_object(e, idx, 0);
done:
  lua_settop(L, top);
  e->depth--;
  return rc;
}

static int enc_value(enc_t *e, int idx) {
  lua_State *L = e->L;
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    return enc_string(e, s, n);
  }
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      char tmp[32];
      int n = snprintf(tmp, sizeof tmp, LUA_INTEGER_FMT, lua_tointeger(L, idx));
      return enc_add(e, tmp, (size_t)n);
    }
    return enc_float(e, (double)lua_tonumber(L, idx));
  case LUA_TBOOLEAN:
    return lua_toboolean(L, idx) ? enc_add(e, "true", 4) : enc_add(e, "false", 5);
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == NULL) return enc_add(e, "null", 4);
    return ENC_INVALID;
  case LUA_TTABLE:
    return enc_table(e, idx);
  default:
    return ENC_INVALID;
  }
}

/* ------------------------------------------------------------------ */
/* Shape-aware decoding of one flat object (shared/spec/hardening.md 7) */
/* ------------------------------------------------------------------ */

/*
 * An untrusted document that must be one object of known scalar members
 * (the worker's reply): each member name is looked up in the shape before
 * its value is read, so an unknown member, a value of another kind (an
 * array, an object) or a value past max_values is refused at its first
 * byte and nothing of it is ever built. Memory: the member values only.
 */
#define SHAPE_DEFAULT_MAX_VALUES 1024

enum { K_BOOLEAN, K_STRING, K_NUMBER, K_NULL, K_BAD };

static int shape_kind(lua_State *L, int shape) {
  const char *k;
  int t;
  lua_pushvalue(L, -1);                          /* the member name */
  t = lua_rawget(L, shape);
  k = t == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  lua_pop(L, 1);
  if (k == NULL) return -1;                      /* unknown member */
  if (strcmp(k, "boolean") == 0) return K_BOOLEAN;
  if (strcmp(k, "string") == 0) return K_STRING;
  if (strcmp(k, "number") == 0) return K_NUMBER;
  if (strcmp(k, "null") == 0) return K_NULL;
  return K_BAD;
}

/* Pushes the value of kind k at d->p, or fails with "wrong type". */
static const char *shape_value(dec_t *d, int k) {
  const unsigned char c = d->p < d->end ? *d->p : 0;
  int rc = SBX_EINVAL;
  if (k == K_BOOLEAN && c == 't' && match_literal(d, "true", 4)) {
    lua_pushboolean(d->L, 1);
    return NULL;
  }
  if (k == K_BOOLEAN && c == 'f' && match_literal(d, "false", 5)) {
    lua_pushboolean(d->L, 0);
    return NULL;
  }
  if (k == K_NULL && c == 'n' && match_literal(d, "null", 4)) {
    lua_pushlightuserdata(d->L, NULL);
    return NULL;
  }
  if (k == K_STRING && c == '"') {
    d->p++;
    rc = parse_string(d);
  } else if (k == K_NUMBER && (c == '-' || (c >= '0' && c <= '9'))) {
    rc = parse_number(d);
  } else {
    return "wrong type";
  }
  return rc == 0 ? NULL : "invalid json";
}

/* The object at d->p into the table at the top; NULL or why it is refused. */
static const char *shape_object(dec_t *d, int shape, lua_Integer max_values) {
  lua_State *L = d->L;
  int out = lua_gettop(L);
  lua_Integer values = 1;                        /* the object itself */
  skip_ws(d);
  if (d->p >= d->end || *d->p != '{') return "not an object";
  d->p++;
  skip_ws(d);
  if (d->p < d->end && *d->p == '}') {
    d->p++;
    return NULL;
  }
  for (;;) {
    const char *why;
    int k;
    skip_ws(d);
    if (d->p >= d->end || *d->p != '"') return "invalid json";
    d->p++;
    if (parse_string(d) != 0) return "invalid json";         /* name at top */
    if ((k = shape_kind(L, shape)) < 0) return "unknown member";
    if (k == K_BAD) return "wrong type";
    lua_pushvalue(L, -1);
    if (lua_rawget(L, out) != LUA_TNIL) return "invalid json";   /* repeated */
    lua_pop(L, 1);
    skip_ws(d);
    if (d->p >= d->end || *d->p != ':') return "invalid json";
    d->p++;
    skip_ws(d);
    if (++values > max_values) return "too many values";
    if ((why = shape_value(d, k)) != NULL) return why;
    lua_rawset(L, out);
    skip_ws(d);
    if (d->p >= d->end) return "invalid json";
    if (*d->p == ',') {
      d->p++;
      continue;
    }
    if (*d->p == '}') {
      d->p++;
      return NULL;
    }
    return "invalid json";
  }
}

/* core.json_decode_shape(s, shape [, max_values]) -> table | nil, why
 * shape = {name = "boolean"|"string"|"number"|"null", ...}; why is "not an
 * object", "unknown member", "wrong type", "too many values" or "invalid
 * json". The table is a plain one holding the members present. */
static int l_json_decode_shape(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_Integer max = luaL_optinteger(L, 3, SHAPE_DEFAULT_MAX_VALUES);
  const char *why;
  dec_t d;
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_argcheck(L, max >= 1, 3, "max_values must be positive");
  lua_settop(L, 2);
  luaL_checkstack(L, JSON_SLOTS_PER_LEVEL, "json decode");
  memset(&d, 0, sizeof d);
  d.L = L;
  d.p = (const unsigned char *)s;
  d.end = d.p + len;
  lua_newtable(L);                                         /* 3: the result */
  why = shape_object(&d, 2, max);
  if (why == NULL) {
    skip_ws(&d);
    if (d.p != d.end) why = "invalid json";                /* trailing bytes */
  }
  if (why != NULL) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
  }
  lua_settop(L, 3);
  return 1;
}

/* ------------------------------------------------------------------ */
/* Lua functions                                                       */
/* ------------------------------------------------------------------ */


/* core.json_decode(s [, filter]) -> value | nil, err */
static int l_json_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  const struct sbx_reflect *f = NULL;
  int rc;
  int flags = 0;
  if (!lua_isnoneornil(L, 2)) {
    f = sbx__box_check(L, 2, SBX_REFLECT_MT);
    luaL_argcheck(L, f != NULL, 2, "reflection filter is closed");
  }
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_getfield(L, 3, "duplicates");
    if (!lua_isnil(L, -1)) {
      const char *mode = lua_tostring(L, -1);
      luaL_argcheck(L, mode != NULL && (strcmp(mode, "last") == 0 || strcmp(mode, "refuse") == 0), 3,
                    "opts.duplicates must be \"last\" or \"refuse\"");
      if (strcmp(mode, "last") == 0) flags |= SBX_JSON_LAST_WINS;
    }
  }
  lua_settop(L, 2);
  rc = sbx__json_decode_flags(L, s, len, f, flags);
  if (rc == 0) return 1;
  lua_pushnil(L);
  lua_pushstring(L, rc == SBX_EDEPTH ? "too deep"
                    : rc == SBX_EREFLECT ? "reflection" : "invalid json");
  return 2;
}

/* core.json_encode(v [, max_bytes]) -> string | nil, err */
static int l_json_encode(lua_State *L) {
  static const char *const errs[] = {
    [ENC_TOOLARGE] = "too large", [ENC_INVALID] = "invalid value",
    [ENC_DEEP] = "too deep", [ENC_UTF8] = "invalid utf-8"};
  enc_t e;
  int rc;
  lua_Integer max = (lua_Integer)JSON_ENCODE_DEFAULT_MAX;
  luaL_checkany(L, 1);
  if (!lua_isnoneornil(L, 2)) {
    max = luaL_checkinteger(L, 2);
    luaL_argcheck(L, max >= 0, 2, "max_bytes must not be negative");
  }
  lua_settop(L, 1);
  ensure_registry(L);
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ORDER_KEY);      /* 2 */
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_OBJECT_MT_KEY);  /* 3 */
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ARRAY_MT_KEY);   /* 4 */
  lua_pushnil(L);                                          /* 5: buffer */
  e.L = L;
  e.buf_idx = 5;
  e.buf = NULL;
  e.len = e.cap = 0;
  e.max = (size_t)max;                     /* size_t is 64-bit here */
  e.depth = 0;
  e.order_idx = 2;
  e.obj_mt_idx = 3;
  e.arr_mt_idx = 4;
  rc = enc_value(&e, 1);
  if (rc != ENC_OK) {
    lua_pushnil(L);
    lua_pushstring(L, errs[rc]);
    return 2;
  }
  lua_pushlstring(L, e.buf ? e.buf : "", e.len);
  return 1;
}

/* core.utf8_valid(s) -> boolean (strict: no overlongs, no surrogates). */
static int l_utf8_valid(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  lua_pushboolean(L, utf8_valid((const unsigned char *)s, n));
  return 1;
}

void sbx__open_json(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"json_decode", l_json_decode}, {"json_encode", l_json_encode},
    {"json_decode_shape", l_json_decode_shape}, {"utf8_valid", l_utf8_valid}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
  ensure_registry(L);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "json_null");
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_OBJECT_MT_KEY);
  lua_setfield(L, -2, "json_object_mt");
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ARRAY_MT_KEY);
  lua_setfield(L, -2, "json_array_mt");
  lua_getfield(L, LUA_REGISTRYINDEX, JSON_ORDER_KEY);
  lua_setfield(L, -2, "json_order");
}
