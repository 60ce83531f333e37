/*
 * conn.c: the connection engine under both Unix-socket HTTP listeners
 * (conn.h says what it owns and how a request policy plugs in; listener.c
 * is the buffered policy of the sealed and precheck brokers,
 * listener_stream.c the streaming policy of rich mode).
 *
 * Connections are budgeted (shared/spec/hardening.md 2, fdbudget.c): the
 * first SBX_FD_GUARANTEED_CONNS open connections of a listener are its
 * turn's own; each one beyond them (up to the listener's cap) is taken from
 * the process's shared pool, and one the pool cannot carry is accepted and
 * closed at once, like one over the cap (reported as "connections"). An
 * accept that fails with EMFILE or ENFILE never stops the listener: the
 * reserved descriptor is given up to accept and close what is pending, then
 * taken again. Every listener is on one list, so core.broker_reclaim can
 * close idle pooled connections (still waiting for their head) when a new
 * turn needs the room.
 *
 * A connection: accepted, its head read into a buffer of
 * SBX_MAX_HEAD_BYTES + 1 under the head deadline (expired: closed silently,
 * reported "header_deadline"), then the policy's (SBX_CONN_REQUEST) until
 * it ends its response (sbx__conn_end): the queue drains, our side is shut
 * down, and bytes the client still sends are drained for at most
 * SBX_LINGER_MS (so a client still writing reads the reply, not a reset).
 *
 * Memory: a connection is freed when its four handles' close callbacks have
 * run and no pin is left; sbx__conn_close pins it while the policy's
 * closing() runs Lua, so Lua that runs the loop can never free a connection
 * under it. A listener is reference counted (server handle, userdata, every
 * connection, a report in progress). Nothing here logs a byte of a request.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aux.h"
#include "conn.h"
#include "fdbudget.h"
#include "http_head.h"
#include "pipe_server.h"

typedef struct {
  uv_write_t w;
  sbx__conn_t *c;
  int ref;                 /* a Lua string written in place, or LUA_NOREF */
  char frame[24];          /* bytes before it (a chunk's size line) */
  char data[];
} conn_write_t;

_Static_assert(SBX_STREAM_MAX_CONNECTIONS <= SBX_MAX_CONNECTIONS,
               "sbx__srv_stop gathers at most SBX_MAX_CONNECTIONS connections");

static char scratch[65536];            /* linger and policy reads: consumed at once */
static sbx__srv_t *all_listeners;      /* what core.broker_reclaim walks */

/* ---- listeners ------------------------------------------------------------ */

void sbx__srv_release(sbx__srv_t *srv) {
  if (--srv->refs > 0) return;
  srv->ops->srv_free(srv);
}

static void all_add(sbx__srv_t *srv) {
  srv->all_prev = NULL;
  srv->all_next = all_listeners;
  if (all_listeners) all_listeners->all_prev = srv;
  all_listeners = srv;
}

static void all_remove(sbx__srv_t *srv) {
  if (srv->all_prev) srv->all_prev->all_next = srv->all_next;
  else if (all_listeners == srv) all_listeners = srv->all_next;
  if (srv->all_next) srv->all_next->all_prev = srv->all_prev;
  srv->all_prev = srv->all_next = NULL;
}

void sbx__srv_report(sbx__srv_t *srv, const sbx__refusal_t *r) {
  lua_State *L;
  if (srv->on_refused_ref == LUA_NOREF || srv->lua_gone || r->reason == NULL) return;
  L = srv->lp->L;
  srv->refs++;
  lua_pushcfunction(L, srv->ops->push_refusal);
  lua_rawgeti(L, LUA_REGISTRYINDEX, srv->on_refused_ref);
  lua_pushlightuserdata(L, (void *)r);
  sbx__pcall(L, 2);
  sbx__srv_release(srv);
}

static void report_plain(sbx__srv_t *srv, const char *reason) {
  sbx__refusal_t r = {reason, 0, -1, 0, NULL, 0};
  sbx__srv_report(srv, &r);
}

/* ---- connection teardown ----------------------------------------------- */

static void conn_unpin(sbx__conn_t *c) {
  sbx__srv_t *srv;
  if (--c->handles > 0) return;
  srv = c->srv;
  if (c->prev) c->prev->next = c->next; else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->nconns--;
  if (c->pooled) sbx__fd_pool_give();
  srv->ops->free(c);
  free(c->buf);
  free(c);
  sbx__srv_release(srv);
}

static void on_handle_closed(uv_handle_t *h) {
  conn_unpin(h->data);
}

/* Starts closing the handles and pins c; 0 when it was already closing. */
static int conn_shut(sbx__conn_t *c) {
  if (c->state == SBX_CONN_CLOSING) return 0;
  c->state = SBX_CONN_CLOSING;
  c->reading = 0;
  c->handles++;                                   /* the pin */
  uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->probe, on_handle_closed);
  uv_close((uv_handle_t *)&c->tick, on_handle_closed);
  return 1;
}

lua_State *sbx__conn_L(sbx__conn_t *c) {
  return c->srv->lua_gone ? NULL : c->srv->lp->L;
}

void sbx__conn_close(sbx__conn_t *c, const char *why) {
  if (!conn_shut(c)) return;
  c->srv->ops->closing(c, sbx__conn_L(c), why);
  conn_unpin(c);
}

static void server_closed(uv_handle_t *h) {
  sbx__srv_release(h->data);
}

void sbx__srv_stop(sbx__srv_t *srv, lua_State *L, int force) {
  sbx__conn_t *list[SBX_MAX_CONNECTIONS], *c;
  int n = 0, i;
  if (!srv->stopped) {
    srv->stopped = 1;
    all_remove(srv);
    uv_close((uv_handle_t *)&srv->server, server_closed);
  }
  if (srv->lua_gone) L = NULL;
  /* Close every chosen connection first, then run the policy's handlers:
   * each is pinned, so a handler that runs the loop frees none of them. */
  for (c = srv->conns; c != NULL && n < SBX_MAX_CONNECTIONS; c = c->next)
    if (c->state != SBX_CONN_CLOSING && (force || c->state == SBX_CONN_HEAD) && conn_shut(c))
      list[n++] = c;
  srv->refs++;
  for (i = 0; i < n; i++) srv->ops->closing(list[i], L, SBX_CONN_STOPPED);
  for (i = 0; i < n; i++) conn_unpin(list[i]);
  if (L != NULL) {
    sbx__unref(L, &srv->handler_ref);
    sbx__unref(L, &srv->on_refused_ref);
    sbx__unref(L, &srv->self_ref);
  }
  sbx__srv_release(srv);
}

int sbx__srv_gc_box(lua_State *L, const char *mt) {
  sbx__srv_t *srv = sbx__box_detach(luaL_checkudata(L, 1, mt));
  if (srv == NULL) return 0;
  /* Only reached after stop() or at state close: never call Lua from here. */
  srv->lua_gone = 1;
  sbx__srv_stop(srv, NULL, 1);
  sbx__srv_release(srv);
  return 0;
}

void sbx__conn_call_uservalue(lua_State *L, int ref, int uv, const char *arg) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  if (lua_getiuservalue(L, -1, uv) == LUA_TFUNCTION) {
    lua_remove(L, -2);             /* the registry ref keeps the userdata alive */
    if (arg != NULL) lua_pushstring(L, arg);
    sbx__pcall(L, arg != NULL);
  } else {
    lua_pop(L, 2);
  }
}

int sbx__srv_reclaim(int want) {
  int closed = 0;
  while (closed < want) {
    sbx__srv_t *most = NULL, *s;
    sbx__conn_t *c, *victim = NULL;
    for (s = all_listeners; s != NULL; s = s->all_next) {
      int idle = 0;
      for (c = s->conns; c != NULL && !idle; c = c->next)
        if (c->pooled && c->state == SBX_CONN_HEAD) idle = 1;
      if (idle && (most == NULL || s->nconns > most->nconns)) most = s;
    }
    if (most == NULL) break;
    for (c = most->conns; c != NULL; c = c->next)
      if (c->pooled && c->state == SBX_CONN_HEAD) victim = c;
    if (conn_shut(victim)) {
      victim->srv->ops->closing(victim, NULL, SBX_CONN_STOPPED);
      conn_unpin(victim);
    }
    closed++;
  }
  return closed;
}

/* ---- timers ---------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  sbx__conn_t *c = t->data;
  sbx__srv_t *srv = c->srv;
  switch (c->state) {
  case SBX_CONN_HEAD:                /* no request yet: closed silently, reported */
    srv->refs++;
    sbx__conn_close(c, SBX_CONN_GONE);
    report_plain(srv, "header_deadline");
    sbx__srv_release(srv);
    return;
  case SBX_CONN_LINGER:
    sbx__conn_close(c, SBX_CONN_FINISHED);
    return;
  case SBX_CONN_REQUEST:
  case SBX_CONN_FLUSH:
    srv->ops->deadline(c);
    return;
  default:
    return;
  }
}

void sbx__conn_arm(sbx__conn_t *c, uint64_t ms) {
  if (c->state == SBX_CONN_CLOSING) return;
  uv_timer_stop(&c->timer);
  c->deadline = uv_now(c->timer.loop) + ms;
  uv_timer_start(&c->timer, on_timer, ms, 0);
}

void sbx__conn_timer_stop(sbx__conn_t *c) {
  if (c->state != SBX_CONN_CLOSING) uv_timer_stop(&c->timer);
}

int sbx__conn_hung_up(sbx__conn_t *c) {
  return c->state == SBX_CONN_CLOSING || sbx__pipe_hung_up(&c->pipe);
}

static void on_probe(uv_timer_t *t) {
  sbx__conn_t *c = t->data;
  if (c->state == SBX_CONN_CLOSING) return;
  if (sbx__pipe_hung_up(&c->pipe)) sbx__conn_close(c, SBX_CONN_GONE);
}

void sbx__conn_probe(sbx__conn_t *c, int on) {
  if (c->state == SBX_CONN_CLOSING) return;
  if (on && !uv_is_active((uv_handle_t *)&c->probe))
    uv_timer_start(&c->probe, on_probe, SBX_HUP_POLL_MS, SBX_HUP_POLL_MS);
  else if (!on)
    uv_timer_stop(&c->probe);
}

static void on_tick(uv_timer_t *t) {
  sbx__conn_t *c = t->data;
  if (c->state != SBX_CONN_CLOSING) c->srv->ops->deferred(c);
}

void sbx__conn_defer(sbx__conn_t *c) {
  if (c->state != SBX_CONN_CLOSING) uv_timer_start(&c->tick, on_tick, 0, 0);
}

/* ---- writing ------------------------------------------------------------------ */

static void on_written(uv_write_t *w, int status) {
  conn_write_t *wr = w->data;
  sbx__conn_t *c = wr->c;
  lua_State *L = sbx__conn_L(c);
  if (wr->ref != LUA_NOREF && L != NULL) luaL_unref(L, LUA_REGISTRYINDEX, wr->ref);
  free(wr);
  if (c->state == SBX_CONN_CLOSING) return;
  if (status < 0) { sbx__conn_close(c, SBX_CONN_GONE); return; }
  if (c->pressured && c->state == SBX_CONN_REQUEST && sbx__conn_queued(c) < SBX_STREAM_HIGH_WATER) {
    c->pressured = 0;
    c->srv->ops->drain(c);
  }
}

static int queue(sbx__conn_t *c, conn_write_t *wr, const uv_buf_t *b, unsigned n) {
  wr->c = c;
  wr->w.data = wr;
  if (uv_write(&wr->w, (uv_stream_t *)&c->pipe, b, n, on_written) != 0) {
    free(wr);
    sbx__conn_close(c, SBX_CONN_GONE);
    return -1;
  }
  return 0;
}

int sbx__conn_write(sbx__conn_t *c, const uv_buf_t *parts, unsigned n) {
  conn_write_t *wr;
  size_t total = 0, off = 0;
  unsigned i;
  uv_buf_t b;
  if (c->state == SBX_CONN_CLOSING) return -1;
  for (i = 0; i < n; i++) total += parts[i].len;
  if (total > UINT32_MAX || (wr = malloc(sizeof *wr + total)) == NULL) {
    sbx__conn_close(c, SBX_CONN_GONE);
    return -1;
  }
  wr->ref = LUA_NOREF;
  for (i = 0; i < n; i++) {
    if (parts[i].len) memcpy(wr->data + off, parts[i].base, parts[i].len);
    off += parts[i].len;
  }
  b = uv_buf_init(wr->data, (unsigned)total);
  return queue(c, wr, &b, 1);
}

int sbx__conn_write_lua(sbx__conn_t *c, lua_State *L, int idx, const char *pre, size_t pn,
                        const char *post, size_t qn) {
  conn_write_t *wr;
  uv_buf_t b[3];
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  unsigned nb = 0;
  if (c->state == SBX_CONN_CLOSING) return -1;
  if (len > UINT32_MAX || pn > sizeof wr->frame || (wr = malloc(sizeof *wr)) == NULL) {
    sbx__conn_close(c, SBX_CONN_GONE);
    return -1;
  }
  lua_pushvalue(L, idx);
  wr->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (pn) { memcpy(wr->frame, pre, pn); b[nb++] = uv_buf_init(wr->frame, (unsigned)pn); }
  b[nb++] = uv_buf_init((char *)s, (unsigned)len);
  if (qn) b[nb++] = uv_buf_init((char *)post, (unsigned)qn);
  wr->c = c;
  wr->w.data = wr;
  if (uv_write(&wr->w, (uv_stream_t *)&c->pipe, b, nb, on_written) != 0) {
    luaL_unref(L, LUA_REGISTRYINDEX, wr->ref);
    free(wr);
    sbx__conn_close(c, SBX_CONN_GONE);
    return -1;
  }
  return 0;
}

size_t sbx__conn_queued(sbx__conn_t *c) {
  if (c->state == SBX_CONN_CLOSING) return 0;
  return uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe);
}

int sbx__conn_pressured(sbx__conn_t *c) {
  int p = sbx__conn_queued(c) >= SBX_STREAM_HIGH_WATER;
  if (p) c->pressured = 1;
  return p;
}

static void linger_start(sbx__conn_t *c) {
  if (c->peer_eof) { sbx__conn_close(c, SBX_CONN_FINISHED); return; }
  c->state = SBX_CONN_LINGER;
  c->drained = 0;
  uv_timer_stop(&c->probe);
  sbx__conn_arm(c, SBX_LINGER_MS);
  sbx__conn_read_start(c);
  if (!c->reading) sbx__conn_close(c, SBX_CONN_FINISHED);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  sbx__conn_t *c = req->data;
  if (c->state == SBX_CONN_CLOSING) return;
  if (status < 0) { sbx__conn_close(c, SBX_CONN_GONE); return; }
  c->srv->ops->finished(c);
  if (c->state != SBX_CONN_CLOSING) linger_start(c);
}

void sbx__conn_end(sbx__conn_t *c) {
  if (c->state != SBX_CONN_REQUEST) return;
  sbx__conn_read_stop(c);
  uv_timer_stop(&c->probe);
  c->state = SBX_CONN_FLUSH;
  c->sreq.data = c;
  if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->pipe, on_shutdown) != 0)
    sbx__conn_close(c, SBX_CONN_GONE);
}

/* ---- reading ------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  sbx__conn_t *c = h->data;
  (void)suggested;
  if (c->state == SBX_CONN_HEAD)
    *b = uv_buf_init(c->buf + c->len, (unsigned)(SBX_MAX_HEAD_BYTES + 1 - c->len));
  else if (c->state != SBX_CONN_REQUEST || !c->srv->ops->alloc(c, b))
    *b = uv_buf_init(scratch, sizeof scratch);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  sbx__conn_t *c = s->data;
  if (nread == 0 || c->state == SBX_CONN_CLOSING) return;
  if (nread < 0) {
    c->reading = 0;
    c->peer_eof = 1;
    if (c->state == SBX_CONN_REQUEST) c->srv->ops->eof(c, nread);
    else if (c->state != SBX_CONN_FLUSH || nread != UV_EOF) sbx__conn_close(c, SBX_CONN_GONE);
    return;
  }
  switch (c->state) {
  case SBX_CONN_HEAD: {
    size_t from = c->len, end;
    c->len += (size_t)nread;
    end = sbx__head_end(c->buf, c->len, from);
    if (end == 0 && c->len <= SBX_MAX_HEAD_BYTES) return;
    c->srv->ops->head(c, end > SBX_MAX_HEAD_BYTES ? 0 : end);
    return;
  }
  case SBX_CONN_REQUEST:
    c->srv->ops->data(c, b->base, (size_t)nread);
    return;
  case SBX_CONN_LINGER:
    c->drained += (size_t)nread;
    if (c->drained > SBX_MAX_LINGER_BYTES) sbx__conn_close(c, SBX_CONN_FINISHED);
    return;
  default:
    return;
  }
}

void sbx__conn_read_start(sbx__conn_t *c) {
  if (c->reading || c->peer_eof || c->state == SBX_CONN_CLOSING) return;
  if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0) c->reading = 1;
}

void sbx__conn_read_stop(sbx__conn_t *c) {
  if (!c->reading) return;
  uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = 0;
}

/* ---- accepting ------------------------------------------------------------ */

static void on_connection(uv_stream_t *server, int status) {
  sbx__srv_t *srv = server->data;
  sbx__conn_t *c;
  int pooled = 0;
  if (status == UV_EMFILE || status == UV_ENFILE) {
    /* libuv's own reserve was not enough: ours, then keep listening. */
    uv_os_fd_t fd;
    int n = 0;
    if (!srv->stopped && uv_fileno((uv_handle_t *)server, &fd) == 0) n = sbx__fd_emfile_drain(fd);
    srv->refs++;
    while (n-- > 0) report_plain(srv, "connections");
    sbx__srv_release(srv);
    return;
  }
  if (status < 0 || srv->stopped) return;
  if (srv->nconns >= SBX_FD_GUARANTEED_CONNS && srv->nconns < srv->max_conns)
    pooled = sbx__fd_pool_take();
  if (srv->nconns >= srv->max_conns || (srv->nconns >= SBX_FD_GUARANTEED_CONNS && !pooled)) {
    /* Over the cap, or over the turn's share with the pool empty: closed at
       once, nothing written. */
    sbx__pipe_refuse(server);
    report_plain(srv, "connections");
    return;
  }
  c = calloc(1, srv->ops->conn_size);
  if (c == NULL || (c->buf = malloc(SBX_MAX_HEAD_BYTES + 1)) == NULL) {
    free(c);
    if (pooled) sbx__fd_pool_give();
    return;
  }
  c->srv = srv;
  c->pooled = pooled;
  c->state = SBX_CONN_HEAD;
  uv_pipe_init(server->loop, &c->pipe, 0);
  uv_timer_init(server->loop, &c->timer);
  uv_timer_init(server->loop, &c->probe);
  uv_timer_init(server->loop, &c->tick);
  c->pipe.data = c->timer.data = c->probe.data = c->tick.data = c;
  c->handles = 4;
  srv->refs++;
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  srv->ops->open(c);
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) { sbx__conn_close(c, SBX_CONN_GONE); return; }
  sbx__conn_arm(c, srv->head_ms);                  /* the head deadline, from accept */
  sbx__conn_read_start(c);
  if (!c->reading) sbx__conn_close(c, SBX_CONN_GONE);
}

/* ---- listening --------------------------------------------------------------- */

int sbx__srv_listen(sbx__srv_t *srv, sbx__loop_t *lp, const sbx__conn_ops_t *ops,
                    const char *path) {
  int rc;
  srv->lp = lp;
  srv->ops = ops;
  srv->on_refused_ref = LUA_NOREF;
  srv->handler_ref = LUA_NOREF;
  srv->self_ref = LUA_NOREF;
  uv_pipe_init(&lp->uv, &srv->server, 0);
  srv->server.data = srv;
  srv->refs = 1;                                 /* the server handle's */
  rc = sbx__pipe_listen_private(&srv->server, path, SBX_LISTEN_BACKLOG, on_connection,
                                server_closed);
  if (rc != 0) {
    srv->stopped = 1;
    return rc;
  }
  all_add(srv);
  return 0;
}

int sbx__srv_push_listen_failure(lua_State *L, int rc) {
  char msg[128];
  snprintf(msg, sizeof msg, "cannot listen on the broker socket: %s", uv_strerror(rc));
  return sbx__push_failure(L, -rc, msg);
}

void sbx__srv_adopt(lua_State *L, sbx__srv_t *srv, sbx__box_t *box, int refused_idx) {
  if (lua_type(L, refused_idx) == LUA_TFUNCTION) srv->on_refused_ref = sbx__ref(L, refused_idx);
  sbx__box_bind(box, srv, NULL);                /* the listener outlives its box */
  srv->refs++;                                  /* the userdata's */
  srv->self_ref = sbx__ref(L, -1);
}

void sbx__srv_push_stats(lua_State *L, const sbx__srv_t *srv, int extra) {
  lua_createtable(L, 0, 1 + extra);
  lua_pushinteger(L, srv ? srv->nconns : 0);
  lua_setfield(L, -2, "connections");
}
