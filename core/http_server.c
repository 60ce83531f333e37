/*
 * http_server.c: two small primitives outside the sealed path.
 *
 *  - core.http_server(opts): a loopback-only TCP HTTP/1.1 server (bound to
 *    a loopback address, 127.0.0.1 unless opts.host names another of
 *    127.0.0.0/8 or ::1, never anything else) that serves one request per
 *    connection and always answers with `Connection: close`. Requests are
 *    framed by Debian's http_parser; the request head (target plus headers)
 *    and the body are bounded. It serves `sbx demo`'s scripted model
 *    endpoint, the engine's `metricsListen` endpoint (GET /metrics,
 *    lua/sandbox/ops/metrics_listen.lua) and specs that need a real
 *    loopback upstream.
 *  - core.read_lines(fn): lines from stdin on the loop (tty, pipe or file), so
 *    that `sbx chat` keeps the loop turning (spinner, turns, signals) while it
 *    waits for input.
 *
 * Memory (libuv's rule: a handle's memory is freed in its close callback):
 *  - srv_t holds the listening uv_tcp_t; it is counted: the open server
 *    handle and every connection hold one reference each; the last release
 *    frees it. The Lua server userdata only points at it.
 *  - hconn_t, one connection: a uv_tcp_t and a uv_timer_t (whole-connection
 *    deadline), freed once both close callbacks have run.
 *  - the `req` userdata (Lua's memory) points at its connection until that
 *    closes or is replied to; afterwards its reply is a no-op.
 * Lua is called only from libuv callbacks, on sbx__loop(L)->L, and never once
 * the server userdata was collected or closed.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <http_parser.h>

#include "http_head.h"
#include "loop.h"
#include "parts.h"

#define SERVER_MT "sbx.http_server"
#define REQ_MT    "sbx.http_request"
#define LINES_MT  "sbx.line_reader"

#define HS_DEFAULT_MAX_HEAD  16384
#define HS_DEFAULT_MAX_BODY  (1024 * 1024)
#define HS_DEFAULT_TIMEOUT   30000
#define HS_MAX_CONNS         64
#define HS_MAX_HEADERS       64
#define LINES_MAX            (256 * 1024)

typedef struct srv srv_t;
typedef struct hconn hconn_t;
typedef struct hreq hreq_t;

struct srv {
  uv_tcp_t tcp;
  lua_State *L;            /* main thread, for unref */
  int refs;
  int closed;              /* close() ran or the userdata was collected */
  int on_request_ref;
  int self_ref;            /* userdata anchored until close() */
  int port;
  char host[INET6_ADDRSTRLEN + 2];  /* as a URL authority: 127.0.0.1 or [::1] */
  size_t max_head;
  size_t max_body;
  uint64_t timeout_ms;
  hconn_t *conns;
  int nconns;
};

enum { H_READ, H_LUA, H_WRITING, H_CLOSING };

struct hconn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_write_t wreq;
  http_parser parser;
  srv_t *srv;
  hconn_t *prev, *next;
  int state;
  int handles;
  int complete;            /* on_message_complete seen */
  int error_status;        /* 400/413/431 decided while parsing */
  char *head;              /* target, then "name\0value\0" pairs */
  size_t head_len;
  size_t target_len;
  int nfields;             /* names + values appended so far */
  int last_was_value;
  char *body;
  size_t body_len, body_cap;
  char *reply;
  hreq_t *req;
  int req_ref;
};

struct hreq {
  hconn_t *conn;
};



static void srv_release(srv_t *s) {
  if (--s->refs > 0) return;
  free(s);
}

/* ---- connections ---------------------------------------------------------- */

static void hconn_closed(uv_handle_t *h) {
  hconn_t *c = h->data;
  srv_t *s;
  if (--c->handles > 0) return;
  s = c->srv;
  if (c->prev) c->prev->next = c->next; else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->nconns--;
  free(c->head);
  free(c->body);
  free(c->reply);
  free(c);
  srv_release(s);
}

/* Closes both handles; detaches a pending req (its reply becomes a no-op)
   and drops our registry anchor on it. Safe to call twice. */
static void hconn_close(hconn_t *c) {
  if (c->state == H_CLOSING) return;
  c->state = H_CLOSING;
  if (c->req != NULL) {
    c->req->conn = NULL;
    c->req = NULL;
    sbx__unref(c->srv->L, &c->req_ref);
  }
  uv_close((uv_handle_t *)&c->tcp, hconn_closed);
  uv_close((uv_handle_t *)&c->timer, hconn_closed);
}

static void hconn_written(uv_write_t *w, int status) {
  hconn_t *c = w->data;
  (void)status;
  free(c->reply);
  c->reply = NULL;
  hconn_close(c);
}

/* Builds the whole reply, writes it, then closes. */
static void hconn_reply(hconn_t *c, int status, const char *ctype, const char *body, size_t blen) {
  char head[256];
  int n;
  uv_buf_t buf;
  if (c->state == H_CLOSING || c->state == H_WRITING) return;
  if (c->req != NULL) {
    c->req->conn = NULL;
    c->req = NULL;
    sbx__unref(c->srv->L, &c->req_ref);
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  n = snprintf(head, sizeof head,
               "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
               status, sbx__http_reason(status), ctype, blen);
  if (n < 0 || (size_t)n >= sizeof head) { hconn_close(c); return; }
  c->reply = malloc((size_t)n + blen);
  if (c->reply == NULL) { hconn_close(c); return; }
  memcpy(c->reply, head, (size_t)n);
  if (blen > 0) memcpy(c->reply + n, body, blen);
  buf = uv_buf_init(c->reply, (unsigned)((size_t)n + blen));
  c->state = H_WRITING;
  c->wreq.data = c;
  if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &buf, 1, hconn_written) != 0) {
    free(c->reply);
    c->reply = NULL;
    hconn_close(c);
  }
}

static void hconn_fixed(hconn_t *c, int status) {
  const char *msg = sbx__http_reason(status);
  hconn_reply(c, status, "text/plain;charset=utf-8", msg, strlen(msg));
}

static void hconn_timeout(uv_timer_t *t) {
  hconn_t *c = t->data;
  if (c->state == H_READ) hconn_fixed(c, 408);
  else hconn_close(c);
}

/* ---- parser callbacks ------------------------------------------------------ */

static int head_append(hconn_t *c, const char *at, size_t len) {
  char *p;
  if (len > c->srv->max_head - c->head_len) {
    c->error_status = 431;
    return -1;
  }
  p = realloc(c->head, c->head_len + len + 1);
  if (p == NULL) { c->error_status = 500; return -1; }
  c->head = p;
  memcpy(c->head + c->head_len, at, len);
  c->head_len += len;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  hconn_t *c = p->data;
  if (head_append(c, at, len) != 0) return -1;
  c->target_len += len;
  return 0;
}

/* Names and values are stored NUL-terminated one after the other; a new
   field starts when the parser switches between name and value. */
static int field_part(hconn_t *c, const char *at, size_t len, int is_value) {
  if (c->nfields == 0 || c->last_was_value != is_value) {
    /* terminates the target (first field) or the previous part */
    if (head_append(c, "", 1) != 0) return -1;
    if (!is_value && c->nfields / 2 >= HS_MAX_HEADERS) { c->error_status = 431; return -1; }
    c->nfields++;
    c->last_was_value = is_value;
  }
  return head_append(c, at, len);
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  return field_part(p->data, at, len, 0);
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  hconn_t *c = p->data;
  if (c->nfields == 0) return -1;
  return field_part(c, at, len, 1);
}

static int on_headers_complete(http_parser *p) {
  hconn_t *c = p->data;
  /* A name with no value part gets an empty one. */
  if (c->nfields % 2 == 1) {
    if (head_append(c, "", 1) != 0) return -1;
    c->nfields++;
    c->last_was_value = 1;
  }
  if (head_append(c, "", 1) != 0) return -1;
  if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->srv->max_body) {
    c->error_status = 413;
    return -1;
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  hconn_t *c = p->data;
  if (len > c->srv->max_body - c->body_len) { c->error_status = 413; return -1; }
  if (c->body_len + len > c->body_cap) {
    size_t cap = c->body_cap ? c->body_cap * 2 : 4096;
    char *nb;
    while (cap < c->body_len + len) cap *= 2;
    if (cap > c->srv->max_body) cap = c->srv->max_body;
    nb = realloc(c->body, cap);
    if (nb == NULL) { c->error_status = 500; return -1; }
    c->body = nb;
    c->body_cap = cap;
  }
  memcpy(c->body + c->body_len, at, len);
  c->body_len += len;
  return 0;
}

static int on_message_complete(http_parser *p) {
  hconn_t *c = p->data;
  c->complete = 1;
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings settings = {
  .on_url = on_url,
  .on_header_field = on_header_field,
  .on_header_value = on_header_value,
  .on_headers_complete = on_headers_complete,
  .on_body = on_body,
  .on_message_complete = on_message_complete,
};

/* ---- handing a request to Lua ---------------------------------------------- */

static void push_lower(lua_State *L, const char *s) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (; *s; s++) {
    char ch = *s;
    if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
    luaL_addchar(&b, ch);
  }
  luaL_pushresult(&b);
}

static void dispatch(hconn_t *c) {
  srv_t *s = c->srv;
  sbx__loop_t *lp = c->tcp.loop->data;
  lua_State *L = lp->L;
  hreq_t *r;
  const char *q;
  int i;
  uv_read_stop((uv_stream_t *)&c->tcp);
  c->state = H_LUA;
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->on_request_ref);
  r = lua_newuserdatauv(L, sizeof *r, 1);
  r->conn = c;
  luaL_setmetatable(L, REQ_MT);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, http_method_str((enum http_method)c->parser.method));
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, c->head, c->target_len);
  lua_setfield(L, -2, "target");
  lua_createtable(L, 0, c->nfields / 2);
  q = c->head + c->target_len + 1;
  for (i = 0; i + 1 < c->nfields; i += 2) {
    const char *name = q;
    const char *value = name + strlen(name) + 1;
    push_lower(L, name);
    /* Repeated headers: the first one wins (the demo needs no more). */
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TNIL) {
      lua_pop(L, 1);
      lua_pushstring(L, value);
      lua_rawset(L, -3);
    } else {
      lua_pop(L, 2);
    }
    q = value + strlen(value) + 1;
  }
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, c->body ? c->body : "", c->body_len);
  lua_setfield(L, -2, "body");
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, -1);
  c->req_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->req = r;
  /* A handler that raised without replying gets 500 (never its text); one
     that returned without replying may still reply later (from a task).
     Handlers must not run the loop themselves (core.run), so c is alive. */
  if (sbx__pcall(L, 1) != 0 && c->state == H_LUA) hconn_fixed(c, 500);
}

/* Read buffers of both the server's connections and the line reader. */
static void hconn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  if (suggested > 65536) suggested = 65536;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void hconn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  hconn_t *c = st->data;
  size_t used;
  if (nread < 0) {
    free(buf->base);
    if (nread == UV_EOF && c->state == H_READ) {
      /* Let the parser see the end (a body delimited by EOF is refused). */
      http_parser_execute(&c->parser, &settings, NULL, 0);
      if (c->complete) { dispatch(c); return; }
    }
    if (c->state == H_READ) hconn_close(c);
    return;
  }
  if (nread == 0 || c->state != H_READ) { free(buf->base); return; }
  used = http_parser_execute(&c->parser, &settings, buf->base, (size_t)nread);
  free(buf->base);
  if (c->complete) {
    if (c->srv->closed) { hconn_close(c); return; }
    dispatch(c);
    return;
  }
  if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK || used != (size_t)nread) {
    hconn_fixed(c, c->error_status ? c->error_status : 400);
  }
}

static void on_connection(uv_stream_t *server, int status) {
  srv_t *s = server->data;
  hconn_t *c;
  if (status < 0 || s->closed) return;
  c = calloc(1, sizeof *c);
  if (c == NULL) return;
  c->srv = s;
  c->req_ref = LUA_NOREF;
  uv_tcp_init(server->loop, &c->tcp);
  uv_timer_init(server->loop, &c->timer);
  c->tcp.data = c;
  c->timer.data = c;
  c->handles = 2;
  s->refs++;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->nconns++;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || s->nconns > HS_MAX_CONNS) {
    hconn_close(c);
    return;
  }
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  uv_timer_start(&c->timer, hconn_timeout, s->timeout_ms, 0);
  if (uv_read_start((uv_stream_t *)&c->tcp, hconn_alloc, hconn_read) != 0) hconn_close(c);
}

/* ---- server object ---------------------------------------------------------- */

static void srv_handle_closed(uv_handle_t *h) {
  srv_release(h->data);
}

static void srv_shutdown(srv_t *s) {
  hconn_t *c, *next;
  if (s->closed) return;
  s->closed = 1;
  sbx__unref(s->L, &s->on_request_ref);
  sbx__unref(s->L, &s->self_ref);
  for (c = s->conns; c != NULL; c = next) {
    next = c->next;
    hconn_close(c);
  }
  uv_close((uv_handle_t *)&s->tcp, srv_handle_closed);
}

/* The bind address of opts.host: an IPv4 literal of 127.0.0.0/8 or the IPv6
   loopback ::1 (brackets allowed), nothing else; 0 when it is one. */
static int loopback_addr(const char *host, int port, struct sockaddr_storage *ss, char *shown, size_t n) {
  char buf[INET6_ADDRSTRLEN];
  size_t len = strlen(host);
  memset(ss, 0, sizeof *ss);
  if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
    if (len - 2 >= sizeof buf) return -1;
    memcpy(buf, host + 1, len - 2);
    buf[len - 2] = '\0';
    host = buf;
  }
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0 && strchr(host, ':') == NULL) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) return -1;
    if (uv_ip4_name(a, shown, n) != 0) return -1;
    return 0;
  }
  memset(ss, 0, sizeof *ss);
  if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0 && strchr(host, '%') == NULL) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    if (memcmp(&a->sin6_addr, &in6addr_loopback, sizeof a->sin6_addr) != 0) return -1;
    snprintf(shown, n, "[::1]");
    return 0;
  }
  return -1;
}

/* core.http_server{on_request=fn, host="127.0.0.1", port=0, max_head=,
   max_body=, timeout_ms=} -> server | nil, err. Always bound to a loopback
   address: any other opts.host raises. */
static int l_http_server(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  srv_t *s;
  sbx__box_t *box;
  struct sockaddr_storage addr, name;
  char shown[INET6_ADDRSTRLEN + 2];
  int namelen = (int)sizeof name, rc;
  lua_Integer port, max_head, max_body, timeout;
  const char *host;
  luaL_checktype(L, 1, LUA_TTABLE);
  host = sbx__opt_string_field(L, 1, "http_server", "host", INET6_ADDRSTRLEN + 2, NULL, 0);
  port = sbx__opt_integer_field(L, 1, "http_server", "port", 0, 0, 65535);
  max_head = sbx__opt_integer_field(L, 1, "http_server", "max_head", HS_DEFAULT_MAX_HEAD, 256, 1024 * 1024);
  max_body = sbx__opt_integer_field(L, 1, "http_server", "max_body", HS_DEFAULT_MAX_BODY, 0,
                                    64 * 1024 * 1024);
  timeout = sbx__opt_integer_field(L, 1, "http_server", "timeout_ms", HS_DEFAULT_TIMEOUT, 1, 600000);
  if (loopback_addr(host ? host : "127.0.0.1", (int)port, &addr, shown, sizeof shown) != 0)
    return luaL_error(L, "http_server: opts.host must be a loopback address (127.0.0.0/8 or ::1)");
  if (lua_getfield(L, 1, "on_request") != LUA_TFUNCTION)
    return luaL_error(L, "http_server: on_request must be a function");
  box = sbx__box_new(L, SERVER_MT);            /* before C memory: it may raise */
  s = calloc(1, sizeof *s);
  if (s == NULL) return luaL_error(L, "out of memory");
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  s->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  memcpy(s->host, shown, sizeof s->host);
  s->max_head = (size_t)max_head;
  s->max_body = (size_t)max_body;
  s->timeout_ms = (uint64_t)timeout;
  s->refs = 1;
  s->on_request_ref = LUA_NOREF;
  s->self_ref = LUA_NOREF;
  uv_tcp_init(&lp->uv, &s->tcp);
  s->tcp.data = s;
  rc = uv_tcp_bind(&s->tcp, (const struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&s->tcp, 128, on_connection);
  if (rc == 0) rc = uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&name, &namelen);
  if (rc != 0) {
    s->closed = 1;
    uv_close((uv_handle_t *)&s->tcp, srv_handle_closed);
    return sbx__push_error(L, -rc, NULL);
  }
  if (name.ss_family == AF_INET6) s->port = ntohs(((struct sockaddr_in6 *)&name)->sin6_port);
  else s->port = ntohs(((struct sockaddr_in *)&name)->sin_port);
  sbx__box_bind(box, s, NULL);               /* the box owns the server */
  s->on_request_ref = sbx__ref(L, -2);       /* the function under the box */
  s->self_ref = sbx__ref(L, -1);
  return 1;
}

static srv_t *check_srv(lua_State *L) {
  return sbx__box_check(L, 1, SERVER_MT);
}

static int srv_port(lua_State *L) {
  srv_t *s = check_srv(L);
  if (s == NULL || s->closed) return 0;
  lua_pushinteger(L, s->port);
  return 1;
}

static int srv_url(lua_State *L) {
  srv_t *s = check_srv(L);
  const char *path = luaL_optstring(L, 2, "/");
  if (s == NULL || s->closed) return 0;
  lua_pushfstring(L, "http://%s:%d%s", s->host, s->port, path);
  return 1;
}

/* server:host() -> the bound address as a URL authority ("127.0.0.1", "[::1]"). */
static int srv_host(lua_State *L) {
  srv_t *s = check_srv(L);
  if (s == NULL || s->closed) return 0;
  lua_pushstring(L, s->host);
  return 1;
}

static int srv_close(lua_State *L) {
  srv_t *s = sbx__box_detach(luaL_checkudata(L, 1, SERVER_MT));
  if (s != NULL) srv_shutdown(s);
  return 0;
}

static int srv_gc(lua_State *L) { return srv_close(L); }

/* ---- request object ---------------------------------------------------------- */

/* req:reply(status, body [, content_type]) -> true if written, false if the
   connection is gone or was answered already. */
static int req_reply(lua_State *L) {
  hreq_t *r = luaL_checkudata(L, 1, REQ_MT);
  lua_Integer status = luaL_checkinteger(L, 2);
  size_t blen = 0;
  const char *body = luaL_optlstring(L, 3, "", &blen);
  const char *ctype = luaL_optstring(L, 4, "application/json");
  hconn_t *c = r->conn;
  luaL_argcheck(L, status >= 100 && status <= 599, 2, "status out of range");
  luaL_argcheck(L, strpbrk(ctype, "\r\n") == NULL, 4, "invalid content type");
  if (c == NULL) { lua_pushboolean(L, 0); return 1; }
  hconn_reply(c, (int)status, ctype, body, blen);
  lua_pushboolean(L, 1);
  return 1;
}

static int req_is_open(lua_State *L) {
  hreq_t *r = luaL_checkudata(L, 1, REQ_MT);
  lua_pushboolean(L, r->conn != NULL);
  return 1;
}

/* req.method, req.target, req.headers (lowercase names), req.body, then methods. */
static int req_index(lua_State *L) {
  luaL_checkudata(L, 1, REQ_MT);
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  lua_pop(L, 2);
  lua_getmetatable(L, 1);
  lua_getfield(L, -1, "methods");
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

/* ---- core.read_lines --------------------------------------------------------- */

typedef struct lines {
  union { uv_tty_t tty; uv_pipe_t pipe; uv_stream_t stream; } h;
  uv_fs_t fs;
  lua_State *L;
  int is_file;
  int fs_busy;             /* a uv_fs_read is outstanding */
  int stopped;
  int handle_open;
  int detached;            /* the Lua reader is gone (stop() or collected) */
  int in_cb;               /* inside a libuv callback that still uses r */
  int fn_ref;
  char fbuf[16384];
  char *line;
  size_t len;
} lines_t;


static void lines_free_if_done(lines_t *r) {
  if (r->stopped && r->detached && !r->handle_open && !r->fs_busy && !r->in_cb) {
    free(r->line);
    free(r);
  }
}

static void lines_handle_closed(uv_handle_t *h) {
  lines_t *r = h->data;
  r->handle_open = 0;
  lines_free_if_done(r);
}

static void lines_stop(lines_t *r) {
  if (r->stopped) return;
  r->stopped = 1;
  sbx__unref(r->L, &r->fn_ref);
  if (r->handle_open) {
    uv_read_stop(&r->h.stream);
    uv_close((uv_handle_t *)&r->h, lines_handle_closed);
  }
}

/* Calls fn(line) (nil for end of input); true if the reader is still live. */
static int lines_emit(lines_t *r, sbx__loop_t *lp, const char *s, size_t n, int eof) {
  lua_State *L = lp->L;
  if (r->stopped) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->fn_ref);
  if (eof) lua_pushnil(L); else lua_pushlstring(L, s, n);
  sbx__pcall(L, 1);
  return !r->stopped;
}

/* Splits data into lines; a line over LINES_MAX bytes is delivered in parts. */
static void lines_feed(lines_t *r, sbx__loop_t *lp, const char *data, size_t n) {
  size_t i;
  for (i = 0; i < n && !r->stopped; i++) {
    char ch = data[i];
    if (ch == '\n') {
      size_t len = r->len;
      if (len > 0 && r->line[len - 1] == '\r') len--;
      r->len = 0;
      if (!lines_emit(r, lp, r->line ? r->line : "", len, 0)) return;
      continue;
    }
    if (r->line == NULL) {
      r->line = malloc(LINES_MAX);
      if (r->line == NULL) return;
    }
    if (r->len == LINES_MAX) {
      r->len = 0;
      if (!lines_emit(r, lp, r->line, LINES_MAX, 0)) return;
    }
    r->line[r->len++] = ch;
  }
}

static void lines_finish(lines_t *r, sbx__loop_t *lp) {
  if (r->len > 0) {
    size_t len = r->len;
    r->len = 0;
    if (!lines_emit(r, lp, r->line, len, 0)) return;
  }
  if (lines_emit(r, lp, NULL, 0, 1)) lines_stop(r);
}

static void lines_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  lines_t *r = st->data;
  sbx__loop_t *lp = st->loop->data;
  r->in_cb = 1;
  if (nread > 0) lines_feed(r, lp, buf->base, (size_t)nread);
  free(buf->base);
  if (nread < 0 && !r->stopped) lines_finish(r, lp);
  r->in_cb = 0;
  lines_free_if_done(r);
}

static void lines_fs_read(uv_fs_t *req);

static void lines_fs_next(lines_t *r, uv_loop_t *loop) {
  uv_buf_t b = uv_buf_init(r->fbuf, sizeof r->fbuf);
  r->fs.data = r;
  if (uv_fs_read(loop, &r->fs, 0, &b, 1, -1, lines_fs_read) == 0) r->fs_busy = 1;
}

static void lines_fs_read(uv_fs_t *req) {
  lines_t *r = req->data;
  uv_loop_t *loop = req->loop;
  sbx__loop_t *lp = loop->data;
  ssize_t n = req->result;
  uv_fs_req_cleanup(req);
  r->fs_busy = 0;
  r->in_cb = 1;
  if (!r->stopped) {
    if (n > 0) {
      lines_feed(r, lp, r->fbuf, (size_t)n);
      if (!r->stopped) lines_fs_next(r, loop);
    } else {
      lines_finish(r, lp);
    }
  }
  r->in_cb = 0;
  lines_free_if_done(r);
}

/* core.read_lines(fn) -> reader | nil, err. fn(line) per line of stdin
   (without its "\n" or "\r\n"), then fn(nil) once at end of input.
   reader:stop() ends it (no call after that). */
static int l_read_lines(lua_State *L) {
  sbx__loop_t *lp = sbx__loop(L);
  lines_t *r;
  sbx__box_t *box;
  uv_handle_type t = uv_guess_handle(0);
  int rc = 0;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  box = sbx__box_new(L, LINES_MT);             /* before C memory: it may raise */
  r = calloc(1, sizeof *r);
  if (r == NULL) return luaL_error(L, "out of memory");
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  r->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  r->fn_ref = LUA_NOREF;
  if (t == UV_TTY) {
    rc = uv_tty_init(&lp->uv, &r->h.tty, 0, 1);
  } else if (t == UV_NAMED_PIPE) {
    rc = uv_pipe_init(&lp->uv, &r->h.pipe, 0);
    if (rc == 0) {
      rc = uv_pipe_open(&r->h.pipe, 0);
      if (rc != 0) {
        /* the handle is registered: free r from its close callback */
        r->stopped = r->detached = r->handle_open = 1;
        r->h.stream.data = r;
        uv_close((uv_handle_t *)&r->h, lines_handle_closed);
        return sbx__push_error(L, -rc, "cannot read standard input");
      }
    }
  } else if (t == UV_FILE) {
    r->is_file = 1;
  } else {
    rc = UV_EINVAL;
  }
  if (rc != 0) {
    free(r);
    return sbx__push_error(L, -rc, "cannot read standard input");
  }
  r->fn_ref = sbx__ref(L, 1);
  sbx__box_bind(box, r, NULL);               /* the box owns the reader */
  if (r->is_file) {
    lines_fs_next(r, &lp->uv);
  } else {
    r->handle_open = 1;
    r->h.stream.data = r;
    uv_read_start(&r->h.stream, hconn_alloc, lines_read);
  }
  return 1;
}

static int lines_stop_l(lua_State *L) {
  lines_t *r = sbx__box_detach(luaL_checkudata(L, 1, LINES_MT));
  if (r != NULL) {
    lines_stop(r);
    r->detached = 1;
    lines_free_if_done(r);
  }
  return 0;
}

void sbx__open_http_server(lua_State *L) {
  static const luaL_Reg srv_methods[] = {
    {"port", srv_port}, {"host", srv_host}, {"url", srv_url}, {"close", srv_close}, {NULL, NULL}};
  static const luaL_Reg req_methods[] = {
    {"reply", req_reply}, {"is_open", req_is_open}, {NULL, NULL}};
  static const luaL_Reg lines_methods[] = {{"stop", lines_stop_l}, {NULL, NULL}};
  sbx__class(L, SERVER_MT, srv_methods, srv_gc);
  if (luaL_newmetatable(L, REQ_MT)) {
    luaL_newlib(L, req_methods);
    lua_setfield(L, -2, "methods");
    lua_pushcfunction(L, req_index);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  sbx__class(L, LINES_MT, lines_methods, lines_stop_l);
  lua_pushcfunction(L, l_http_server);
  lua_setfield(L, -2, "http_server");
  lua_pushcfunction(L, l_read_lines);
  lua_setfield(L, -2, "read_lines");
}
