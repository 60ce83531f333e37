/*
 * loop.c: the libuv loop of a Lua state (sbx__loop, created on first use,
 * closed when the state closes), the protected callback every part calls
 * Lua through (sbx__pcall), and the loop as Lua sees it: core.run(),
 * core.now(), core.timer(ms, fn) and core.on_signal(signum, fn).
 *
 * Timers and signal watchers are userdata owning a uv handle; the handle's
 * close callback is the only place the memory of the handle is released
 * (libuv's rule). The Lua userdata keeps a pointer to a heap block so that a
 * collected userdata never frees memory libuv still references.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop.h"
#include "parts.h"

#define SBX_LOOP_KEY "sbx.loop"        /* registry slot of the loop userdata */
#define SBX_LOOP_MT  "sbx.loop_mt"     /* its metatable (a different name!) */
#define TIMER_MT "sbx.timer"
#define SIGNAL_MT "sbx.signal"

/* ---- the loop of a state ------------------------------------------------- */

static void count_open(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) (*(int *)arg)++;
}

/* The loop is created first (core.c), so at lua_close it is finalized last:
 * every other object has already asked libuv to close its handles. When only
 * closing handles remain, run their close callbacks (where their memory is
 * freed) and close the loop. A handle nobody closed (a timer still pending at
 * exit) could call into the Lua state being closed, so then the loop is not
 * run at all and is left to the process exit. */
static int loop_gc(lua_State *L) {
  sbx__loop_t *lp = luaL_checkudata(L, 1, SBX_LOOP_MT);
  int open = 0;
  if (!lp->owned) return 0;
  uv_walk(&lp->uv, count_open, &open);
  if (open > 0) return 0;
  uv_run(&lp->uv, UV_RUN_NOWAIT);
  if (uv_loop_close(&lp->uv) == 0) lp->owned = 0;
  return 0;
}

sbx__loop_t *sbx__loop(lua_State *L) {
  sbx__loop_t *lp;
  if (lua_getfield(L, LUA_REGISTRYINDEX, SBX_LOOP_KEY) == LUA_TUSERDATA) {
    lp = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return lp;
  }
  lua_pop(L, 1);
  lp = lua_newuserdatauv(L, sizeof *lp, 0);
  memset(lp, 0, sizeof *lp);
  if (uv_loop_init(&lp->uv) != 0) luaL_error(L, "cannot initialise the event loop");
  lp->owned = 1;
  lp->uv.data = lp;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lp->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  if (luaL_newmetatable(L, SBX_LOOP_MT)) {
    lua_pushcfunction(L, loop_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, SBX_LOOP_KEY);
  return lp;
}

int sbx__pcall(lua_State *L, int nargs) {
  if (lua_pcall(L, nargs, 0, 0) != LUA_OK) {
    if (getenv("SBX_DEBUG") != NULL)
      sbx__log("error", "callback raised: %s", luaL_tolstring(L, -1, NULL));
    else
      sbx__log("error", "a host callback raised an error (details suppressed; set SBX_DEBUG=1 to see them)");
    lua_settop(L, 0);
    return -1;
  }
  return 0;
}

/* ---- timers and signal watchers ------------------------------------------- */

/* The Lua object is a box (aux.h): it and the watcher point at each other,
 * and whichever goes first unlinks the other, so neither ever reaches freed
 * memory (a one-shot timer frees its watcher when it fires, while the Lua
 * object may still be stopped later). */
typedef struct {
  union { uv_timer_t timer; uv_signal_t sig; } h;
  lua_State *L;          /* main state, for unref in close */
  int fn_ref;
  int closing;
  sbx__box_t *box;       /* the Lua object, until it is collected */
} watch_t;

static void watch_closed(uv_handle_t *h) {
  watch_t *w = h->data;
  sbx__box_unbind(w->box);
  free(w);
}

static void watch_close(watch_t *w) {
  if (w == NULL || w->closing) return;
  w->closing = 1;
  sbx__unref(w->L, &w->fn_ref);
  uv_close((uv_handle_t *)&w->h, watch_closed);
}

static void timer_fired(uv_timer_t *t) {
  watch_t *w = t->data;
  sbx__loop_t *lp = t->loop->data;
  lua_State *L = lp->L;
  int ref = w->fn_ref;
  w->fn_ref = LUA_NOREF;
  watch_close(w);                       /* one-shot: gone before the call */
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  sbx__pcall(L, 0);
}

static void signal_fired(uv_signal_t *s, int signum) {
  watch_t *w = s->data;
  sbx__loop_t *lp = s->loop->data;
  lua_State *L = lp->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->fn_ref);
  lua_pushinteger(L, signum);
  sbx__pcall(L, 1);
}

static int watch_stop(lua_State *L) {
  sbx__box_t *b = luaL_testudata(L, 1, TIMER_MT);
  if (b == NULL) b = luaL_checkudata(L, 1, SIGNAL_MT);
  if (b->obj != NULL) watch_close(b->obj);   /* linked until the close callback */
  return 0;
}

/* A watcher holding a reference to the function at fn_idx; the caller
 * initialises and starts its handle. */
static watch_t *new_watch(lua_State *L, int fn_idx) {
  int ref = sbx__ref(L, fn_idx);          /* may raise: before the calloc */
  lua_State *main_L;
  watch_t *w;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  main_L = lua_tothread(L, -1);
  lua_pop(L, 1);
  w = calloc(1, sizeof *w);
  if (w == NULL) {
    sbx__unref(L, &ref);
    luaL_error(L, "out of memory");
  }
  w->L = main_L;
  w->fn_ref = ref;
  return w;
}

/* core.timer(ms, fn) -> timer; fn runs once after ms unless timer:stop(). */
static int l_timer(lua_State *L) {
  lua_Integer ms = luaL_checkinteger(L, 1);
  sbx__loop_t *lp = sbx__loop(L);
  watch_t *w;
  sbx__box_t *box;
  luaL_argcheck(L, ms >= 0 && ms <= 86400000, 1, "timeout out of range");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  box = sbx__box_new(L, TIMER_MT);
  w = new_watch(L, 2);
  uv_timer_init(&lp->uv, &w->h.timer);
  w->h.timer.data = w;
  uv_timer_start(&w->h.timer, timer_fired, (uint64_t)ms, 0);
  sbx__box_bind(box, w, &w->box);
  return 1;
}

/* core.on_signal(signum, fn) -> watcher; fn(signum) on each delivery. */
static int l_on_signal(lua_State *L) {
  lua_Integer signum = luaL_checkinteger(L, 1);
  sbx__loop_t *lp = sbx__loop(L);
  watch_t *w;
  sbx__box_t *box;
  luaL_argcheck(L, signum > 0 && signum < 65, 1, "signal number out of range");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  box = sbx__box_new(L, SIGNAL_MT);
  w = new_watch(L, 2);
  uv_signal_init(&lp->uv, &w->h.sig);
  w->h.sig.data = w;
  uv_signal_start(&w->h.sig, signal_fired, (int)signum);
  sbx__box_bind(box, w, &w->box);
  return 1;
}

/* A collected watcher is stopped (a collected timer keeps running: it is
 * fire-and-forget, and its __gc is sbx__box_gc). */
static int signal_gc(lua_State *L) {
  watch_t *w = sbx__box_detach(lua_touserdata(L, 1));
  if (w != NULL) watch_close(w);
  return 0;
}

/* core.run([mode]) runs the loop until nothing is active ("default") or
 * once ("once", blocks for one event) or without blocking ("nowait").
 * Callbacks run on the calling thread. Returns true when handles remain.
 *
 * Raises when called while the loop is already running, i.e. from a callback
 * or from a task (tasks are resumed from callbacks). uv_run is not reentrant:
 * a nested run runs close callbacks, which free handles (unix_stream.c's
 * stream_t, conn.c's sbx__conn_t) that the outer libuv frame still reads once
 * the callback returns (uv__stream_io after a read callback). That freed a
 * raw client's block under the broker bench whenever its handle had been
 * collected before the nested run: a crash, or a lost wake-up (timeout). */
static int l_run(lua_State *L) {
  static const char *const modes[] = {"default", "once", "nowait", NULL};
  static const uv_run_mode uvm[] = {UV_RUN_DEFAULT, UV_RUN_ONCE, UV_RUN_NOWAIT};
  int m = luaL_checkoption(L, 1, "default", modes);
  sbx__loop_t *lp = sbx__loop(L);
  lua_State *saved = lp->L;
  int alive;
  if (lp->running)
    return luaL_error(L, "core.run: the loop is already running (called from a callback "
                         "or a task); inside a task use async.sleep(0) to let it turn");
  lp->uv.data = lp;
  lp->L = L;
  lp->running = 1;
  alive = uv_run(&lp->uv, uvm[m]);
  lp->running = 0;
  lp->L = saved;
  lua_pushboolean(L, alive != 0);
  return 1;
}

/* core.stop() makes the running core.run() return after this iteration. */
static int l_stop(lua_State *L) {
  uv_stop(&sbx__loop(L)->uv);
  return 0;
}

/* core.now() -> milliseconds on the loop's monotonic clock (fresh reading). */
static int l_now(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  uv_update_time(&lp->uv);
  lua_pushinteger(L, (lua_Integer)uv_now(&lp->uv));
  return 1;
}

/* core.hrtime() -> nanoseconds, for benchmarks. */
static int l_hrtime(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)uv_hrtime());
  return 1;
}

/* core.log(level, msg): one operator line on stderr. Never pass payloads. */
static int l_log(lua_State *L) {
  const char *level = luaL_checkstring(L, 1);
  const char *msg = luaL_checkstring(L, 2);
  sbx__log(level, "%s", msg);
  return 0;
}

/* core.log_time() -> the current UTC time as 2026-12-01T19:43:22.104Z. */
static int l_log_time(lua_State *L) {
  char buf[40];
  size_t n = sbx__log_time(buf, sizeof buf);
  lua_pushlstring(L, buf, n);
  return 1;
}

/* core.log_journal() -> true when stderr is the journal (JOURNAL_STREAM). */
static int l_log_journal(lua_State *L) {
  lua_pushboolean(L, sbx__log_journal());
  return 1;
}

/* core.log_set_format("text"|"json"): the format of core.log's lines. */
static int l_log_set_format(lua_State *L) {
  static const char *const formats[] = {"text", "json", NULL};
  sbx__log_set_json(luaL_checkoption(L, 1, NULL, formats) == 1);
  return 0;
}

/* core.log_write(line): one whole line (a newline is added) on stderr. */
static int l_log_write(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  char *buf = malloc(n + 1);
  if (buf == NULL) return luaL_error(L, "out of memory");
  memcpy(buf, s, n);
  buf[n] = '\n';
  fwrite(buf, 1, n + 1, stderr);    /* one write: lines of engines do not interleave */
  fflush(stderr);
  free(buf);
  return 0;
}

static int l_getuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getuid());
  lua_pushinteger(L, (lua_Integer)getgid());
  return 2;
}

static int l_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

void sbx__open_loop(lua_State *L) {
  static const luaL_Reg watch_methods[] = {{"stop", watch_stop}, {NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"run", l_run}, {"stop", l_stop}, {"now", l_now}, {"hrtime", l_hrtime},
    {"timer", l_timer}, {"on_signal", l_on_signal}, {"log", l_log},
    {"log_time", l_log_time}, {"log_journal", l_log_journal},
    {"log_set_format", l_log_set_format}, {"log_write", l_log_write},
    {"getuid", l_getuid}, {"getpid", l_getpid}, {NULL, NULL}};
  sbx__loop(L)->uv.data = sbx__loop(L);
  sbx__class(L, TIMER_MT, watch_methods, sbx__box_gc);
  sbx__class(L, SIGNAL_MT, watch_methods, signal_gc);
  luaL_setfuncs(L, fns, 0);
  lua_pushinteger(L, SIGINT);
  lua_setfield(L, -2, "SIGINT");
  lua_pushinteger(L, SIGTERM);
  lua_setfield(L, -2, "SIGTERM");
}
