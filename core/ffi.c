/*
 * ffi.c: the flat embedding ABI of sbx_ffi.h.
 *
 * One engine = one thread that owns one Lua state and its libuv loop. The
 * thread makes the state like `sbx` does (state.c: standard libraries,
 * sandbox.core preloaded, package.path at the Lua tree, the generational
 * collector), hands the config path and the
 * options to lua/sandbox/embed/init.lua and runs the loop until embed says it is
 * done. All Lua runs on that thread.
 *
 * Crossing threads:
 *   caller -> engine: sbx_engine_submit copies the request into the `in`
 *     list under the mutex and uv_async_send()s; the async callback takes the
 *     whole list and hands each request to embed's dispatch.
 *   engine -> caller: embed calls the C closure `emit(id, json, final)`.
 *     A final result some sbx_engine_call waits for is stored in its waiter
 *     and the condition variable is broadcast; anything else goes to the
 *     result callback (engine thread, no lock held) or, without one, to the
 *     bounded `out` list, whose non-emptiness the eventfd signals.
 *   construction and shutdown: `state` under the mutex plus the condition
 *     variable; sbx_engine_new waits until embed reports ready or failed.
 *
 * Ownership: every string handed to the caller is malloc'ed here and freed
 * by the caller through sbx_free (= free). Request copies are freed by the
 * engine thread after dispatch; queued outputs by sbx_engine_poll's caller or
 * by sbx_engine_free.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "json.h"
#include "loop.h"
#include "sbx_ffi.h"
#include "state.h"

enum { ST_STARTING, ST_READY, ST_FAILED, ST_DONE };

typedef struct ffi_req {
  struct ffi_req *next;
  int64_t id;
  size_t len;
  char json[];           /* len bytes + NUL */
} ffi_req;

typedef struct ffi_out {
  struct ffi_out *next;
  char *json;            /* malloc'ed, NUL-terminated; handed out by poll */
  size_t len;
} ffi_out;

typedef struct ffi_waiter {
  struct ffi_waiter *next;
  int64_t id;
  char *result;          /* set by the engine thread */
  int done;
  int abandoned;         /* the caller timed out: drop the result */
  int want_text;         /* result = the string value itself (sbx_engine_metrics) */
  int no_text;           /* want_text, but the result was no string (a failure) */
} ffi_waiter;

struct sbx_engine {
  uv_mutex_t mu;
  uv_cond_t cond;
  uv_thread_t thread;
  uv_thread_t engine_tid;  /* valid once the thread runs */
  int state;
  int stop_requested;      /* submits refused from now on */
  int stop_delivered;      /* embed's stop() was called (engine thread only) */
  int joined;
  int joining;
  char *error;             /* construction failure, handed to the caller */

  char *config_path;
  char *options_json;
  sbx_result_fn cb;
  void *user;

  ffi_req *in_head, *in_tail;
  size_t in_count;
  int64_t next_id;
  uv_async_t async;
  int async_live;

  ffi_out *out_head, *out_tail;
  size_t out_count, out_bytes;
  uint64_t dropped;
  int efd;

  ffi_waiter *waiters;

  lua_State *L;            /* engine thread only */
  int embed_ref;           /* the engine object embed.new returned */
  int done;                /* embed called done(): leave the loop */
};

int32_t sbx_ffi_abi_version(void) { return SBX_FFI_ABI_VERSION; }

void sbx_free(void *p) { free(p); }

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p == NULL) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

static char *dup_s(const char *s) { return dup_n(s, strlen(s)); }

/* engine_tid is written by sbx_engine_new before it returns the engine, so
 * every caller of the public functions sees it; the state is not read here
 * (the engine thread changes it under the mutex). */
static int on_engine_thread(sbx_engine *e) {
  uv_thread_t self = uv_thread_self();
  return uv_thread_equal(&self, &e->engine_tid);
}

/* ------------------------------------------------------------------ */
/* Lua directory: options "luaDir" (resolved in Lua), $SBX_LUA_DIR, or from
 * the directory of the shared object that holds this code: ../lua (a
 * checkout's build/, a Bun package's native/), ../share/lua/5.4 (`make
 * install`: PREFIX/lib/libsbx.so.0), ./lua. */

static int dir_has_tree(const char *dir) {
  char probe[PATH_MAX];
  if ((size_t)snprintf(probe, sizeof probe, "%s/sandbox/init.lua", dir) >= sizeof probe) return 0;
  return access(probe, R_OK) == 0;
}

/* 0 with out set; -1 with out holding the one-line reason (none found). */
static int default_lua_dir(char *out, size_t cap) {
  static const char *const rel[] = {"../lua", "../share/lua/5.4", "lua"};
  const char *env = getenv("SBX_LUA_DIR");
  Dl_info info;
  char so[PATH_MAX];
  char *slash;
  size_t i;
  if (env != NULL && env[0] != '\0') {
    if (strlen(env) >= cap) return -1;
    memcpy(out, env, strlen(env) + 1);
    return 0;
  }
  if (dladdr((void *)sbx_engine_new, &info) == 0 || info.dli_fname == NULL) {
    snprintf(out, cap, "cannot locate libsbx.so to find the engine's Lua tree; set SBX_LUA_DIR or options luaDir");
    return -1;
  }
  if (realpath(info.dli_fname, so) == NULL) {
    if (strlen(info.dli_fname) >= sizeof so) return -1;
    memcpy(so, info.dli_fname, strlen(info.dli_fname) + 1);
  }
  slash = strrchr(so, '/');
  if (slash == NULL) return -1;
  *slash = '\0';
  for (i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    if ((size_t)snprintf(out, cap, "%s/%s", so, rel[i]) < cap && dir_has_tree(out)) return 0;
  }
  snprintf(out, cap, "no Lua tree next to %.3900s (looked in ../lua, ../share/lua/5.4 and lua/ there); "
           "set SBX_LUA_DIR or options luaDir", so);
  return -1;
}

/* ------------------------------------------------------------------ */
/* Outputs */

static void queue_output(sbx_engine *e, char *json, size_t len) {
  ffi_out *o;
  uint64_t one = 1;
  uv_mutex_lock(&e->mu);
  if (e->out_count >= SBX_FFI_MAX_QUEUED || len > SBX_FFI_MAX_QUEUED_BYTES - e->out_bytes ||
      (o = malloc(sizeof *o)) == NULL) {
    e->dropped++;
    uv_mutex_unlock(&e->mu);
    free(json);
    sbx__log("warn", "embedding: an output was dropped (poll queue full)");
    return;
  }
  o->next = NULL;
  o->json = json;
  o->len = len;
  if (e->out_tail != NULL) e->out_tail->next = o; else e->out_head = o;
  e->out_tail = o;
  e->out_count++;
  e->out_bytes += len;
  if (e->out_count == 1 && e->efd >= 0) {
    ssize_t w = write(e->efd, &one, sizeof one);
    (void)w;
  }
  uv_mutex_unlock(&e->mu);
}

/* emit(request_id, json [, final [, text]]): engine thread. text: a string
   result as it is, taken instead of the JSON by a waiter that wants it. */
static int l_emit(lua_State *L) {
  sbx_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  int64_t id = (int64_t)luaL_checkinteger(L, 1);
  size_t len, tlen = 0;
  const char *json = luaL_checklstring(L, 2, &len);
  int final = lua_toboolean(L, 3);
  const char *text = lua_type(L, 4) == LUA_TSTRING ? lua_tolstring(L, 4, &tlen) : NULL;
  char *copy;
  if (final && id > 0) {
    ffi_waiter *w;
    uv_mutex_lock(&e->mu);
    for (w = e->waiters; w != NULL && w->id != id; w = w->next) {}
    if (w != NULL) {
      if (w->abandoned) {           /* its caller timed out: drop both */
        ffi_waiter **pp;
        for (pp = &e->waiters; *pp != w; pp = &(*pp)->next) {}
        *pp = w->next;
        free(w);
      } else if (w->want_text) {
        w->result = text != NULL ? dup_n(text, tlen) : NULL;
        w->no_text = text == NULL;
        w->done = 1;
        uv_cond_broadcast(&e->cond);
      } else {
        w->result = dup_n(json, len);
        w->done = 1;
        uv_cond_broadcast(&e->cond);
      }
      uv_mutex_unlock(&e->mu);
      return 0;
    }
    uv_mutex_unlock(&e->mu);
  }
  if (e->cb != NULL) {
    e->cb(e->user, id, json, len);
    return 0;
  }
  copy = dup_n(json, len);
  if (copy == NULL) {
    uv_mutex_lock(&e->mu);
    e->dropped++;
    uv_mutex_unlock(&e->mu);
    return 0;
  }
  queue_output(e, copy, len);
  return 0;
}

/* ready(err|nil): construction finished (engine thread). */
static int l_ready(lua_State *L) {
  sbx_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  const char *err = lua_isnil(L, 1) ? NULL : luaL_tolstring(L, 1, NULL);
  uv_mutex_lock(&e->mu);
  if (e->state == ST_STARTING) {
    if (err == NULL) {
      e->state = ST_READY;
    } else {
      e->state = ST_FAILED;
      e->error = dup_s(err);
    }
    uv_cond_broadcast(&e->cond);
  }
  uv_mutex_unlock(&e->mu);
  return 0;
}

/* done(): embed has finished (stopped or failed); leave the loop. */
static int l_done(lua_State *L) {
  sbx_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  e->done = 1;
  uv_stop(&sbx__loop(L)->uv);
  return 0;
}

/* pending(): requests submitted and not yet taken, plus outputs dropped. */
static int l_counters(lua_State *L) {
  sbx_engine *e = lua_touserdata(L, lua_upvalueindex(1));
  uv_mutex_lock(&e->mu);
  lua_pushinteger(L, (lua_Integer)e->in_count);
  lua_pushinteger(L, (lua_Integer)e->dropped);
  lua_pushinteger(L, (lua_Integer)e->out_count);
  uv_mutex_unlock(&e->mu);
  return 3;
}

/* ------------------------------------------------------------------ */
/* Engine thread */

static void call_embed(sbx_engine *e, const char *method, int64_t id, const char *json, size_t len) {
  lua_State *L = e->L;
  int base = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, e->embed_ref);
  lua_getfield(L, -1, method);
  lua_insert(L, -2);                         /* fn, self */
  if (json != NULL) {
    lua_pushinteger(L, (lua_Integer)id);
    lua_pushlstring(L, json, len);
    sbx__pcall(L, 3);
  } else {
    sbx__pcall(L, 1);
  }
  lua_settop(L, base);
}

static void async_cb(uv_async_t *a) {
  sbx_engine *e = a->data;
  ffi_req *list, *r;
  int stop;
  uv_mutex_lock(&e->mu);
  list = e->in_head;
  e->in_head = e->in_tail = NULL;
  e->in_count = 0;
  stop = e->stop_requested;
  uv_mutex_unlock(&e->mu);
  while (list != NULL) {
    r = list;
    list = r->next;
    if (!e->done) call_embed(e, "dispatch", r->id, r->json, r->len);
    free(r);
  }
  if (stop && !e->stop_delivered && !e->done) {
    e->stop_delivered = 1;
    call_embed(e, "stop", 0, NULL, 0);
  }
}

static void push_closure(lua_State *L, sbx_engine *e, lua_CFunction fn) {
  lua_pushlightuserdata(L, e);
  lua_pushcclosure(L, fn, 1);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) msg = luaL_tolstring(L, 1, NULL);
  lua_pushstring(L, msg);   /* errors from embed are already operator messages */
  return 1;
}

/*
 * Protected: (options_json | nil, default_dir | nil) -> the Lua tree to use:
 * options.luaDir when given (a non-empty string), else the default. The
 * options are strict JSON (json.c); anything but an object is refused.
 */
static int resolve_dir(lua_State *L) {
  size_t len;
  const char *opts = lua_tolstring(L, 1, &len);
  if (opts == NULL || len == 0) { lua_settop(L, 2); return 1; }
  if (sbx__json_decode(L, opts, len, NULL) != 0 || !sbx__json_is_object(L, -1))
    return luaL_error(L, "invalid options_json: not a JSON object");
  if (lua_getfield(L, -1, "luaDir") == LUA_TNIL) { lua_settop(L, 2); return 1; }
  if (lua_type(L, -1) != LUA_TSTRING || lua_rawlen(L, -1) == 0)
    return luaL_error(L, "invalid options_json: luaDir must be a string");
  return 1;
}

/* Makes the state and calls embed.new; on failure leaves a message. */
static int engine_setup(sbx_engine *e) {
  lua_State *L = e->L;
  char dir[PATH_MAX];
  sbx__loop_t *lp;
  const char *d;
  int found;

  lua_pushcfunction(L, traceback);                       /* 1 */
  dir[0] = '\0';
  found = default_lua_dir(dir, sizeof dir) == 0;
  lua_pushcfunction(L, resolve_dir);
  if (e->options_json != NULL) lua_pushstring(L, e->options_json); else lua_pushnil(L);
  if (found) lua_pushstring(L, dir); else lua_pushnil(L);
  if (lua_pcall(L, 2, 1, 1) != LUA_OK) return -1;
  d = lua_tostring(L, -1);
  if (d == NULL) {
    lua_pushstring(L, dir[0] != '\0' ? dir : "cannot locate the Lua tree; set SBX_LUA_DIR or options luaDir");
    return -1;
  }
  sbx__state_open(L, d);                                 /* d stays on the stack */
  lua_pop(L, 1);

  lp = sbx__loop(L);
  if (uv_async_init(&lp->uv, &e->async, async_cb) != 0) {
    lua_pushstring(L, "cannot create the engine wake-up handle");
    return -1;
  }
  e->async.data = e;
  e->async_live = 1;

  lua_getglobal(L, "require");
  lua_pushstring(L, "sandbox.embed");
  if (lua_pcall(L, 1, 1, 1) != LUA_OK) return -1;
  lua_getfield(L, -1, "new");
  lua_remove(L, -2);
  lua_pushstring(L, e->config_path);
  if (e->options_json != NULL) lua_pushstring(L, e->options_json); else lua_pushnil(L);
  lua_createtable(L, 0, 4);
  push_closure(L, e, l_emit);
  lua_setfield(L, -2, "emit");
  push_closure(L, e, l_ready);
  lua_setfield(L, -2, "ready");
  push_closure(L, e, l_done);
  lua_setfield(L, -2, "done");
  push_closure(L, e, l_counters);
  lua_setfield(L, -2, "counters");
  if (lua_pcall(L, 3, 1, 1) != LUA_OK) return -1;
  e->embed_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, 0);
  return 0;
}

static void fail_construction(sbx_engine *e, const char *msg) {
  uv_mutex_lock(&e->mu);
  if (e->state == ST_STARTING) {
    e->state = ST_FAILED;
    e->error = dup_s(msg != NULL ? msg : "engine construction failed");
    uv_cond_broadcast(&e->cond);
  }
  uv_mutex_unlock(&e->mu);
}

static void close_noop(uv_handle_t *h) { (void)h; }

static void engine_main(void *arg) {
  sbx_engine *e = arg;
  sbx__loop_t *lp;
  ffi_req *r;
  int i;

  e->L = luaL_newstate();
  if (e->L == NULL) {
    fail_construction(e, "out of memory");
    goto finished;
  }
  if (engine_setup(e) != 0) {
    fail_construction(e, lua_tostring(e->L, -1));
  } else {
    lp = sbx__loop(e->L);
    while (!e->done) {
      lp->uv.data = lp;
      lp->L = e->L;
      lp->running = 1;       /* core.run from engine Lua would re-enter uv_run */
      uv_run(&lp->uv, UV_RUN_DEFAULT);
      lp->running = 0;
      if (!e->done && e->state != ST_READY && e->state != ST_STARTING) break;
    }
    /* embed ended without reporting: treat as a failed construction. */
    fail_construction(e, "the engine ended during construction");
  }
  lp = sbx__loop(e->L);
  uv_mutex_lock(&e->mu);
  e->stop_requested = 1;     /* no submit from now on */
  uv_mutex_unlock(&e->mu);
  if (e->async_live) {
    e->async_live = 0;
    uv_close((uv_handle_t *)&e->async, close_noop);
  }
  for (i = 0; i < 8; i++) uv_run(&lp->uv, UV_RUN_NOWAIT);
  if (e->embed_ref != LUA_NOREF && e->embed_ref != 0) luaL_unref(e->L, LUA_REGISTRYINDEX, e->embed_ref);
  e->embed_ref = LUA_NOREF;
  lua_close(e->L);
  e->L = NULL;

finished:
  uv_mutex_lock(&e->mu);
  /* Requests that slipped in after embed's stop: nothing will answer them. */
  while ((r = e->in_head) != NULL) {
    char msg[128];
    int n;
    int64_t id = r->id;
    e->in_head = r->next;
    n = snprintf(msg, sizeof msg,
                 "{\"type\":\"result\",\"request\":%lld,\"ok\":false,\"error\":\"engine stopped\"}",
                 (long long)id);
    free(r);
    if (e->cb == NULL && n > 0) {
      char *copy = dup_n(msg, (size_t)n);
      if (copy != NULL) {
        uv_mutex_unlock(&e->mu);
        queue_output(e, copy, (size_t)n);
        uv_mutex_lock(&e->mu);
      }
    } else if (n > 0) {
      uv_mutex_unlock(&e->mu);
      e->cb(e->user, id, msg, (size_t)n);
      uv_mutex_lock(&e->mu);
    }
  }
  e->in_tail = NULL;
  e->in_count = 0;
  e->state = e->state == ST_FAILED ? ST_FAILED : ST_DONE;
  uv_cond_broadcast(&e->cond);
  uv_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ */
/* Public API */

static void engine_release(sbx_engine *e) {
  ffi_out *o;
  ffi_waiter *w;
  while ((o = e->out_head) != NULL) {
    e->out_head = o->next;
    free(o->json);
    free(o);
  }
  while ((w = e->waiters) != NULL) {
    e->waiters = w->next;
    free(w->result);
    free(w);
  }
  if (e->efd >= 0) close(e->efd);
  uv_cond_destroy(&e->cond);
  uv_mutex_destroy(&e->mu);
  free(e->error);
  free(e->config_path);
  free(e->options_json);
  free(e);
}

sbx_engine *sbx_engine_new(const char *config_path, const char *options_json,
                           sbx_result_fn cb, void *user, char **error_out) {
  sbx_engine *e;
  const char *why = NULL;
  if (error_out != NULL) *error_out = NULL;
  if (config_path != NULL && config_path[0] == '\0') config_path = NULL;  /* a utility engine */
  if ((config_path != NULL && strlen(config_path) >= PATH_MAX) ||
      (options_json != NULL && strlen(options_json) > SBX_FFI_MAX_REQUEST_BYTES)) {
    why = "config path or options too long";
    goto fail_early;
  }
  e = calloc(1, sizeof *e);
  if (e == NULL) {
    why = "out of memory";
    goto fail_early;
  }
  e->efd = -1;
  e->embed_ref = LUA_NOREF;
  if (uv_mutex_init(&e->mu) != 0) {
    free(e);
    why = "cannot create a mutex";
    goto fail_early;
  }
  if (uv_cond_init(&e->cond) != 0) {
    uv_mutex_destroy(&e->mu);
    free(e);
    why = "cannot create a condition variable";
    goto fail_early;
  }
  e->config_path = config_path != NULL ? dup_s(config_path) : NULL;
  e->options_json = options_json != NULL ? dup_s(options_json) : NULL;
  e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  e->cb = cb;
  e->user = user;
  if ((config_path != NULL && e->config_path == NULL) ||
      (options_json != NULL && e->options_json == NULL) || e->efd < 0) {
    why = e->efd < 0 ? "cannot create the result eventfd" : "out of memory";
    engine_release(e);
    goto fail_early;
  }
  uv_mutex_lock(&e->mu);   /* engine_tid is written before the thread can read it */
  if (uv_thread_create(&e->thread, engine_main, e) != 0) {
    uv_mutex_unlock(&e->mu);
    engine_release(e);
    why = "cannot start the engine thread";
    goto fail_early;
  }
  e->engine_tid = e->thread;
  while (e->state == ST_STARTING) uv_cond_wait(&e->cond, &e->mu);
  if (e->state == ST_READY) {
    uv_mutex_unlock(&e->mu);
    return e;
  }
  /* Failed: the thread tears itself down; wait for it. */
  uv_mutex_unlock(&e->mu);
  uv_thread_join(&e->thread);
  if (error_out != NULL) {
    *error_out = e->error;
    e->error = NULL;
  }
  engine_release(e);
  return NULL;

fail_early:
  if (error_out != NULL) *error_out = dup_s(why);
  return NULL;
}

static int64_t enqueue(sbx_engine *e, const char *json, size_t len, ffi_waiter *w) {
  ffi_req *r;
  int64_t id;
  if (e == NULL || json == NULL || len == 0) return SBX_EINVAL;
  if (len > SBX_FFI_MAX_REQUEST_BYTES) return SBX_ETOOBIG;
  r = malloc(sizeof *r + len + 1);
  if (r == NULL) return -ENOMEM;
  memcpy(r->json, json, len);
  r->json[len] = '\0';
  r->len = len;
  r->next = NULL;
  uv_mutex_lock(&e->mu);
  if (e->stop_requested || e->state != ST_READY) {
    uv_mutex_unlock(&e->mu);
    free(r);
    return SBX_ESTOPPED;
  }
  if (e->in_count >= SBX_FFI_MAX_PENDING) {
    uv_mutex_unlock(&e->mu);
    free(r);
    return SBX_EBUSY;
  }
  id = ++e->next_id;
  r->id = id;
  if (e->in_tail != NULL) e->in_tail->next = r; else e->in_head = r;
  e->in_tail = r;
  e->in_count++;
  if (w != NULL) {
    w->id = id;
    w->next = e->waiters;
    e->waiters = w;
  }
  uv_async_send(&e->async);   /* async-signal/thread safe; handle lives while READY */
  uv_mutex_unlock(&e->mu);
  return id;
}

int64_t sbx_engine_submit(sbx_engine *e, const char *json, size_t len) {
  return enqueue(e, json, len, NULL);
}

char *sbx_engine_poll(sbx_engine *e) {
  ffi_out *o;
  char *json;
  uint64_t v;
  if (e == NULL) return NULL;
  uv_mutex_lock(&e->mu);
  o = e->out_head;
  if (o == NULL) {
    uv_mutex_unlock(&e->mu);
    return NULL;
  }
  e->out_head = o->next;
  if (e->out_head == NULL) e->out_tail = NULL;
  e->out_count--;
  e->out_bytes -= o->len;
  if (e->out_count == 0 && e->efd >= 0) {
    ssize_t n = read(e->efd, &v, sizeof v);
    (void)n;
  }
  uv_mutex_unlock(&e->mu);
  json = o->json;
  free(o);
  return json;
}

int32_t sbx_engine_fd(sbx_engine *e) {
  return e == NULL ? -1 : e->efd;
}

static void unlink_waiter(sbx_engine *e, ffi_waiter *w) {
  ffi_waiter **p;
  for (p = &e->waiters; *p != NULL; p = &(*p)->next) {
    if (*p == w) {
      *p = w->next;
      return;
    }
  }
}

/* sbx_engine_call, and with want_text the string result itself
   (sbx_engine_metrics): NULL with SBX_EINVAL when the result was a failure. */
static char *call_wait(sbx_engine *e, const char *json, size_t len, int32_t timeout_ms,
                       int want_text, int32_t *code_out) {
  ffi_waiter *w;
  int64_t id;
  uint64_t deadline, now;
  char *res = NULL;
  int32_t code = 0;
  if (e == NULL) {
    code = SBX_EINVAL;
    goto out;
  }
  if (on_engine_thread(e)) {
    code = SBX_ETHREAD;
    goto out;
  }
  if (timeout_ms <= 0) timeout_ms = 1;
  w = calloc(1, sizeof *w);
  if (w == NULL) {
    code = -ENOMEM;
    goto out;
  }
  w->want_text = want_text;
  id = enqueue(e, json, len, w);
  if (id < 0) {
    free(w);
    code = (int32_t)id;
    goto out;
  }
  deadline = uv_hrtime() + (uint64_t)timeout_ms * 1000000u;
  uv_mutex_lock(&e->mu);
  while (!w->done && e->state == ST_READY) {
    now = uv_hrtime();
    if (now >= deadline) break;
    uv_cond_timedwait(&e->cond, &e->mu, deadline - now);
  }
  if (w->done) {
    unlink_waiter(e, w);
    res = w->result;
    if (res == NULL) code = w->no_text ? SBX_EINVAL : -ENOMEM;
    free(w);
  } else if (e->state != ST_READY) {
    unlink_waiter(e, w);
    free(w->result);
    free(w);
    code = SBX_ESTOPPED;
  } else {
    w->abandoned = 1;       /* stays listed: the late result is dropped */
    code = SBX_ETIMEOUT;
  }
  uv_mutex_unlock(&e->mu);
out:
  if (code_out != NULL) *code_out = code;
  return res;
}

char *sbx_engine_call(sbx_engine *e, const char *json, size_t len,
                      int32_t timeout_ms, int32_t *code_out) {
  return call_wait(e, json, len, timeout_ms, 0, code_out);
}

char *sbx_engine_status(sbx_engine *e) {
  static const char req[] = "{\"type\":\"status\"}";
  return sbx_engine_call(e, req, sizeof req - 1, SBX_FFI_STATUS_TIMEOUT_MS, NULL);
}

char *sbx_engine_metrics(sbx_engine *e) {
  static const char req[] = "{\"type\":\"metrics\"}";
  return call_wait(e, req, sizeof req - 1, SBX_FFI_STATUS_TIMEOUT_MS, 1, NULL);
}

void sbx_engine_stop(sbx_engine *e) {
  int join;
  if (e == NULL || on_engine_thread(e)) return;
  uv_mutex_lock(&e->mu);
  if (!e->stop_requested && e->state == ST_READY) {
    e->stop_requested = 1;
    uv_async_send(&e->async);
  }
  join = !e->joined && !e->joining;
  if (join) e->joining = 1;
  uv_mutex_unlock(&e->mu);
  if (join) {
    uv_thread_join(&e->thread);
    uv_mutex_lock(&e->mu);
    e->joined = 1;
    e->joining = 0;
    /* Abandoned waiters never get their result now. */
    uv_cond_broadcast(&e->cond);
    uv_mutex_unlock(&e->mu);
  } else {
    uv_mutex_lock(&e->mu);
    while (!e->joined) uv_cond_wait(&e->cond, &e->mu);
    uv_mutex_unlock(&e->mu);
  }
}

void sbx_engine_free(sbx_engine *e) {
  if (e == NULL) return;
  sbx_engine_stop(e);
  engine_release(e);
}
