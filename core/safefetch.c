/*
 * safefetch.c: the C half of safe fetch (spec/fetch-and-delegation.md section
 * 1): one pinned GET per attempt through libcurl's multi interface on the
 * libuv loop, the system resolver on the libuv thread pool, and the host's
 * interface addresses. lua/sandbox/fetch.lua owns the hop loop (admission
 * through core.url_admit, vetting through core.addr_classify, fallback,
 * redirects, deadlines, the error catalogue).
 *
 * Design
 * - Its own curl multi handle per loop (never the broker's, upstream.c), kept
 *   in the registry as a userdata whose __gc tears it down; sockets and the
 *   timer are fed to libuv exactly as in upstream.c.
 * - An attempt (sf_req_t) is pinned to one already vetted address: CONNECT_TO
 *   sends the connection there while the URL, Host header, SNI and certificate
 *   check keep the hostname; OPENSOCKETFUNCTION refuses any other socket;
 *   PREREQFUNCTION checks the connected peer once more before the request is
 *   sent and arms the idle timer. Fresh connection, no reuse, no proxy, no
 *   redirects, no cookies, no content decoding by curl, HTTP/1.1 only.
 * - Bounds are enforced as bytes arrive (header block, declared length,
 *   encoding, wire bytes, decoded bytes); a decoder never produces more than
 *   the remaining budget plus one byte, so a bomb stops, it is not buffered.
 * - on_done(res) runs exactly once from a libuv callback (never inside a curl
 *   callback), and never after attempt:cancel(). Memory is freed in
 *   req_destroy; uv handles in their close callbacks.
 *
 * Nothing here logs a URL, header, body or curl error text.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <brotli/decode.h>
#include <curl/curl.h>
#include <zlib.h>

#include "sbx_internal.h"

#if LIBCURL_VERSION_NUM < 0x075500   /* 7.85.0: PROTOCOLS_STR; PREREQ is 7.80 */
#error "safe fetch needs libcurl >= 7.85 (CURLOPT_PROTOCOLS_STR, CURLOPT_PREREQFUNCTION)"
#endif

#define MULTI_KEY "sbx.safefetch.multi"
#define MULTI_MT  "sbx.safefetch.multi_mt"
#define REQ_MT    "sbx.safefetch.attempt"
#define RES_MT    "sbx.safefetch.lookup"

/* Bounds (spec 1.3, 1.9, 1.12). */
#define SF_MAX_URL          8192
#define SF_MAX_HOST         255
#define SF_MAX_BYTES        33554432
#define SF_MAX_TIMEOUT_MS   120000
#define SF_MAX_HEADERS      40        /* 32 caller + defaults + forced */
#define SF_MAX_HEADER_LINE  8800
#define SF_MAX_HEAD_BYTES   65536     /* status lines + header blocks */
#define SF_MAX_FIELDS       100
#define SF_BUF_STEP         65536

/* Outcome kinds, also the `kind` string Lua maps to the catalogue. */
enum {
  SF_OK = 1, SF_REDIRECT, SF_IDLE, SF_HEAD_TOO_LARGE, SF_DECLARED_TOO_LARGE,
  SF_ENCODING, SF_WIRE_TOO_LARGE, SF_BODY_TOO_LARGE, SF_DECODE, SF_PIN,
  SF_BAD_STATUS, SF_CONNECT_TIMEOUT, SF_TRANSPORT, SF_NOMEM
};
static const char *const kind_names[] = {
  NULL, "ok", "redirect", "idle", "header_block", "declared_too_large",
  "encoding", "wire_too_large", "body_too_large", "decode", "pin",
  "bad_status", "connect_timeout", "transport", "nomem"};

enum { DEC_NONE = 0, DEC_GZIP, DEC_DEFLATE, DEC_BR };

typedef struct sf_multi sf_multi_t;
typedef struct sf_req sf_req_t;
typedef struct sf_sock sf_sock_t;

struct sf_multi {
  CURLM *multi;
  uv_timer_t timer;
  sbx__loop_t *lp;
  sf_req_t *reqs;
  sf_sock_t *socks;
};

typedef struct { sf_multi_t *m; } sf_multi_box_t;
typedef struct { sf_req_t *r; } sf_req_box_t;

struct sf_sock {
  uv_poll_t poll;
  curl_socket_t fd;
  sf_multi_t *m;
  sf_sock_t *prev, *next;
};

typedef struct { uint32_t name_off, name_len, val_off, val_len; } sf_field_t;

struct sf_req {
  sf_req_t *prev, *next;
  sf_multi_t *m;
  sf_req_box_t *box;
  CURL *easy;
  struct curl_slist *headers, *connect_to;
  uv_timer_t *idle;          /* own allocation; freed in its close callback */
  uint64_t idle_ms;
  /* the pin */
  int family;                /* AF_INET / AF_INET6 */
  unsigned char addr[16];
  int port;                  /* connect port */
  /* response head */
  size_t head_used;          /* bytes of every block so far (bound) */
  size_t hb_len;             /* bytes of the final block's fields in head_store */
  char *head_store;          /* final block: status text + field bytes */
  sf_field_t fields[SF_MAX_FIELDS];
  int nfields, total_fields;
  long status;
  size_t reason_off, reason_len;
  int has_reason;
  int in_final;              /* reading a non-1xx block */
  int head_done;
  int connected, got_bytes;
  /* body */
  size_t max_bytes, wire, cap, len;
  size_t declared;           /* a valid Content-Length (<= max_bytes), else 0 */
  char *buf;
  int decoder, dec_started, dec_ended;
  z_stream z;
  BrotliDecoderState *br;
  int kind;                  /* decided outcome, 0 while running */
  char errbuf[CURL_ERROR_SIZE];
  int done_ref;
};

/* ---- curl global state ------------------------------------------------ */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;
static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- sockets and timer (as upstream.c) -------------------------------- */

static void sock_closed(uv_handle_t *h) { free(h->data); }

static void sock_close(sf_multi_t *m, sf_sock_t *s) {
  if (s->prev != NULL) s->prev->next = s->next; else m->socks = s->next;
  if (s->next != NULL) s->next->prev = s->prev;
  s->prev = s->next = NULL;
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, sock_closed);
}

static void check_done(sf_multi_t *m);

static void on_poll(uv_poll_t *h, int status, int events) {
  sf_sock_t *s = h->data;
  sf_multi_t *m = s->m;
  int flags = 0, running = 0;
  if (status < 0) flags = CURL_CSELECT_ERR;
  else {
    if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  }
  curl_multi_socket_action(m->multi, s->fd, flags, &running);
  check_done(m);
}

static void on_uv_timer(uv_timer_t *t) {
  sf_multi_t *m = t->data;
  int running = 0;
  if (m->multi == NULL) return;
  curl_multi_socket_action(m->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(m);
}

static int on_curl_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
  sf_multi_t *m = userp;
  sf_sock_t *s = socketp;
  int events = 0;
  (void)easy;
  if (what == CURL_POLL_REMOVE) {
    if (s != NULL) {
      sock_close(m, s);
      curl_multi_assign(m->multi, fd, NULL);
    }
    return 0;
  }
  if (s == NULL) {
    s = calloc(1, sizeof *s);
    if (s == NULL) return -1;
    if (uv_poll_init_socket(&m->lp->uv, &s->poll, fd) != 0) { free(s); return -1; }
    s->poll.data = s;
    s->fd = fd;
    s->m = m;
    s->next = m->socks;
    if (m->socks != NULL) m->socks->prev = s;
    m->socks = s;
    curl_multi_assign(m->multi, fd, s);
  }
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= UV_WRITABLE;
  return uv_poll_start(&s->poll, events, on_poll) != 0 ? -1 : 0;
}

static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
  sf_multi_t *m = userp;
  (void)multi;
  if (timeout_ms < 0) uv_timer_stop(&m->timer);
  else uv_timer_start(&m->timer, on_uv_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

/* ---- attempt lifetime ------------------------------------------------- */

static void idle_closed(uv_handle_t *h) { free(h); }

static void decoder_end(sf_req_t *r) {
  if (r->dec_started && (r->decoder == DEC_GZIP || r->decoder == DEC_DEFLATE)) inflateEnd(&r->z);
  r->dec_started = 0;
  if (r->br != NULL) BrotliDecoderDestroyInstance(r->br);
  r->br = NULL;
}

/* Removes r from curl and frees it. Never calls Lua. L (any thread of the
 * state, or NULL when on_done was already taken) releases on_done. */
static void req_destroy(lua_State *L, sf_req_t *r) {
  sf_multi_t *m = r->m;
  if (r->prev != NULL) r->prev->next = r->next; else m->reqs = r->next;
  if (r->next != NULL) r->next->prev = r->prev;
  if (r->easy != NULL) {
    if (m->multi != NULL) curl_multi_remove_handle(m->multi, r->easy);
    curl_easy_cleanup(r->easy);
  }
  curl_slist_free_all(r->headers);
  curl_slist_free_all(r->connect_to);
  if (r->idle != NULL) {
    uv_timer_stop(r->idle);
    uv_close((uv_handle_t *)r->idle, idle_closed);
  }
  decoder_end(r);
  free(r->head_store);
  free(r->buf);
  if (L != NULL) sbx__unref(L, &r->done_ref);
  if (r->box != NULL) r->box->r = NULL;
  free(r);
}

static const char *errno_name(long e) {
  switch (e) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ECONNRESET: return "ECONNRESET";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ENETUNREACH: return "ENETUNREACH";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EPIPE: return "EPIPE";
    case ECONNABORTED: return "ECONNABORTED";
    default: return NULL;
  }
}

static int is_fallback_errno(long e) {
  return e == ECONNREFUSED || e == ECONNRESET || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == EAFNOSUPPORT || e == EADDRNOTAVAIL || e == ETIMEDOUT;
}

typedef struct {
  sf_req_t *r;
  int kind;
  const char *body;
  size_t len;
  const char *code;
  int fallback;
  const char *message;
} sf_outcome_t;

/* Pushes the final block's headers as { lower-name = "v1, v2" }. Drops
 * content-encoding always and content-length when a decoder ran. */
static void push_headers(lua_State *L, const sf_req_t *r, int decoded) {
  int i;
  lua_createtable(L, 0, r->nfields);
  for (i = 0; i < r->nfields; i++) {
    const sf_field_t *f = &r->fields[i];
    const char *name = r->head_store + f->name_off;
    if (f->name_len == 16 && memcmp(name, "content-encoding", 16) == 0) continue;
    if (decoded && f->name_len == 14 && memcmp(name, "content-length", 14) == 0) continue;
    lua_pushlstring(L, name, f->name_len);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, r->head_store + f->val_off, f->val_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, r->head_store + f->val_off, f->val_len);
    }
    lua_rawset(L, -3);
  }
}

static const sf_field_t *field_get(const sf_req_t *r, const char *name, size_t nl, int *count);

/* Runs inside lua_pcall: (fn, outcome) -> fn(res). */
static int deliver(lua_State *L) {
  const sf_outcome_t *o = lua_touserdata(L, 2);
  const sf_req_t *r = o->r;
  lua_pushvalue(L, 1);
  lua_createtable(L, 0, 8);
  lua_pushboolean(L, o->kind == SF_OK || o->kind == SF_REDIRECT);
  lua_setfield(L, -2, "ok");
  lua_pushstring(L, kind_names[o->kind]);
  lua_setfield(L, -2, "kind");
  if (r->in_final && r->status > 0) {
    lua_pushinteger(L, (lua_Integer)r->status);
    lua_setfield(L, -2, "status");
    if (r->has_reason) {
      lua_pushlstring(L, r->head_store + r->reason_off, r->reason_len);
      lua_setfield(L, -2, "status_text");
    }
    if (r->head_done) {
      int nloc = 0;
      push_headers(L, r, r->decoder != DEC_NONE && o->kind == SF_OK);
      lua_setfield(L, -2, "headers");
      field_get(r, "location", 8, &nloc);
      lua_pushinteger(L, nloc);
      lua_setfield(L, -2, "location_count");
    }
  }
  if (o->kind == SF_OK || o->kind == SF_REDIRECT) {
    lua_pushlstring(L, o->body != NULL ? o->body : "", o->len);
    lua_setfield(L, -2, "body");
  }
  if (o->code != NULL) {
    lua_pushstring(L, o->code);
    lua_setfield(L, -2, "code");
  }
  if (o->message != NULL) {
    lua_pushstring(L, o->message);
    lua_setfield(L, -2, "message");
  }
  lua_pushboolean(L, o->fallback);
  lua_setfield(L, -2, "fallback");
  lua_call(L, 1, 0);
  return 0;
}

static int decode_finish(sf_req_t *r);

/* The attempt is over: decide, call on_done, free. kind_hint overrides
 * (idle timer); rc is curl's result otherwise. */
static void finish(sf_multi_t *m, sf_req_t *r, CURLcode rc, int kind_hint) {
  lua_State *L = m->lp->L;
  sf_outcome_t o;
  long os_errno = 0;
  char *buf = NULL;
  int ref;
  memset(&o, 0, sizeof o);
  o.r = r;
  if (r->easy != NULL) curl_easy_getinfo(r->easy, CURLINFO_OS_ERRNO, &os_errno);
  if (kind_hint != 0) o.kind = kind_hint;
  else if (r->kind != 0) o.kind = r->kind;
  else if (rc == CURLE_OK) {
    if (!r->in_final || !r->head_done) o.kind = SF_BAD_STATUS;
    else o.kind = decode_finish(r);
  } else if (rc == CURLE_OPERATION_TIMEDOUT && !r->connected && !r->got_bytes) {
    o.kind = SF_CONNECT_TIMEOUT;
    o.code = "ETIMEDOUT";
    o.fallback = 1;
  } else {
    o.kind = SF_TRANSPORT;
    o.code = errno_name(os_errno);
    o.fallback = !r->got_bytes && is_fallback_errno(os_errno);
    o.message = r->errbuf[0] != '\0' ? r->errbuf : curl_easy_strerror(rc);
  }
  if (o.kind == SF_REDIRECT) r->len = 0;
  o.len = r->len;
  ref = r->done_ref;
  r->done_ref = LUA_NOREF;
  /* The outcome still reads r's head; free r after the call. */
  if (r->idle != NULL) uv_timer_stop(r->idle);
  if (r->easy != NULL && m->multi != NULL) curl_multi_remove_handle(m->multi, r->easy);
  buf = r->buf;
  r->buf = NULL;
  o.body = buf;
  /* Detach the Lua object first: a cancel from inside on_done is a no-op. */
  if (r->box != NULL) { r->box->r = NULL; r->box = NULL; }
  lua_pushcfunction(L, deliver);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_pushlightuserdata(L, &o);
  sbx__pcall(L, 2);
  req_destroy(NULL, r);
  free(buf);
}

static void check_done(sf_multi_t *m) {
  CURLMsg *msg;
  int left = 0;
  while (m->multi != NULL && (msg = curl_multi_info_read(m->multi, &left)) != NULL) {
    char *priv = NULL;
    if (msg->msg != CURLMSG_DONE) continue;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
    if (priv != NULL) {
      sf_req_t *r = (sf_req_t *)priv;
      /* r may have been finished already (idle) and is then gone */
      finish(m, r, msg->data.result, 0);
    }
  }
}

static void on_idle(uv_timer_t *t) {
  sf_req_t *r = t->data;
  if (r == NULL) return;
  finish(r->m, r, CURLE_OK, SF_IDLE);
}

static void idle_kick(sf_req_t *r) {
  r->got_bytes = 1;
  if (r->idle != NULL && r->connected) uv_timer_start(r->idle, on_idle, r->idle_ms, 0);
}

/* ---- pinning callbacks ------------------------------------------------ */

static curl_socket_t on_opensocket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  sf_req_t *r = ud;
  int fd;
  if (purpose != CURLSOCKTYPE_IPCXN || a->family != r->family) return CURL_SOCKET_BAD;
  if (a->family == AF_INET) {
    const struct sockaddr_in *sin = (const struct sockaddr_in *)&a->addr;
    if (a->addrlen != sizeof *sin || memcmp(&sin->sin_addr, r->addr, 4) != 0 ||
        ntohs(sin->sin_port) != r->port)
      return CURL_SOCKET_BAD;
  } else if (a->family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&a->addr;
    if (a->addrlen != sizeof *s6 || memcmp(&s6->sin6_addr, r->addr, 16) != 0 ||
        ntohs(s6->sin6_port) != r->port || s6->sin6_scope_id != 0)
      return CURL_SOCKET_BAD;
  } else {
    return CURL_SOCKET_BAD;
  }
  fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

static int on_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port) {
  sf_req_t *r = ud;
  unsigned char got[16];
  (void)local_ip; (void)local_port;
  if (primary_ip == NULL || primary_port != r->port ||
      inet_pton(r->family, primary_ip, got) != 1 ||
      memcmp(got, r->addr, r->family == AF_INET ? 4 : 16) != 0) {
    r->kind = SF_PIN;
    return CURL_PREREQFUNC_ABORT;
  }
  r->connected = 1;
  if (r->idle != NULL) uv_timer_start(r->idle, on_idle, r->idle_ms, 0);
  return CURL_PREREQFUNC_OK;
}

/* ---- response head ---------------------------------------------------- */

static int is_ows(char c) { return c == ' ' || c == '\t'; }

/* "HTTP/1.x NNN[ reason]" strictly; returns the status or -1. */
static long parse_status_line(sf_req_t *r, const char *p, size_t n) {
  size_t i, rs, re;
  long code = 0;
  while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r')) n--;
  if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
    return -1;
  for (i = 9; i < 12; i++) {
    if (p[i] < '0' || p[i] > '9') return -1;
    code = code * 10 + (p[i] - '0');
  }
  if (code < 100) return -1;
  r->has_reason = 0;
  if (n > 12) {
    if (p[12] != ' ') return -1;
    rs = 13;
    re = n;
    while (re > rs && is_ows(p[re - 1])) re--;
    if (re > rs) {
      memcpy(r->head_store, p + rs, re - rs);
      r->reason_off = 0;
      r->reason_len = re - rs;
      r->has_reason = 1;
    }
  }
  r->hb_len = r->has_reason ? r->reason_len : 0;
  return code;
}

static const sf_field_t *field_get(const sf_req_t *r, const char *name, size_t nl, int *count) {
  int i;
  const sf_field_t *f = NULL;
  *count = 0;
  for (i = 0; i < r->nfields; i++)
    if (r->fields[i].name_len == nl && memcmp(r->head_store + r->fields[i].name_off, name, nl) == 0) {
      if (f == NULL) f = &r->fields[i];
      (*count)++;
    }
  return f;
}

/* The final block ended: apply 1.12 steps 2 and 3, pick the decoder. Returns
 * 0 to go on reading the body, or a kind that ends the attempt. */
static int head_complete(sf_req_t *r) {
  int n;
  const sf_field_t *f;
  long s = r->status;
  r->head_done = 1;
  if (s == 301 || s == 302 || s == 303 || s == 307 || s == 308) return SF_REDIRECT;
  f = field_get(r, "content-length", 14, &n);
  if (f != NULL && n == 1) {
    const char *v = r->head_store + f->val_off;
    size_t i;
    uint64_t len = 0;
    int ok = f->val_len > 0;
    for (i = 0; i < f->val_len && ok; i++) {
      if (v[i] < '0' || v[i] > '9') ok = 0;
      else if (len > (UINT64_MAX - 9) / 10) { len = UINT64_MAX; }
      else len = len * 10 + (uint64_t)(v[i] - '0');
    }
    if (ok && len > r->max_bytes) return SF_DECLARED_TOO_LARGE;
    if (ok) r->declared = (size_t)len;
  }
  f = field_get(r, "content-encoding", 16, &n);
  if (n > 1) return SF_ENCODING;
  if (f != NULL) {
    const char *v = r->head_store + f->val_off;
    size_t l = f->val_len;
    if (l == 8 && strncasecmp(v, "identity", 8) == 0) r->decoder = DEC_NONE;
    else if (l == 4 && strncasecmp(v, "gzip", 4) == 0) r->decoder = DEC_GZIP;
    else if (l == 7 && strncasecmp(v, "deflate", 7) == 0) r->decoder = DEC_DEFLATE;
    else if (l == 2 && strncasecmp(v, "br", 2) == 0) r->decoder = DEC_BR;
    else return SF_ENCODING;
  }
  return 0;
}

/* CURLOPT_HEADERFUNCTION: every line of every block (interim ones too). */
static size_t on_header(char *p, size_t size, size_t nitems, void *ud) {
  sf_req_t *r = ud;
  size_t n = size * nitems, nl, vs, ve, i;
  const char *colon;
  sf_field_t *f;
  if (r->kind != 0) return 0;
  idle_kick(r);
  r->head_used += n;
  if (r->head_used > SF_MAX_HEAD_BYTES) { r->kind = SF_HEAD_TOO_LARGE; return 0; }
  if (r->status == 0 || r->nfields < 0) {
    long code = parse_status_line(r, p, n);
    if (code < 0) { r->kind = SF_BAD_STATUS; return 0; }
    r->status = code;
    r->nfields = 0;
    r->in_final = code >= 200;
    return n;
  }
  if (n <= 2 && (n == 0 || p[0] == '\r' || p[0] == '\n')) {   /* end of a block */
    int k;
    if (!r->in_final) { r->nfields = -1; return n; }         /* next: a status line */
    k = head_complete(r);
    if (k != 0) { r->kind = k; return 0; }
    return n;
  }
  if (r->nfields < 0) { r->kind = SF_BAD_STATUS; return 0; }
  if (++r->total_fields > SF_MAX_FIELDS) { r->kind = SF_HEAD_TOO_LARGE; return 0; }
  if (!r->in_final) return n;                                  /* 1xx fields: counted only */
  while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r')) n--;
  if (n > 0 && is_ows(p[0])) {                                 /* obs-fold: refuse */
    r->kind = SF_BAD_STATUS;
    return 0;
  }
  colon = memchr(p, ':', n);
  if (colon == NULL || colon == p) { r->kind = SF_BAD_STATUS; return 0; }
  nl = (size_t)(colon - p);
  while (nl > 0 && is_ows(p[nl - 1])) nl--;
  vs = (size_t)(colon - p) + 1;
  ve = n;
  while (vs < ve && is_ows(p[vs])) vs++;
  while (ve > vs && is_ows(p[ve - 1])) ve--;
  if (r->hb_len + nl + (ve - vs) > SF_MAX_HEAD_BYTES) { r->kind = SF_HEAD_TOO_LARGE; return 0; }
  f = &r->fields[r->nfields++];
  f->name_off = (uint32_t)r->hb_len;
  f->name_len = (uint32_t)nl;
  for (i = 0; i < nl; i++) {
    char c = p[i];
    r->head_store[r->hb_len++] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
  }
  f->val_off = (uint32_t)r->hb_len;
  f->val_len = (uint32_t)(ve - vs);
  memcpy(r->head_store + r->hb_len, p + vs, ve - vs);
  r->hb_len += ve - vs;
  return size * nitems;
}

/* ---- body and decoding ------------------------------------------------ */

/* Makes room for at least `need` more bytes, never past max_bytes + 1.
 * Returns 0, -1 (would pass the cap) or -2 (out of memory). */
static int reserve(sf_req_t *r, size_t need) {
  size_t limit = r->max_bytes + 1, cap;
  char *nb;
  if (r->cap - r->len >= need) return 0;
  if (need > limit - r->len) return -1;
  cap = r->cap < SF_BUF_STEP ? SF_BUF_STEP : r->cap;
  while (cap - r->len < need) cap = cap > limit / 2 ? limit : cap * 2;
  if (cap > limit) cap = limit;
  nb = realloc(r->buf, cap);
  if (nb == NULL) return -2;
  r->buf = nb;
  r->cap = cap;
  return 0;
}

/* Room for at least one more decoded byte. */
static int grow(sf_req_t *r) { return reserve(r, 1); }

/* Feeds n wire bytes to the decoder. Returns 0 or a kind. */
static int decode(sf_req_t *r, const unsigned char *p, size_t n) {
  while (n > 0 || (r->decoder == DEC_BR && r->br != NULL && BrotliDecoderHasMoreOutput(r->br))) {
    int g;
    if (r->dec_ended == 2 && n > 0) {                /* gzip: the next member */
      if (inflateReset(&r->z) != Z_OK) return SF_DECODE;
      r->dec_ended = 0;
    }
    if (r->dec_ended) return SF_DECODE;              /* bytes after the end */
    if (!r->dec_started) {
      int wb;
      if (r->decoder == DEC_BR) {
        r->br = BrotliDecoderCreateInstance(NULL, NULL, NULL);
        if (r->br == NULL) return SF_NOMEM;
      } else {
        memset(&r->z, 0, sizeof r->z);
        if (r->decoder == DEC_GZIP) wb = 16 + 15;
        else if (n >= 2 && (p[0] & 0x0f) == 8 && (p[0] >> 4) <= 7 &&
                 ((unsigned)p[0] * 256 + p[1]) % 31 == 0) wb = 15;
        else wb = -15;
        if (inflateInit2(&r->z, wb) != Z_OK) return SF_NOMEM;
      }
      r->dec_started = 1;
    }
    g = grow(r);
    if (g == -2) return SF_NOMEM;
    if (g == -1) return SF_BODY_TOO_LARGE;
    if (r->decoder == DEC_BR) {
      size_t in_left = n, out_left = r->cap - r->len;
      const uint8_t *in = p;
      uint8_t *out = (uint8_t *)r->buf + r->len;
      BrotliDecoderResult br = BrotliDecoderDecompressStream(r->br, &in_left, &in, &out_left, &out, NULL);
      r->len = r->cap - out_left;
      p = in;
      n = in_left;
      if (r->len > r->max_bytes) return SF_BODY_TOO_LARGE;
      if (br == BROTLI_DECODER_RESULT_ERROR) return SF_DECODE;
      if (br == BROTLI_DECODER_RESULT_SUCCESS) {
        r->dec_ended = 1;
        if (n > 0) return SF_DECODE;
        return 0;
      }
      if (br == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT && n == 0) return 0;
    } else {
      int zr;
      r->z.next_in = (Bytef *)p;
      r->z.avail_in = (uInt)(n > UINT32_MAX ? UINT32_MAX : n);
      r->z.next_out = (Bytef *)r->buf + r->len;
      r->z.avail_out = (uInt)(r->cap - r->len);
      zr = inflate(&r->z, Z_NO_FLUSH);
      r->len = r->cap - r->z.avail_out;
      n -= (size_t)((const unsigned char *)r->z.next_in - p);
      p = r->z.next_in;
      if (r->len > r->max_bytes) return SF_BODY_TOO_LARGE;
      if (zr == Z_STREAM_END) {
        if (r->decoder == DEC_GZIP) {
          /* another member may follow; one that is not gzip fails later */
          if (n > 0) { if (inflateReset(&r->z) != Z_OK) return SF_DECODE; }
          else { r->dec_ended = 2; return 0; }
          continue;
        }
        r->dec_ended = 1;
        if (n > 0) return SF_DECODE;
        return 0;
      }
      if (zr == Z_BUF_ERROR && n == 0) return 0;
      if (zr != Z_OK && zr != Z_BUF_ERROR) return SF_DECODE;
      if (zr == Z_OK && n == 0 && r->z.avail_out > 0) return 0;
    }
  }
  return 0;
}

/* At a clean end of transfer: was the stream complete? */
static int decode_finish(sf_req_t *r) {
  if (r->decoder == DEC_NONE) return SF_OK;
  if (r->wire == 0) return SF_OK;                    /* empty body, nothing to decode */
  if (r->decoder == DEC_DEFLATE && !r->dec_started) return SF_DECODE;
  return r->dec_ended ? SF_OK : SF_DECODE;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
  sf_req_t *r = ud;
  size_t n = size * nmemb;
  int k;
  if (r->kind != 0) return 0;
  if (!r->head_done) { r->kind = SF_BAD_STATUS; return 0; }
  idle_kick(r);
  if (n == 0) return 0;
  if (n > r->max_bytes - r->wire) {          /* invariant: wire <= max_bytes */
    r->kind = r->decoder == DEC_NONE ? SF_BODY_TOO_LARGE : SF_WIRE_TOO_LARGE;
    return 0;
  }
  r->wire += n;
  if (r->decoder == DEC_NONE) {
    /* one allocation for a declared length (already checked against the cap) */
    int g = reserve(r, r->len == 0 && r->declared > n ? r->declared : n);
    if (g != 0) { r->kind = g == -2 ? SF_NOMEM : SF_BODY_TOO_LARGE; return 0; }
    memcpy(r->buf + r->len, p, n);
    r->len += n;
    return n;
  }
  if (r->decoder == DEC_DEFLATE && !r->dec_started && n < 2) {
    /* too short to tell zlib from raw: raw deflate it is */
    memset(&r->z, 0, sizeof r->z);
    if (inflateInit2(&r->z, -15) != Z_OK) { r->kind = SF_NOMEM; return 0; }
    r->dec_started = 1;
  }
  k = decode(r, (const unsigned char *)p, n);
  if (k != 0) { r->kind = k; return 0; }
  return n;
}

/* ---- the multi, one per loop ------------------------------------------ */

static void multi_freed(uv_handle_t *h) { free(h->data); }

static int multi_gc(lua_State *L) {
  sf_multi_box_t *b = luaL_checkudata(L, 1, MULTI_MT);
  sf_multi_t *m = b->m;
  if (m == NULL) return 0;
  b->m = NULL;
  while (m->reqs != NULL) req_destroy(L, m->reqs);
  curl_multi_cleanup(m->multi);
  m->multi = NULL;
  while (m->socks != NULL) sock_close(m, m->socks);
  uv_timer_stop(&m->timer);
  uv_close((uv_handle_t *)&m->timer, multi_freed);
  return 0;
}

static sf_multi_t *get_multi(lua_State *L) {
  sf_multi_box_t *b;
  sf_multi_t *m;
  sbx__loop_t *lp;
  if (lua_getfield(L, LUA_REGISTRYINDEX, MULTI_KEY) == LUA_TUSERDATA) {
    b = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return b->m;
  }
  lua_pop(L, 1);
  pthread_once(&global_once, global_init);
  if (global_rc != CURLE_OK) return NULL;
  lp = sbx__loop(L);
  b = lua_newuserdatauv(L, sizeof *b, 0);
  b->m = NULL;
  if (luaL_newmetatable(L, MULTI_MT)) {
    lua_pushcfunction(L, multi_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  m = calloc(1, sizeof *m);
  if (m == NULL) { lua_pop(L, 1); return NULL; }
  m->lp = lp;
  m->multi = curl_multi_init();
  if (m->multi == NULL) { free(m); lua_pop(L, 1); return NULL; }
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETDATA, m);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERDATA, m);
  curl_multi_setopt(m->multi, CURLMOPT_MAXCONNECTS, 1L);
  uv_timer_init(&lp->uv, &m->timer);
  m->timer.data = m;
  b->m = m;
  lua_setfield(L, LUA_REGISTRYINDEX, MULTI_KEY);
  return m;
}

/* ---- argument checks (programming errors raise) ----------------------- */

static const char *opt_string(lua_State *L, const char *field, size_t max, size_t *len) {
  const char *s;
  size_t n;
  if (lua_getfield(L, 1, field) != LUA_TSTRING)
    luaL_error(L, "fetch_attempt: opts.%s must be a string", field);
  s = lua_tolstring(L, -1, &n);
  lua_pop(L, 1);
  if (n == 0 || n > max || memchr(s, '\0', n) != NULL)
    luaL_error(L, "fetch_attempt: bad opts.%s", field);
  if (len != NULL) *len = n;
  return s;
}

static lua_Integer opt_int(lua_State *L, const char *field, lua_Integer dflt, lua_Integer lo,
                           lua_Integer hi) {
  lua_Integer v;
  int isnum = 0;
  int t = lua_getfield(L, 1, field);
  if (t == LUA_TNIL) { lua_pop(L, 1); if (dflt >= lo) return dflt; luaL_error(L, "fetch_attempt: opts.%s is required", field); }
  v = lua_tointegerx(L, -1, &isnum);
  lua_pop(L, 1);
  if (t != LUA_TNUMBER || !isnum || v < lo || v > hi)
    luaL_error(L, "fetch_attempt: opts.%s must be an integer in %I..%I", field, lo, hi);
  return v;
}

static int is_tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* "Name: value" with a token name and no control byte but tab: the last
 * line of defence against header injection (Lua validated already). */
static void check_header_line(lua_State *L, const char *s, size_t n) {
  size_t i = 0, k;
  while (i < n && is_tchar((unsigned char)s[i])) i++;
  if (i == 0 || i >= n || s[i] != ':') luaL_error(L, "fetch_attempt: header lines must be 'Name: value'");
  for (k = i + 1; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    if (c != '\t' && (c < 0x20 || c == 0x7f))
      luaL_error(L, "fetch_attempt: header value holds a control character");
  }
}

static int slist_add(struct curl_slist **list, const char *s) {
  struct curl_slist *nl = curl_slist_append(*list, s);
  if (nl == NULL) return -1;
  *list = nl;
  return 0;
}

#define SET(opt, val) (bad |= curl_easy_setopt(r->easy, opt, val) != CURLE_OK)

static int setup_easy(sf_req_t *r, const char *url, long connect_ms, long timeout_ms,
                      const char *cainfo) {
  int bad = 0;
  SET(CURLOPT_PRIVATE, (char *)r);
  SET(CURLOPT_URL, url);
  SET(CURLOPT_ERRORBUFFER, r->errbuf);
  SET(CURLOPT_PATH_AS_IS, 1L);
  SET(CURLOPT_DISALLOW_USERNAME_IN_URL, 1L);
  SET(CURLOPT_PROTOCOLS_STR, "http,https");
  SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  SET(CURLOPT_FOLLOWLOCATION, 0L);
  SET(CURLOPT_MAXREDIRS, 0L);
  SET(CURLOPT_PROXY, "");
  SET(CURLOPT_NOPROXY, "*");
  SET(CURLOPT_NETRC, (long)CURL_NETRC_IGNORED);
  SET(CURLOPT_SSL_VERIFYPEER, 1L);
  SET(CURLOPT_SSL_VERIFYHOST, 2L);
  SET(CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
  SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  SET(CURLOPT_HTTP09_ALLOWED, 0L);
  SET(CURLOPT_HTTP_CONTENT_DECODING, 0L);
  SET(CURLOPT_FRESH_CONNECT, 1L);
  SET(CURLOPT_FORBID_REUSE, 1L);
  SET(CURLOPT_DNS_CACHE_TIMEOUT, 0L);
  SET(CURLOPT_NOSIGNAL, 1L);
  SET(CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
  SET(CURLOPT_TIMEOUT_MS, timeout_ms);
  SET(CURLOPT_HTTPGET, 1L);
  SET(CURLOPT_IPRESOLVE, r->family == AF_INET ? (long)CURL_IPRESOLVE_V4 : (long)CURL_IPRESOLVE_V6);
  SET(CURLOPT_CONNECT_TO, r->connect_to);
  SET(CURLOPT_OPENSOCKETFUNCTION, on_opensocket);
  SET(CURLOPT_OPENSOCKETDATA, r);
  SET(CURLOPT_PREREQFUNCTION, on_prereq);
  SET(CURLOPT_PREREQDATA, r);
  SET(CURLOPT_HTTPHEADER, r->headers);
  SET(CURLOPT_HEADERFUNCTION, on_header);
  SET(CURLOPT_HEADERDATA, r);
  SET(CURLOPT_WRITEFUNCTION, on_body);
  SET(CURLOPT_WRITEDATA, r);
  if (cainfo != NULL) SET(CURLOPT_CAINFO, cainfo);
  return bad ? -1 : 0;
}

#undef SET

static int fail(lua_State *L, sf_req_t *r, const char *msg) {
  if (r != NULL) {
    if (r->easy != NULL) curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->headers);
    curl_slist_free_all(r->connect_to);
    free(r->head_store);
    sbx__unref(L, &r->done_ref);
    free(r);
  }
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* core.fetch_attempt(opts) -> attempt | nil, err. See API.md. */
static int l_fetch_attempt(lua_State *L) {
  const char *url, *address, *cainfo = NULL;
  size_t url_len, addr_len;
  lua_Integer family, port, max_bytes, connect_ms, timeout_ms, idle_ms, i, nh = 0;
  unsigned char bin[16];
  char pin_text[INET6_ADDRSTRLEN + 2], connect_to[128];
  int fam, ref;
  sf_multi_t *m;
  sf_req_t *r;
  sf_req_box_t *b;

  luaL_checktype(L, 1, LUA_TTABLE);
  url = opt_string(L, "url", SF_MAX_URL, &url_len);
  address = opt_string(L, "address", INET6_ADDRSTRLEN, &addr_len);
  family = opt_int(L, "family", -1, 4, 6);
  port = opt_int(L, "port", -1, 1, 65535);
  max_bytes = opt_int(L, "max_bytes", -1, 1, SF_MAX_BYTES);
  timeout_ms = opt_int(L, "timeout_ms", -1, 1, SF_MAX_TIMEOUT_MS);
  connect_ms = opt_int(L, "connect_timeout_ms", 3000, 1, SF_MAX_TIMEOUT_MS);
  idle_ms = opt_int(L, "idle_timeout_ms", -1, 1, SF_MAX_TIMEOUT_MS);
  if (lua_getfield(L, 1, "cainfo") != LUA_TNIL) { lua_pop(L, 1); cainfo = opt_string(L, "cainfo", 4096, NULL); }
  else lua_pop(L, 1);
  if (family == 5) luaL_error(L, "fetch_attempt: opts.family must be 4 or 6");
  fam = family == 4 ? AF_INET : AF_INET6;
  if (inet_pton(fam, address, bin) != 1) luaL_error(L, "fetch_attempt: opts.address is not an IPv%d literal", (int)family);
  /* A vetted IPv4-mapped answer is connected as its IPv4 address. */
  if (fam == AF_INET6 && IN6_IS_ADDR_V4MAPPED((struct in6_addr *)bin)) {
    fam = AF_INET;
    memmove(bin, bin + 12, 4);
  }
  if (lua_getfield(L, 1, "on_done") != LUA_TFUNCTION) luaL_error(L, "fetch_attempt: opts.on_done must be a function");
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) nh = (lua_Integer)lua_rawlen(L, -1);
  else if (!lua_isnil(L, -1)) luaL_error(L, "fetch_attempt: opts.headers must be an array");
  if (nh > SF_MAX_HEADERS) luaL_error(L, "fetch_attempt: too many header lines");
  for (i = 1; i <= nh; i++) {
    size_t n;
    const char *s;
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING) luaL_error(L, "fetch_attempt: header lines must be strings");
    s = lua_tolstring(L, -1, &n);
    if (n > SF_MAX_HEADER_LINE) luaL_error(L, "fetch_attempt: header line too long");
    check_header_line(L, s, n);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);

  m = get_multi(L);
  if (m == NULL || m->multi == NULL) return fail(L, NULL, "fetch client unavailable");
  b = lua_newuserdatauv(L, sizeof *b, 0);
  b->r = NULL;
  luaL_setmetatable(L, REQ_MT);
  lua_getfield(L, 1, "on_done");
  ref = luaL_ref(L, LUA_REGISTRYINDEX);
  r = calloc(1, sizeof *r);
  if (r == NULL) { luaL_unref(L, LUA_REGISTRYINDEX, ref); return fail(L, NULL, "out of memory"); }
  r->done_ref = ref;
  r->m = m;
  r->family = fam;
  memcpy(r->addr, bin, fam == AF_INET ? 4 : 16);
  r->port = (int)port;
  r->max_bytes = (size_t)max_bytes;
  r->idle_ms = (uint64_t)idle_ms;
  r->head_store = malloc(SF_MAX_HEAD_BYTES);
  if (r->head_store == NULL) return fail(L, r, "out of memory");
  /* CONNECT_TO with an empty source host and port: this handle has one URL,
   * so every connection it makes goes to the pin (IPv6 in brackets). */
  inet_ntop(fam, bin, pin_text, sizeof pin_text);
  snprintf(connect_to, sizeof connect_to, fam == AF_INET6 ? "::[%s]:%d" : "::%s:%d",
           pin_text, (int)port);
  if (slist_add(&r->connect_to, connect_to) != 0) return fail(L, r, "out of memory");
  lua_getfield(L, 1, "headers");
  for (i = 1; i <= nh; i++) {
    int rc;
    lua_rawgeti(L, -1, i);
    rc = slist_add(&r->headers, lua_tostring(L, -1));
    lua_pop(L, 1);
    if (rc != 0) { lua_pop(L, 1); return fail(L, r, "out of memory"); }
  }
  lua_pop(L, 1);
  r->easy = curl_easy_init();
  if (r->easy == NULL) return fail(L, r, "out of memory");
  if (setup_easy(r, url, (long)(connect_ms < timeout_ms ? connect_ms : timeout_ms),
                 (long)timeout_ms, cainfo) != 0)
    return fail(L, r, "fetch client setup failed");
  r->idle = malloc(sizeof *r->idle);
  if (r->idle == NULL) return fail(L, r, "out of memory");
  uv_timer_init(&m->lp->uv, r->idle);
  r->idle->data = r;
  if (curl_multi_add_handle(m->multi, r->easy) != CURLM_OK) {
    uv_close((uv_handle_t *)r->idle, idle_closed);
    r->idle = NULL;
    return fail(L, r, "fetch client setup failed");
  }
  r->next = m->reqs;
  if (m->reqs != NULL) m->reqs->prev = r;
  m->reqs = r;
  r->box = b;
  b->r = r;
  return 1;
}

static int req_cancel(lua_State *L) {
  sf_req_box_t *b = luaL_checkudata(L, 1, REQ_MT);
  if (b->r != NULL) req_destroy(L, b->r);
  b->r = NULL;
  return 0;
}

static int req_gc(lua_State *L) {
  sf_req_box_t *b = luaL_checkudata(L, 1, REQ_MT);
  if (b->r != NULL) b->r->box = NULL;
  b->r = NULL;
  return 0;
}

/* ---- resolver on the thread pool -------------------------------------- */

typedef struct {
  uv_getaddrinfo_t req;
  lua_State *L;
  int done_ref;
  int abandoned;
  int *box;               /* the Lua handle's back pointer, or NULL */
} sf_lookup_t;

static int push_answers(lua_State *L) {
  const struct addrinfo *ai = lua_touserdata(L, 2);
  lua_Integer n = 0;
  lua_pushvalue(L, 1);
  lua_newtable(L);
  for (; ai != NULL; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN];
    int ok = 0, fam = 0;
    if (ai->ai_family == AF_INET && ai->ai_addrlen == sizeof(struct sockaddr_in) && ai->ai_addr != NULL) {
      ok = inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, text, sizeof text) != NULL;
      fam = 4;
    } else if (ai->ai_family == AF_INET6 && ai->ai_addrlen == sizeof(struct sockaddr_in6) && ai->ai_addr != NULL) {
      const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ai->ai_addr;
      ok = s6->sin6_scope_id == 0 && inet_ntop(AF_INET6, &s6->sin6_addr, text, sizeof text) != NULL;
      fam = 6;
    }
    lua_createtable(L, 0, 3);
    if (ok) {
      lua_pushstring(L, text);
      lua_setfield(L, -2, "address");
      lua_pushinteger(L, fam);
      lua_setfield(L, -2, "family");
    } else {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "malformed");
    }
    lua_rawseti(L, -2, ++n);
  }
  lua_call(L, 1, 0);
  return 0;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  sf_lookup_t *lk = req->data;
  lua_State *L = lk->L;
  int ref = lk->done_ref;
  if (lk->abandoned) {
    if (res != NULL) uv_freeaddrinfo(res);
    free(lk);
    return;
  }
  if (lk->box != NULL) *lk->box = 0;
  lk->done_ref = LUA_NOREF;
  if (status < 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    lua_pushnil(L);
    lua_pushstring(L, status == UV_ECANCELED ? "lookup cancelled" : gai_strerror(
        status == UV_EAI_NONAME ? EAI_NONAME : status == UV_EAI_AGAIN ? EAI_AGAIN :
        status == UV_EAI_FAIL ? EAI_FAIL : status == UV_EAI_NODATA ? EAI_NODATA :
        status == UV_EAI_MEMORY ? EAI_MEMORY : status == UV_EAI_FAMILY ? EAI_FAMILY : EAI_FAIL));
    free(lk);
    sbx__pcall(L, 2);
    return;
  }
  lua_pushcfunction(L, push_answers);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_pushlightuserdata(L, res);
  free(lk);
  sbx__pcall(L, 2);
  uv_freeaddrinfo(res);
}

/* core.fetch_resolve(host, on_done) -> lookup: on_done(list) or
 * on_done(nil, message); lookup:cancel() abandons it (the thread-pool result
 * is discarded when it arrives). */
typedef struct { sf_lookup_t *lk; int live; } sf_lookup_ud_t;

static int l_fetch_resolve(lua_State *L) {
  size_t n;
  const char *host = luaL_checklstring(L, 1, &n);
  struct addrinfo hints;
  sf_lookup_ud_t *u;
  sf_lookup_t *lk;
  int rc;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_argcheck(L, n > 0 && n <= SF_MAX_HOST && memchr(host, '\0', n) == NULL, 1, "bad host");
  u = lua_newuserdatauv(L, sizeof *u, 0);
  u->lk = NULL;
  u->live = 0;
  luaL_setmetatable(L, RES_MT);
  lk = calloc(1, sizeof *lk);
  if (lk == NULL) { lua_pushnil(L); lua_pushliteral(L, "out of memory"); return 2; }
  lk->L = sbx__loop(L)->L;
  lk->done_ref = sbx__ref(L, 2);
  lk->req.data = lk;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  rc = uv_getaddrinfo(&sbx__loop(L)->uv, &lk->req, on_resolved, host, NULL, &hints);
  if (rc != 0) {
    sbx__unref(L, &lk->done_ref);
    free(lk);
    lua_pushnil(L);
    lua_pushstring(L, uv_strerror(rc));
    return 2;
  }
  u->lk = lk;
  u->live = 1;
  lk->box = &u->live;
  return 1;
}

static void lookup_abandon(lua_State *L, sf_lookup_ud_t *u) {
  if (u->live && u->lk != NULL) {
    u->lk->abandoned = 1;
    u->lk->box = NULL;
    sbx__unref(L, &u->lk->done_ref);
  }
  u->live = 0;
  u->lk = NULL;
}

static int lookup_cancel(lua_State *L) {
  lookup_abandon(L, luaL_checkudata(L, 1, RES_MT));
  return 0;
}

/* A collected handle abandons nothing: on_done is held in the registry;
 * only the back pointer is dropped. */
static int lookup_gc(lua_State *L) {
  sf_lookup_ud_t *u = luaL_checkudata(L, 1, RES_MT);
  if (u->live && u->lk != NULL) u->lk->box = NULL;
  u->live = 0;
  u->lk = NULL;
  return 0;
}

/* core.local_addresses() -> { text, ... } | nil, err: every interface
 * address (up or down), AF_INET and AF_INET6. */
static int l_local_addresses(lua_State *L) {
  struct ifaddrs *ifa, *it;
  lua_Integer n = 0;
  if (getifaddrs(&ifa) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, "cannot read the interface list");
    return 2;
  }
  lua_newtable(L);
  for (it = ifa; it != NULL; it = it->ifa_next) {
    char text[INET6_ADDRSTRLEN];
    if (it->ifa_addr == NULL) continue;
    if (it->ifa_addr->sa_family == AF_INET)
      inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, text, sizeof text);
    else if (it->ifa_addr->sa_family == AF_INET6)
      inet_ntop(AF_INET6, &((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr, text, sizeof text);
    else continue;
    lua_pushstring(L, text);
    lua_rawseti(L, -2, ++n);
  }
  freeifaddrs(ifa);
  return 1;
}

void sbx__open_safefetch(lua_State *L) {
  static const luaL_Reg methods[] = {{"cancel", req_cancel}, {NULL, NULL}};
  static const luaL_Reg lmethods[] = {{"cancel", lookup_cancel}, {NULL, NULL}};
  if (luaL_newmetatable(L, REQ_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, req_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, RES_MT)) {
    luaL_newlib(L, lmethods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, lookup_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_fetch_attempt);
  lua_setfield(L, -2, "fetch_attempt");
  lua_pushcfunction(L, l_fetch_resolve);
  lua_setfield(L, -2, "fetch_resolve");
  lua_pushcfunction(L, l_local_addresses);
  lua_setfield(L, -2, "local_addresses");
}
