/*
 * sse_watch.c: the SSE error-event side watch of spec/rich-mode.md 11.5:
 * the event cutter (sse_watch.h) and core.sse_watch(), which reports the
 * first event of a response that is named `error` or whose data is a JSON
 * object with `type` "error" (the broker logs it as `stream error event:
 * <data>`). The worker's bytes are never touched: the watch sees copies.
 *
 * The cutter works on spans between LFs (memchr). An event inside one chunk
 * is handed out where it lies; only an event that spans chunks is copied,
 * into a buffer that never holds more than the bound plus the two bytes of
 * a blank line; an event over the bound is dropped at once and the rest of
 * it skipped, so memory stays bounded whatever the stream does. The binding
 * parses only events whose bytes could spell "error" (the word, or a \u
 * escape), and judges JSON (strict json.c) only for data that starts with
 * `{`.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "aux.h"
#include "json.h"
#include "needles.h"
#include "parts.h"
#include "sse_watch.h"

#define WATCH_MT "sbx.sse_watch"
#define EVENT_CAP (SBX_SSE_MAX_EVENT_BYTES + 2)

void sbx__sse_init(sbx__sse_t *w) {
  memset(w, 0, sizeof *w);
}

void sbx__sse_free(sbx__sse_t *w) {
  free(w->buf);
  free(w->data);
  memset(w, 0, sizeof *w);
}

/* A field line `name:value` or `name` alone: the value (one leading space
 * dropped) when the name matches, else NULL. */
static const char *field(const char *line, size_t len, const char *name, size_t *vlen) {
  size_t nl = strlen(name);
  if (len < nl || memcmp(line, name, nl) != 0) return NULL;
  if (len == nl) { *vlen = 0; return line + len; }
  if (line[nl] != ':') return NULL;
  line += nl + 1;
  len -= nl + 1;
  if (len > 0 && line[0] == ' ') { line++; len--; }
  *vlen = len;
  return line;
}

int sbx__sse_parse(sbx__sse_t *w, sbx__sse_event_t *ev) {
  const char *p = ev->raw, *end = ev->raw + ev->raw_len;
  size_t dl = 0;
  if (w->data == NULL && (w->data = malloc(EVENT_CAP)) == NULL) return -ENOMEM;
  ev->name = NULL;
  ev->name_len = 0;
  ev->has_data = 0;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p)), *v;
    size_t ll = (size_t)((nl ? nl : end) - p), vl;
    if (ll > 0 && p[ll - 1] == '\r') ll--;
    if ((v = field(p, ll, "event", &vl)) != NULL) {
      ev->name = v;
      ev->name_len = vl;
    } else if ((v = field(p, ll, "data", &vl)) != NULL) {
      if (ev->has_data) w->data[dl++] = '\n';
      memcpy(w->data + dl, v, vl);
      dl += vl;
      ev->has_data = 1;
    }
    p = nl ? nl + 1 : end;
  }
  ev->data = w->data;
  ev->data_len = dl;
  return 0;
}

/*
 * Spans between LFs: `ins` is where the current event's bytes in this chunk
 * begin; they are copied to w->buf only when the chunk ends mid-event, so an
 * event inside one chunk is handed out in place.
 */
int sbx__sse_feed(sbx__sse_t *w, const char *p, size_t n, size_t *used, sbx__sse_event_t *ev) {
  size_t at = 0, ins = 0;
  if (w->consumed) { w->len = 0; w->consumed = 0; }
  if (w->buf == NULL && (w->buf = malloc(EVENT_CAP)) == NULL) return -ENOMEM;
  while (at < n) {
    const char *nl = memchr(p + at, '\n', n - at);
    size_t span = nl ? (size_t)(nl - (p + at)) + 1 : n - at;
    size_t piece = nl ? span - 1 : span;           /* line bytes, LF excluded */
    size_t line_bytes, content;                    /* the current line, LF included */
    int candidate;                                 /* it may be the blank line */
    if (piece > 0) {
      w->line_cr = w->line_len == 0 && piece == 1 && p[at] == '\r';
      w->line_len += piece;
    }
    candidate = w->line_len == 0 || (w->line_len == 1 && w->line_cr);
    line_bytes = w->line_len + (nl ? 1 : 0);
    if (!w->discarding) {
      /* The event's bytes before a possible blank line count to the bound. */
      if (w->elen + span - (candidate ? line_bytes : 0) > SBX_SSE_MAX_EVENT_BYTES) {
        w->discarding = 1;
        w->elen = w->len = 0;
      } else {
        w->elen += span;
      }
    }
    at += span;
    if (nl == NULL) break;
    w->line_len = 0;
    w->line_cr = 0;
    if (!candidate) continue;
    /* A blank line: the event ends. */
    if (w->discarding) {
      w->discarding = 0;
      ins = at;
      continue;
    }
    content = w->elen - line_bytes;
    w->elen = 0;
    if (content == 0) { w->len = 0; ins = at; continue; }  /* nothing before it */
    if (w->len == 0) {
      ev->raw = p + ins;                           /* inside this chunk */
    } else {
      memcpy(w->buf + w->len, p + ins, at - ins);
      w->len += at - ins;
      ev->raw = w->buf;
    }
    ev->raw_len = content;
    w->consumed = 1;
    *used = at;
    return 1;
  }
  if (!w->discarding && at > ins) {                /* the chunk ends mid-event */
    memcpy(w->buf + w->len, p + ins, at - ins);
    w->len += at - ins;
  }
  *used = n;
  return 0;
}

/* ---- Lua: core.sse_watch() --------------------------------------------------- */

/* "error" and "\\u": an event holding neither cannot be reported. Built once
 * per process with the reflection filter's scanner, kept for its life. */
static sbx_reflect_t *may_error;
static pthread_once_t may_error_once = PTHREAD_ONCE_INIT;
static void build_may_error(void) {
  static const char *const nd[] = {"error", "\\u"};
  static const size_t len[] = {5, 2};
  if (sbx__needles_new(nd, len, 2, &may_error) != 0) may_error = NULL;
}

typedef struct {
  sbx__sse_t w;
  int reported;            /* the one report of this response is made */
  int broken;              /* out of memory: the watch gave up */
} watch_t;

static watch_t *check_watch(lua_State *L) {
  return luaL_checkudata(L, 1, WATCH_MT);
}

/* Could data be a JSON object whose type is "error"? The cheap test before
 * a strict decode: it starts with `{` and holds "error" or an escape. */
static int maybe_error_object(const char *d, size_t n) {
  size_t i = 0;
  while (i < n && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r')) i++;
  if (i == n || d[i] != '{') return 0;
  return memmem(d, n, "error", 5) != NULL || memmem(d, n, "\\u", 2) != NULL;
}

/* The data string on top: a JSON object with type == "error"? Pops nothing
 * but what it pushes. */
static int is_error_object(lua_State *L) {
  size_t n;
  const char *d = lua_tolstring(L, -1, &n);
  int yes = 0;
  if (sbx__json_decode(L, d, n, NULL) != 0) return 0;
  if (sbx__json_is_object(L, -1)) {
    if (lua_getfield(L, -1, "type") == LUA_TSTRING) {
      size_t tl;
      const char *t = lua_tolstring(L, -1, &tl);
      yes = tl == 5 && memcmp(t, "error", 5) == 0;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return yes;
}

/* watch:push(chunk) -> data of the first error event (once) | nil */
static int l_watch_push(lua_State *L) {
  watch_t *wt = check_watch(L);
  size_t n, used;
  const char *p = luaL_checklstring(L, 2, &n);
  sbx__sse_event_t ev;
  int rc;
  while (!wt->reported && !wt->broken && n > 0) {
    rc = sbx__sse_feed(&wt->w, p, n, &used, &ev);
    if (rc < 0) { wt->broken = 1; sbx__sse_free(&wt->w); break; }
    p += used;
    n -= used;
    if (rc == 0) break;
    /* Only an event that spells "error" (or might, through an escape) can
     * be reported: the rest are not even parsed. */
    if (!sbx_reflect_hit(may_error, ev.raw, ev.raw_len)) continue;
    if (sbx__sse_parse(&wt->w, &ev) != 0) { wt->broken = 1; sbx__sse_free(&wt->w); break; }
    if (ev.name != NULL && ev.name_len == 5 && memcmp(ev.name, "error", 5) == 0) {
      wt->reported = 1;
    } else if (ev.has_data && maybe_error_object(ev.data, ev.data_len)) {
      lua_pushlstring(L, ev.data, ev.data_len);
      wt->reported = is_error_object(L);
      lua_pop(L, 1);
    }
    if (wt->reported) {
      lua_pushlstring(L, ev.data, ev.data_len);
      sbx__sse_free(&wt->w);                       /* nothing more to watch */
      return 1;
    }
  }
  lua_pushnil(L);
  return 1;
}

static int l_watch_gc(lua_State *L) {
  sbx__sse_free(&check_watch(L)->w);
  return 0;
}

static int l_sse_watch(lua_State *L) {
  watch_t *wt;
  pthread_once(&may_error_once, build_may_error);
  if (may_error == NULL) return luaL_error(L, "out of memory");
  wt = lua_newuserdatauv(L, sizeof *wt, 0);
  memset(wt, 0, sizeof *wt);
  sbx__sse_init(&wt->w);
  luaL_setmetatable(L, WATCH_MT);
  return 1;
}

void sbx__open_sse_watch(lua_State *L) {
  static const luaL_Reg methods[] = {{"push", l_watch_push}, {NULL, NULL}};
  sbx__class(L, WATCH_MT, methods, l_watch_gc);
  lua_pushcfunction(L, l_sse_watch);
  lua_setfield(L, -2, "sse_watch");
}
