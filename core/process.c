/*
 * process.c: child processes, what the container driver and the docker CLI
 * helpers need (spec/runtime.md 4.5-4.7):
 *
 *   core.spawn(opts) -> process     one child, three pipes, capped reads
 *   process:kill(signum) -> bool    signal it (false once it has exited)
 *
 * Design
 * - One child = one heap block (proc_t) owning a uv_process_t, three
 *   uv_pipe_t (stdin, stdout, stderr) and a uv_timer_t (used once, to report
 *   a failed spawn on a later loop turn). The block is freed in the close
 *   callback of the last of those handles, never elsewhere (libuv's rule).
 *   The Lua userdata only points at it; both sides clear the pointer when
 *   they go away, so a collected userdata does not stop the child and never
 *   frees memory libuv still uses.
 * - The child gets exactly the environment given (nothing inherited), the
 *   three pipes as fds 0-2 and no other descriptor: before each spawn every
 *   descriptor of the host above 2 is marked close-on-exec (close_range with
 *   CLOSE_RANGE_CLOEXEC, or a walk of /proc/self/fd), because descriptors
 *   opened by Lua's io library or by other libraries are not.
 * - stdin: the bytes given are written, then the pipe is closed (EOF).
 *   stdout and stderr are read at the same time, each up to its cap; the
 *   first byte beyond a cap stops that read (the pipe is closed, so a
 *   chatty child gets EPIPE) and marks it truncated; with kill_on_overflow
 *   the child is also sent SIGKILL at once.
 * - on_exit(res) runs exactly once, after the child has been reaped and
 *   both output pipes have ended, from the loop (sbx__pcall on the thread
 *   running core.run()). res = {exit_status=, term_signal=, stdout=,
 *   stderr=, stdout_truncated=, stderr_truncated=} or, when the child
 *   could not be started, {error="cannot start <file>: <reason>", code=
 *   "ENOENT"...}. A failed spawn is reported on a later loop turn, never
 *   from inside core.spawn.
 * - A grandchild that keeps the output pipes open delays on_exit until it
 *   closes them; the docker CLI does not fork.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loop.h"
#include "parts.h"

#define PROC_MT "sbx.process"

/* Bounds on what a caller (host Lua) may hand us. */
#define PROC_MAX_ARGS        256
#define PROC_MAX_ENV         64
#define PROC_MAX_ARG_BYTES   65536
#define PROC_MAX_STDIN       (16 * 1024 * 1024)
#define PROC_MAX_CAP         (64 * 1024 * 1024)
#define PROC_DEFAULT_CAP     (1024 * 1024)
#define PROC_READ_CHUNK      65536

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

typedef struct {
  char *buf;
  size_t len, cap, max;
  int truncated;
  int done;              /* EOF, error or cap reached: pipe closed */
} capture_t;

typedef struct proc proc_t;

struct proc {
  uv_process_t proc;
  uv_pipe_t in, out, err;
  uv_timer_t defer;
  uv_write_t wreq;
  sbx__box_t *box;       /* Lua side, or NULL once collected */
  int handles;           /* handles not yet closed (freed at 0) */
  int exit_ref;          /* on_exit in the registry */
  int spawned;           /* uv_spawn succeeded */
  int spawn_err;         /* libuv error of a failed spawn */
  int exited;
  int reported;
  int kill_on_overflow;
  int64_t exit_status;
  int term_signal;
  char *stdin_buf;
  size_t stdin_len;
  int stdin_open;        /* opts.stdin_open: the pipe waits for write_stdin */
  int stdin_done;        /* the stdin pipe was written or closed */
  char *file;            /* for the spawn error text */
  capture_t cap[2];      /* stdout, stderr */
};

/* ---- helpers ----------------------------------------------------------- */

/* Every host descriptor above 2 becomes close-on-exec (spec 4.5). */
static void mark_all_cloexec(void) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
#endif
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  if (d == NULL) return;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end != '\0' || end == e->d_name || fd <= 2 || fd == dirfd(d)) continue;
    int fl = fcntl((int)fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC)) fcntl((int)fd, F_SETFD, fl | FD_CLOEXEC);
  }
  closedir(d);
}

static void proc_free(proc_t *p) {
  sbx__box_unbind(p->box);
  free(p->cap[0].buf);
  free(p->cap[1].buf);
  free(p->stdin_buf);
  free(p->file);
  free(p);
}

static void handle_closed(uv_handle_t *h) {
  proc_t *p = h->data;
  if (--p->handles == 0) proc_free(p);
}

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, handle_closed);
}

/* Called once everything is reported: release every handle. */
static void proc_close_all(proc_t *p) {
  close_handle((uv_handle_t *)&p->in);
  close_handle((uv_handle_t *)&p->out);
  close_handle((uv_handle_t *)&p->err);
  close_handle((uv_handle_t *)&p->defer);
  close_handle((uv_handle_t *)&p->proc);
}

static void push_capture(lua_State *L, const capture_t *c, const char *field, const char *tfield) {
  lua_pushlstring(L, c->buf != NULL ? c->buf : "", c->len);
  lua_setfield(L, -2, field);
  lua_pushboolean(L, c->truncated);
  lua_setfield(L, -2, tfield);
}

/* Runs on_exit(res) once, then closes the handles. */
static void proc_report(proc_t *p) {
  sbx__loop_t *lp = p->defer.loop->data;
  lua_State *L = lp->L;
  int ref = p->exit_ref;
  if (p->reported) return;
  p->reported = 1;
  p->exit_ref = LUA_NOREF;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_createtable(L, 0, 6);
  if (!p->spawned) {
    lua_pushfstring(L, "cannot start %s: %s", p->file, uv_strerror(p->spawn_err));
    lua_setfield(L, -2, "error");
    lua_pushstring(L, uv_err_name(p->spawn_err));
    lua_setfield(L, -2, "code");
  } else {
    lua_pushinteger(L, (lua_Integer)p->exit_status);
    lua_setfield(L, -2, "exit_status");
    lua_pushinteger(L, p->term_signal);
    lua_setfield(L, -2, "term_signal");
    push_capture(L, &p->cap[0], "stdout", "stdout_truncated");
    push_capture(L, &p->cap[1], "stderr", "stderr_truncated");
  }
  proc_close_all(p);           /* before the call: p stays valid until the
                                  close callbacks, which run later */
  if (lua_type(L, -2) == LUA_TFUNCTION) sbx__pcall(L, 1);
  else lua_pop(L, 2);
}

static void maybe_report(proc_t *p) {
  if (p->exited && p->cap[0].done && p->cap[1].done) proc_report(p);
}

/* ---- stdin ------------------------------------------------------------- */

static void stdin_written(uv_write_t *w, int status) {
  proc_t *p = w->data;
  (void)status;                /* EPIPE: the child did not read; fine */
  free(p->stdin_buf);
  p->stdin_buf = NULL;
  close_handle((uv_handle_t *)&p->in);
}

/* ---- stdout / stderr --------------------------------------------------- */

static capture_t *capture_of(proc_t *p, uv_stream_t *s) {
  return s == (uv_stream_t *)&p->out ? &p->cap[0] : &p->cap[1];
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  buf->base = malloc(PROC_READ_CHUNK);
  buf->len = buf->base != NULL ? PROC_READ_CHUNK : 0;
}

static void capture_end(proc_t *p, uv_stream_t *s, capture_t *c) {
  c->done = 1;
  uv_read_stop(s);
  close_handle((uv_handle_t *)s);
  maybe_report(p);
}

/* Appends n bytes; 0, or -1 when the cap is passed (nothing beyond it kept). */
static int capture_add(capture_t *c, const char *data, size_t n) {
  size_t room = c->max - c->len;
  size_t take = n < room ? n : room;
  if (take > 0) {
    if (c->len + take > c->cap) {
      size_t ncap = c->cap ? c->cap : 4096;
      char *nb;
      while (ncap < c->len + take) ncap *= 2;
      if (ncap > c->max) ncap = c->max;
      nb = realloc(c->buf, ncap);
      if (nb == NULL) return -1;
      c->buf = nb;
      c->cap = ncap;
    }
    memcpy(c->buf + c->len, data, take);
    c->len += take;
  }
  return take < n ? -1 : 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  proc_t *p = s->data;
  capture_t *c = capture_of(p, s);
  if (nread > 0 && !c->done) {
    if (capture_add(c, buf->base, (size_t)nread) < 0) {
      c->truncated = 1;
      if (p->kill_on_overflow && p->spawned && !p->exited) uv_process_kill(&p->proc, SIGKILL);
      free(buf->base);
      capture_end(p, s, c);
      return;
    }
  }
  free(buf->base);
  if (nread < 0 && !c->done) capture_end(p, s, c);   /* EOF or error */
}

/* ---- process ----------------------------------------------------------- */

static void on_exit_cb(uv_process_t *h, int64_t status, int sig) {
  proc_t *p = h->data;
  p->exited = 1;
  p->exit_status = status;
  p->term_signal = sig;
  maybe_report(p);
}

static void on_defer(uv_timer_t *t) {
  proc_report(t->data);
}

static proc_t *check_proc(lua_State *L, int idx) {
  return sbx__box_check(L, idx, PROC_MT);
}

/* Copies a Lua array of strings into a NULL-terminated argv-style list
   placed after `first` (which may be NULL). Raises on bad input. */
static char **string_list(lua_State *L, int idx, const char *field, const char *first, int max) {
  lua_Integer n, i;
  char **out;
  int off = first != NULL ? 1 : 0;
  if (lua_getfield(L, idx, field) == LUA_TNIL) {
    n = 0;
  } else {
    luaL_argcheck(L, lua_istable(L, -1), 1, field);
    n = luaL_len(L, -1);
  }
  if (n < 0 || n > max) luaL_error(L, "core.spawn: too many %s", field);
  out = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + off + 1), 0);  /* GC-owned */
  if (off) out[0] = (char *)first;
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    lua_rawgeti(L, -2, i);
    s = lua_tolstring(L, -1, &len);
    if (lua_type(L, -1) != LUA_TSTRING || strlen(s) != len || len > PROC_MAX_ARG_BYTES)
      luaL_error(L, "core.spawn: %s[%d] must be a string without NUL", field, (int)i);
    out[i - 1 + off] = (char *)s;   /* anchored: the table stays on the stack */
    lua_pop(L, 1);
  }
  out[n + off] = NULL;
  return out;             /* table and userdata stay on the stack */
}

/* core.spawn{file=, args=, env=, stdin=, max_stdout=, max_stderr=,
 *            kill_on_overflow=, on_exit=} -> process */
static int l_spawn(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  const char *file, *in;
  size_t in_len = 0, file_len;
  char **args, **env;
  size_t max_out, max_err;
  int kill_over, fn_idx, exit_ref;
  proc_t *p;
  sbx__box_t *box;
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  int rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "file");
  file = luaL_checklstring(L, -1, &file_len);
  luaL_argcheck(L, file_len > 0 && strlen(file) == file_len && file_len <= PATH_MAX, 1, "file");
  args = string_list(L, 1, "args", file, PROC_MAX_ARGS);
  env = string_list(L, 1, "env", NULL, PROC_MAX_ENV);
  lua_getfield(L, 1, "stdin");
  in = lua_isnil(L, -1) ? NULL : luaL_checklstring(L, -1, &in_len);
  luaL_argcheck(L, in_len <= PROC_MAX_STDIN, 1, "stdin too large");
  max_out = (size_t)sbx__opt_integer_field(L, 1, "spawn", "max_stdout", PROC_DEFAULT_CAP, 0, PROC_MAX_CAP);
  max_err = (size_t)sbx__opt_integer_field(L, 1, "spawn", "max_stderr", PROC_DEFAULT_CAP, 0, PROC_MAX_CAP);
  kill_over = sbx__opt_boolean_field(L, 1, "spawn", "kill_on_overflow", 0);
  int keep_open = sbx__opt_boolean_field(L, 1, "spawn", "stdin_open", 0);
  luaL_argcheck(L, !(keep_open && in != NULL), 1, "stdin and stdin_open are exclusive");
  lua_getfield(L, 1, "on_exit");
  luaL_checktype(L, -1, LUA_TFUNCTION);
  fn_idx = lua_gettop(L);

  /* Lua allocations that may raise come before any C memory is owned. */
  box = sbx__box_new(L, PROC_MT);
  exit_ref = sbx__ref(L, fn_idx);

  p = calloc(1, sizeof *p);
  if (p == NULL) {
    sbx__unref(L, &exit_ref);
    return luaL_error(L, "out of memory");
  }
  p->file = strdup(file);
  if (in_len > 0) p->stdin_buf = malloc(in_len);
  if (p->file == NULL || (in_len > 0 && p->stdin_buf == NULL)) {
    free(p->file);
    free(p->stdin_buf);
    free(p);
    sbx__unref(L, &exit_ref);
    return luaL_error(L, "out of memory");
  }
  if (in_len > 0) memcpy(p->stdin_buf, in, in_len);
  p->stdin_len = in_len;
  p->cap[0].max = max_out;
  p->cap[1].max = max_err;
  p->kill_on_overflow = kill_over;
  p->stdin_open = keep_open;
  p->exit_ref = exit_ref;
  sbx__box_bind(box, p, &p->box);

  mark_all_cloexec();
  uv_pipe_init(&lp->uv, &p->in, 0);
  uv_pipe_init(&lp->uv, &p->out, 0);
  uv_pipe_init(&lp->uv, &p->err, 0);
  uv_timer_init(&lp->uv, &p->defer);
  p->in.data = p->out.data = p->err.data = p->defer.data = p->proc.data = p;
  p->wreq.data = p;
  p->handles = 5;

  memset(&o, 0, sizeof o);
  stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
  stdio[0].data.stream = (uv_stream_t *)&p->in;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&p->out;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&p->err;
  o.file = p->file;
  o.args = args;
  o.env = env;
  o.stdio = stdio;
  o.stdio_count = 3;
  o.exit_cb = on_exit_cb;
  rc = uv_spawn(&lp->uv, &p->proc, &o);
  p->proc.data = p;
  if (rc != 0) {
    /* The process handle is initialised even on failure and must be closed;
       the result goes out on a later loop turn. */
    p->spawn_err = rc;
    p->exited = 1;
    p->cap[0].done = p->cap[1].done = 1;
    uv_timer_start(&p->defer, on_defer, 0, 0);
    return 1;
  }
  p->spawned = 1;
  if (p->stdin_open) {
    /* write_stdin() writes and closes it later (a warm container's turn) */
  } else if (p->stdin_len > 0) {
    p->stdin_done = 1;
    uv_buf_t b = uv_buf_init(p->stdin_buf, (unsigned)p->stdin_len);
    if (uv_write(&p->wreq, (uv_stream_t *)&p->in, &b, 1, stdin_written) != 0)
      close_handle((uv_handle_t *)&p->in);
  } else {
    p->stdin_done = 1;
    close_handle((uv_handle_t *)&p->in);
  }
  if (uv_read_start((uv_stream_t *)&p->out, on_alloc, on_read) != 0) {
    p->cap[0].done = 1;
    close_handle((uv_handle_t *)&p->out);
  }
  if (uv_read_start((uv_stream_t *)&p->err, on_alloc, on_read) != 0) {
    p->cap[1].done = 1;
    close_handle((uv_handle_t *)&p->err);
  }
  return 1;
}

/* process:kill(signum) -> true if sent, false if the child is gone. */
static int proc_kill(lua_State *L) {
  proc_t *p = check_proc(L, 1);
  lua_Integer sig = luaL_checkinteger(L, 2);
  luaL_argcheck(L, sig > 0 && sig < 65, 2, "signal number out of range");
  if (p == NULL || !p->spawned || p->exited) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, uv_process_kill(&p->proc, (int)sig) == 0);
  return 1;
}

/* process:write_stdin(bytes) -> boolean: a process spawned with stdin_open
 * gets these bytes on stdin, then end of file; once. False when it was not
 * spawned that way, never started, or stdin was already written. */
static int proc_write_stdin(lua_State *L) {
  proc_t *p = check_proc(L, 1);
  size_t len;
  const char *in = luaL_checklstring(L, 2, &len);
  luaL_argcheck(L, len <= PROC_MAX_STDIN, 2, "stdin too large");
  if (p == NULL || !p->spawned || p->exited || !p->stdin_open || p->stdin_done) {
    lua_pushboolean(L, 0);
    return 1;
  }
  p->stdin_done = 1;
  if (len == 0) {
    close_handle((uv_handle_t *)&p->in);
    lua_pushboolean(L, 1);
    return 1;
  }
  p->stdin_buf = malloc(len);
  if (p->stdin_buf == NULL) {
    close_handle((uv_handle_t *)&p->in);
    return luaL_error(L, "out of memory");
  }
  memcpy(p->stdin_buf, in, len);
  p->stdin_len = len;
  uv_buf_t b = uv_buf_init(p->stdin_buf, (unsigned)len);
  if (uv_write(&p->wreq, (uv_stream_t *)&p->in, &b, 1, stdin_written) != 0) {
    close_handle((uv_handle_t *)&p->in);
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* process:pid() -> pid (0 if it never started). */
static int proc_pid(lua_State *L) {
  proc_t *p = check_proc(L, 1);
  lua_pushinteger(L, p != NULL && p->spawned ? p->proc.pid : 0);
  return 1;
}

void sbx__open_process(lua_State *L) {
  static const luaL_Reg proc_methods[] = {
    {"kill", proc_kill}, {"pid", proc_pid}, {"write_stdin", proc_write_stdin}, {NULL, NULL}};
  static const luaL_Reg fns[] = {{"spawn", l_spawn}, {NULL, NULL}};
  /* A collected userdata leaves the child running; on_exit still fires. */
  sbx__class(L, PROC_MT, proc_methods, sbx__box_gc);
  luaL_setfuncs(L, fns, 0);
  lua_pushinteger(L, SIGKILL);
  lua_setfield(L, -2, "SIGKILL");
}
