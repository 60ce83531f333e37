/*
 * aux.c: the helpers the parts of `sandbox.core` share (see aux.h). Small,
 * allocation-free on the C heap, and free of libuv, so the worker links
 * this file with core/json.c and core/reflect.c.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "aux.h"

#define ERRNO_MAX 256            /* sbx__errno_from_name looks below this (Linux: < 134) */

/* ---- registry references ------------------------------------------------ */

int sbx__ref(lua_State *L, int idx) {
  lua_pushvalue(L, idx);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

void sbx__unref(lua_State *L, int *ref) {
  if (*ref != LUA_NOREF && *ref != LUA_REFNIL) luaL_unref(L, LUA_REGISTRYINDEX, *ref);
  *ref = LUA_NOREF;
}

/* ---- classes and boxes ---------------------------------------------------- */

void sbx__class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc) {
  if (luaL_newmetatable(L, name)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
}

sbx__box_t *sbx__box_new(lua_State *L, const char *mt) {
  sbx__box_t *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->obj = NULL;
  b->back = NULL;
  luaL_setmetatable(L, mt);
  return b;
}

void sbx__box_bind(sbx__box_t *box, void *obj, sbx__box_t **back) {
  box->obj = obj;
  box->back = back;
  if (back != NULL) *back = box;
}

void *sbx__box_check(lua_State *L, int idx, const char *mt) {
  sbx__box_t *b = luaL_checkudata(L, idx, mt);
  return b->obj;
}

void *sbx__box_detach(sbx__box_t *box) {
  void *obj = box->obj;
  if (box->back != NULL) *box->back = NULL;
  box->obj = NULL;
  box->back = NULL;
  return obj;
}

void sbx__box_unbind(sbx__box_t *box) {
  if (box == NULL) return;
  box->obj = NULL;
  box->back = NULL;
}

/* Only ever the __gc of a box metatable, so the userdata is a box. */
int sbx__box_gc(lua_State *L) {
  sbx__box_detach(lua_touserdata(L, 1));
  return 0;
}

/* ---- opts fields -------------------------------------------------------------- */

static lua_Integer integer_field(lua_State *L, int t, const char *who, const char *field,
                                 lua_Integer dflt, lua_Integer lo, lua_Integer hi, int required) {
  lua_Integer v = 0;
  int isint = 0;
  int type = lua_getfield(L, t, field);
  if (type == LUA_TNIL) {
    lua_pop(L, 1);
    if (required) luaL_error(L, "%s: opts.%s is required", who, field);
    return dflt;
  }
  if (type == LUA_TNUMBER) v = lua_tointegerx(L, -1, &isint);
  lua_pop(L, 1);
  if (!isint || v < lo || v > hi)
    luaL_error(L, "%s: opts.%s must be an integer in %I..%I", who, field, lo, hi);
  return v;
}

lua_Integer sbx__opt_integer_field(lua_State *L, int t, const char *who, const char *field,
                                   lua_Integer dflt, lua_Integer lo, lua_Integer hi) {
  return integer_field(L, t, who, field, dflt, lo, hi, 0);
}

lua_Integer sbx__check_integer_field(lua_State *L, int t, const char *who, const char *field,
                                     lua_Integer lo, lua_Integer hi) {
  return integer_field(L, t, who, field, 0, lo, hi, 1);
}

const char *sbx__opt_string_field(lua_State *L, int t, const char *who, const char *field,
                                  size_t max, size_t *len, int allow_nul) {
  const char *s;
  size_t n;
  int type = lua_getfield(L, t, field);
  if (type == LUA_TNIL) { lua_pop(L, 1); return NULL; }
  if (type != LUA_TSTRING) luaL_error(L, "%s: opts.%s must be a string", who, field);
  s = lua_tolstring(L, -1, &n);
  lua_pop(L, 1);                          /* anchored by the opts table */
  if (n > max) luaL_error(L, "%s: opts.%s is too long", who, field);
  if (!allow_nul && memchr(s, '\0', n) != NULL) luaL_error(L, "%s: opts.%s holds a NUL byte", who, field);
  if (len != NULL) *len = n;
  return s;
}

int sbx__opt_boolean_field(lua_State *L, int t, const char *who, const char *field, int dflt) {
  int v, type = lua_getfield(L, t, field);
  if (type == LUA_TNIL) { lua_pop(L, 1); return dflt; }
  if (type != LUA_TBOOLEAN) luaL_error(L, "%s: opts.%s must be a boolean", who, field);
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

const char *sbx__check_path(lua_State *L, int idx, size_t *len) {
  size_t n;
  const char *p = luaL_checklstring(L, idx, &n);
  luaL_argcheck(L, n > 0 && strlen(p) == n, idx, "path must be non-empty without NUL");
  if (len != NULL) *len = n;
  return p;
}

/* ---- the failure edge ------------------------------------------------------------ */

const char *sbx__errno_name(int err) {
  const char *name = err > 0 ? strerrorname_np(err) : NULL;
  return name != NULL ? name : "EUNKNOWN";
}

int sbx__errno_from_name(const char *name) {
  int e;
  if (name == NULL) return 0;
  for (e = 1; e < ERRNO_MAX; e++) {
    const char *n = strerrorname_np(e);
    if (n != NULL && strcmp(n, name) == 0) return e;
  }
  if (strcmp(name, "EWOULDBLOCK") == 0) return EWOULDBLOCK;   /* glibc names it EAGAIN */
  return 0;
}

int sbx__push_error(lua_State *L, int err, const char *msg) {
  const char *name = sbx__errno_name(err);
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", name, msg != NULL ? msg : strerror(err));
  lua_pushstring(L, name);
  return 3;
}

int sbx__push_failure(lua_State *L, int err, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  lua_pushstring(L, sbx__errno_name(err));
  return 3;
}

/* ---- process ------------------------------------------------------------------------ */

/* The operator log's format for the core's own lines (spec/operations.md
   2): Lua's logger (lua/sandbox/log.lua) sets it, so the few lines written
   from C look like the others. Process-wide, like stderr. */
static int log_json;

void sbx__log_set_json(int json) { log_json = json; }

int sbx__log_journal(void) {
  const char *js = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;
  if (js == NULL || sscanf(js, "%llu:%llu", &dev, &ino) != 2) return 0;
  if (fstat(2, &st) != 0) return 0;
  return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

size_t sbx__log_time(char *buf, size_t n) {
  struct timespec ts;
  struct tm tm;
  size_t k;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
  if (k == 0 || k + 6 > n) { if (n > 0) buf[0] = '\0'; return 0; }
  k += (size_t)snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
  return k;
}

static int syslog_priority(const char *level) {
  if (strcmp(level, "error") == 0) return 3;
  if (strcmp(level, "warn") == 0) return 4;
  if (strcmp(level, "debug") == 0) return 7;
  return 6;
}

void sbx__log(const char *level, const char *fmt, ...) {
  char msg[512], esc[1100], when[40];
  size_t i, k = 0;
  int journal = sbx__log_journal();
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  when[0] = '\0';
  if (!journal) sbx__log_time(when, sizeof when);
  if (!log_json) {
    if (journal) fprintf(stderr, "<%d>%s %s\n", syslog_priority(level), level, msg);
    else fprintf(stderr, "%s %s %s\n", when, level, msg);
    return;
  }
  for (i = 0; msg[i] != '\0' && k + 7 < sizeof esc; i++) {
    unsigned char c = (unsigned char)msg[i];
    if (c == '"' || c == '\\') { esc[k++] = '\\'; esc[k++] = (char)c; }
    else if (c < 0x20) k += (size_t)snprintf(esc + k, sizeof esc - k, "\\u%04x", c);
    else esc[k++] = (char)c;
  }
  esc[k] = '\0';
  if (journal)
    fprintf(stderr, "<%d>{\"level\":\"%s\",\"msg\":\"%s\"}\n", syslog_priority(level), level, esc);
  else
    fprintf(stderr, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"}\n", when, level, esc);
}

void sbx__ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
  }
}
