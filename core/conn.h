/*
 * conn.h: the connection engine under both Unix-socket HTTP listeners
 * (conn.c): the sealed and precheck brokers' buffered request policy
 * (listener.c) and rich mode's streaming policy (listener_stream.c). It owns
 * everything about a connection that is not the request policy:
 *
 *   accept, the per-listener connection cap, the descriptor pool and the
 *   EMFILE drain (shared/spec/hardening.md 2, fdbudget.c), the head buffer
 *   and the head deadline, the request timer and the hang-up probe, the
 *   write queue with its backpressure mark, shutdown and linger, close
 *   accounting, forced stop, idle-connection reclaim across every
 *   listener, and the report of what it refuses (opts.on_refused).
 *
 * libuv's handle rule: a listener (sbx__srv_t) and a connection
 * (sbx__conn_t) are handles with init/start/close; the close callback is the
 * only place their memory is freed. A policy embeds sbx__srv_t as the first
 * member of its listener and sbx__conn_t as the first member of its
 * connection, and answers through sbx__conn_ops_t:
 *
 *   conn_size        sizeof the policy's connection (sbx__conn_t first)
 *   open(c)          a connection was accepted (no Lua)
 *   head(c, end)     the head is complete in c->buf[0..end), or end == 0
 *                    when it passed SBX_MAX_HEAD_BYTES; the policy takes
 *                    over (c->state = SBX_CONN_REQUEST, or a reply)
 *   alloc(c, b)      where to read in SBX_CONN_REQUEST: 1 when it set b, 0
 *                    for the engine's scratch buffer (bytes to look at once)
 *   data(c, p, n)    bytes read in SBX_CONN_REQUEST
 *   eof(c, nread)    the read side ended in SBX_CONN_REQUEST (UV_EOF: a
 *                    half-close; else a reset, the peer is gone)
 *   deadline(c)      c->timer fired in SBX_CONN_REQUEST or SBX_CONN_FLUSH
 *   drain(c)         the write queue fell below SBX_STREAM_HIGH_WATER
 *                    after sbx__conn_pressured said it was above
 *   deferred(c)      what sbx__conn_defer asked for, one loop turn later
 *   finished(c)      every byte was written and our side shut down
 *   closing(c, L, why)  the connection is closing (its handles are closing;
 *                    its memory stays valid until this returns); L is the
 *                    thread to run Lua on, NULL when Lua must not run
 *   free(c)          free the policy's buffers (from the close callback)
 *   srv_free(s)      free the policy's listener (last reference gone)
 *   push_refusal     lua_CFunction (fn, refusal light userdata): calls fn
 *                    with the refusal in the policy's Lua shape
 *
 * The `why` of closing(): SBX_CONN_GONE (the peer left, a write failed),
 * SBX_CONN_FINISHED (linger over), SBX_CONN_STOPPED (forced stop), or a
 * policy's own string passed to sbx__conn_close. Single-threaded: only the
 * loop thread.
 */
#ifndef SBX_CONN_H
#define SBX_CONN_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "aux.h"
#include "loop.h"

#define SBX_CONN_GONE     "gone"
#define SBX_CONN_FINISHED "finished"
#define SBX_CONN_STOPPED  "stopped"

/* Connection states the engine knows; a policy keeps its own sub-state. */
enum {
  SBX_CONN_HEAD,      /* reading the head into buf (the head deadline runs) */
  SBX_CONN_REQUEST,   /* the policy's: body, call, response */
  SBX_CONN_FLUSH,     /* the last write queued, shutdown pending */
  SBX_CONN_LINGER,    /* shut down: draining what the client still sends */
  SBX_CONN_CLOSING
};

typedef struct sbx__srv sbx__srv_t;
typedef struct sbx__conn sbx__conn_t;

/* A refusal as data (spec/operations.md 3): reason, status written (0:
 * nothing), route index (-1: none), accepted (budget spent), header name. */
typedef struct {
  const char *reason;
  int status;
  long route;
  int accepted;
  const char *header;
  size_t header_len;
} sbx__refusal_t;

typedef struct {
  size_t conn_size;
  void (*open)(sbx__conn_t *c);
  void (*head)(sbx__conn_t *c, size_t end);
  int (*alloc)(sbx__conn_t *c, uv_buf_t *b);
  void (*data)(sbx__conn_t *c, const char *p, size_t n);
  void (*eof)(sbx__conn_t *c, ssize_t nread);
  void (*deadline)(sbx__conn_t *c);
  void (*drain)(sbx__conn_t *c);
  void (*deferred)(sbx__conn_t *c);
  void (*finished)(sbx__conn_t *c);
  void (*closing)(sbx__conn_t *c, lua_State *L, const char *why);
  void (*free)(sbx__conn_t *c);
  void (*srv_free)(sbx__srv_t *s);
  lua_CFunction push_refusal;
} sbx__conn_ops_t;

struct sbx__srv {
  uv_pipe_t server;
  sbx__loop_t *lp;
  const sbx__conn_ops_t *ops;
  int refs;                /* server handle, Lua userdata, each connection, ... */
  int stopped;             /* stop() ran (or the bind failed): no new work */
  int lua_gone;            /* the userdata was collected: never call Lua */
  int max_conns;           /* <= SBX_MAX_CONNECTIONS */
  uint64_t head_ms;
  int on_refused_ref;      /* opts.on_refused, or LUA_NOREF */
  int handler_ref;         /* the policy's handler (on_call, on_request), or LUA_NOREF */
  int self_ref;            /* the userdata, anchored until stop() */
  sbx__conn_t *conns;
  int nconns;
  sbx__srv_t *all_prev, *all_next;   /* every listener not yet stopped */
};

struct sbx__conn {
  uv_pipe_t pipe;
  uv_timer_t timer;        /* head deadline, then the policy's, then linger */
  uv_timer_t probe;        /* hang-up probe (sbx__conn_probe) */
  uv_timer_t tick;         /* sbx__conn_defer */
  uv_shutdown_t sreq;
  sbx__srv_t *srv;
  sbx__conn_t *prev, *next;
  int state;               /* SBX_CONN_* */
  int handles;             /* open handles and pins; freed at 0 */
  int reading;
  int peer_eof;            /* the read side ended (half-close or gone) */
  int pooled;              /* counted in the shared descriptor pool */
  int pressured;           /* a write reported backpressure: drain() is due */
  uint64_t deadline;       /* loop time c->timer fires */
  char *buf;               /* the head (SBX_MAX_HEAD_BYTES + 1): the policy's after */
  size_t len;              /* bytes in buf */
  size_t drained;          /* bytes discarded in linger */
};

/* The listener. Initialises srv (calloc'ed by the caller, ops set) with
 * refs = 1 (the server handle's) and listens on path; 0, or a negative uv
 * error code (srv->stopped is then set, srv_free runs from the close
 * callback). */
int sbx__srv_listen(sbx__srv_t *srv, sbx__loop_t *lp, const sbx__conn_ops_t *ops,
                    const char *path);
/* The listener is up and its box (aux.h) at the top of L's stack is its
 * Lua face: the box holds one reference and is anchored until stop();
 * opts.on_refused is the value at refused_idx (a function, or none). */
void sbx__srv_adopt(lua_State *L, sbx__srv_t *srv, sbx__box_t *box, int refused_idx);
/* Pushes a stats table holding `connections` (0 for a NULL srv), with
 * room for `extra` more fields. */
void sbx__srv_push_stats(lua_State *L, const sbx__srv_t *srv, int extra);
/* Pushes nil, "cannot listen on the broker socket: ...", ENAME. */
int sbx__srv_push_listen_failure(lua_State *L, int rc);
void sbx__srv_release(sbx__srv_t *srv);
/* Closes the server (libuv unlinks its socket) and closes every connection
 * (force) or only the ones still reading their head, with why
 * SBX_CONN_STOPPED and Lua on L (NULL: none). Unrefs the handler,
 * on_refused and the self anchor. Idempotent. */
void sbx__srv_stop(sbx__srv_t *srv, lua_State *L, int force);
/* The __gc of a listener's box (metatable mt): stop without Lua, drop the
 * userdata's reference. */
int sbx__srv_gc_box(lua_State *L, const char *mt);
/* Calls the function in user value uv of the userdata anchored by ref with
 * arg (no argument when NULL), protected; nothing when it holds none. */
void sbx__conn_call_uservalue(lua_State *L, int ref, int uv, const char *arg);
/* Hands a refusal to opts.on_refused (last on a path: the handler may stop
 * the listener; srv stays valid meanwhile). */
void sbx__srv_report(sbx__srv_t *srv, const sbx__refusal_t *r);
/* Closes up to n pooled connections still waiting for their head, from the
 * listeners holding the most first; how many it closed (no Lua runs). */
int sbx__srv_reclaim(int n);

/* The loop's Lua thread, or NULL once the listener's userdata is gone. */
lua_State *sbx__conn_L(sbx__conn_t *c);
/* Closes the connection both ways, no reply; closing(c, L, why) runs with L
 * = sbx__conn_L(c). Safe to call more than once. */
void sbx__conn_close(sbx__conn_t *c, const char *why);
void sbx__conn_read_start(sbx__conn_t *c);
void sbx__conn_read_stop(sbx__conn_t *c);
/* (Re)arms c->timer to fire in ms; sbx__conn_timer_stop stops it. */
void sbx__conn_arm(sbx__conn_t *c, uint64_t ms);
void sbx__conn_timer_stop(sbx__conn_t *c);
/* Starts (on) or stops the hang-up probe: every SBX_HUP_POLL_MS, a peer that
 * closed both directions closes the connection (SBX_CONN_GONE). */
void sbx__conn_probe(sbx__conn_t *c, int on);
/* 1 when the peer closed both directions (not only its write side). */
int sbx__conn_hung_up(sbx__conn_t *c);
/* Runs ops->deferred(c) on the next loop turn. */
void sbx__conn_defer(sbx__conn_t *c);

/* Queues parts[0..n) copied into one write. 0, or -1 when the connection
 * was closed instead (SBX_CONN_GONE). */
int sbx__conn_write(sbx__conn_t *c, const uv_buf_t *parts, unsigned n);
/* Queues the Lua string at idx without copying it (anchored until its write
 * callback), between pre (at most 24 bytes) and post (static). 0 or -1. */
int sbx__conn_write_lua(sbx__conn_t *c, lua_State *L, int idx, const char *pre, size_t pn,
                        const char *post, size_t qn);
/* Bytes queued unsent. */
size_t sbx__conn_queued(sbx__conn_t *c);
/* 1 (and drain() becomes due) when SBX_STREAM_HIGH_WATER or more is queued. */
int sbx__conn_pressured(sbx__conn_t *c);
/* The response is complete: stop reading and the timer's REQUEST use, shut
 * our side down once the queue has drained, then finished(c), then linger
 * (SBX_LINGER_MS, at most SBX_MAX_LINGER_BYTES drained) and close. */
void sbx__conn_end(sbx__conn_t *c);

#endif
