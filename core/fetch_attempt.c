/*
 * fetch_attempt.c: one pinned attempt of safe fetch (shared/spec/fetch-and-
 * delegation.md 1.8, 1.10, 1.12): a GET through libcurl's multi interface on
 * the libuv loop, against one already vetted address, with every response
 * bound enforced as bytes arrive (the head here, the body in fetch_decode.c).
 * The family: fetch_call.c drives attempts (the hop loop, sbx_fetch.h),
 * fetch_lua.c is the Lua binding (core.fetch_attempt among it), and
 * fetch_internal.h is what they share.
 *
 * Design
 * - Every attempt has its own curl multi (curl_loop.c) and a fresh easy
 *   handle: nothing (DNS cache entry, connection) outlives the attempt, and
 *   the multi is never the broker's (upstream.c).
 * - The attempt is pinned to one vetted address: CONNECT_TO sends the
 *   connection there while the URL, Host header, SNI and certificate check
 *   keep the hostname; OPENSOCKETFUNCTION refuses any other socket;
 *   PREREQFUNCTION checks the connected peer once more before the request
 *   is sent and arms the idle timer. The transfer policy is the broker
 *   upstream client's too (sbx__curl_harden, curl_loop.c): fresh connection,
 *   no reuse, no proxy, no redirects, no cookies, no DNS cache, no content
 *   decoding by curl, HTTP/1.1 only (never 0.9), TLS 1.2+.
 * - Bounds are enforced as bytes arrive (header block, declared length,
 *   encoding, wire bytes, decoded bytes); a decoder never produces more than
 *   the remaining budget plus one byte, so a bomb stops, it is not buffered.
 * - done(ud, outcome) runs exactly once from a libuv callback (never inside
 *   a curl callback), and never after sbx__attempt_cancel. The attempt is
 *   freed right after done returns; uv handles in their close callbacks.
 *
 * Nothing here logs a URL, header, body or curl error text.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <curl/curl.h>

#include "fetch_decode.h"
#include "fetch_internal.h"
#include "http_head.h"

#if LIBCURL_VERSION_NUM < 0x075500   /* 7.85.0: PROTOCOLS_STR; PREREQ is 7.80 */
#error "safe fetch needs libcurl >= 7.85 (CURLOPT_PROTOCOLS_STR, CURLOPT_PREREQFUNCTION)"
#endif

/* Bounds (spec 1.3, 1.9, 1.12). */
#define SF_MAX_BYTES        SBX_FETCH_MAX_BYTES
#define SF_MAX_HEADERS      SBX__ATT_MAX_LINES
#define SF_MAX_HEAD_BYTES   65536     /* status lines + header blocks */
#define SF_MAX_FIELDS       SBX__ATT_MAX_FIELDS

#define SF_OK                 SBX__ATT_OK
#define SF_REDIRECT           SBX__ATT_REDIRECT
#define SF_IDLE               SBX__ATT_IDLE
#define SF_HEAD_TOO_LARGE     SBX__ATT_HEAD_TOO_LARGE
#define SF_DECLARED_TOO_LARGE SBX__ATT_DECLARED_TOO_LARGE
#define SF_ENCODING           SBX__ATT_ENCODING
#define SF_WIRE_TOO_LARGE     SBX__ATT_WIRE_TOO_LARGE
#define SF_BODY_TOO_LARGE     SBX__ATT_BODY_TOO_LARGE
#define SF_DECODE             SBX__ATT_DECODE
#define SF_PIN                SBX__ATT_PIN
#define SF_BAD_STATUS         SBX__ATT_BAD_STATUS
#define SF_CONNECT_TIMEOUT    SBX__ATT_CONNECT_TIMEOUT
#define SF_TRANSPORT          SBX__ATT_TRANSPORT
#define SF_NOMEM              SBX__ATT_NOMEM

typedef struct sbx__attempt sf_req_t;

typedef sbx__hfield_t sf_field_t;

struct sbx__attempt {
  sbx__curl_loop_t *cl;      /* this attempt's own multi */
  sbx__attempt_done_fn done;
  void *ud;
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
  sbx__body_t body;          /* bounded and decoded as it arrives (fetch_decode.c) */
  int kind;                  /* decided outcome, 0 while running */
  char errbuf[CURL_ERROR_SIZE];
};

/* ---- attempt lifetime ------------------------------------------------- */

static void idle_closed(uv_handle_t *h) { free(h); }

/* Removes r from curl, closes its multi and frees it. */
static void req_destroy(sf_req_t *r) {
  if (r->easy != NULL) {
    if (r->cl != NULL) sbx__curl_loop_remove(r->cl, r->easy);
    curl_easy_cleanup(r->easy);
  }
  if (r->cl != NULL) sbx__curl_loop_close(r->cl);
  curl_slist_free_all(r->headers);
  curl_slist_free_all(r->connect_to);
  if (r->idle != NULL) {
    uv_timer_stop(r->idle);
    uv_close((uv_handle_t *)r->idle, idle_closed);
  }
  sbx__body_free(&r->body);
  free(r->head_store);
  free(r);
}

void sbx__attempt_cancel(sbx__attempt_t *a) {
  if (a != NULL) req_destroy(a);
}

static const sf_field_t *field_get(const sf_req_t *r, const char *name, size_t nl, int *count);

int sbx__attempt_fields(const sbx__attempt_out_t *o, sbx_fetch_header_t *out, size_t max,
                        char **mem) {
  const sf_req_t *r = o->a;
  int decoded = r->body.coding != SBX__CODING_IDENTITY && o->kind == SF_OK;
  size_t n = 0, total = 0, i, j, used = 0;
  char *m;
  *mem = NULL;
  if (!o->has_headers) return 0;
  /* sizes first: every value once, plus ", " per repeat, plus NULs */
  for (i = 0; i < (size_t)r->nfields; i++) total += r->fields[i].name_len + r->fields[i].val_len + 4;
  if (total == 0) return 0;
  m = malloc(total);
  if (m == NULL) return -1;
  for (i = 0; i < (size_t)r->nfields; i++) {
    const sf_field_t *f = &r->fields[i];
    const char *name = r->head_store + f->name_off;
    int seen = 0;
    if (f->name_len == 16 && memcmp(name, "content-encoding", 16) == 0) continue;
    if (decoded && f->name_len == 14 && memcmp(name, "content-length", 14) == 0) continue;
    for (j = 0; j < i && !seen; j++)
      seen = r->fields[j].name_len == f->name_len &&
             memcmp(r->head_store + r->fields[j].name_off, name, f->name_len) == 0;
    if (seen || n >= max) continue;
    /* a new name: its value is every field of that name, joined */
    out[n].name = m + used;
    out[n].name_len = f->name_len;
    memcpy(m + used, name, f->name_len);
    used += f->name_len;
    m[used++] = '\0';
    out[n].value = m + used;
    for (j = i; j < (size_t)r->nfields; j++) {
      const sf_field_t *g = &r->fields[j];
      if (g->name_len != f->name_len || memcmp(r->head_store + g->name_off, name, f->name_len) != 0)
        continue;
      if (j != i) { m[used++] = ','; m[used++] = ' '; }
      memcpy(m + used, r->head_store + g->val_off, g->val_len);
      used += g->val_len;
    }
    out[n].value_len = (size_t)(m + used - out[n].value);
    m[used++] = '\0';
    n++;
  }
  if (n == 0) { free(m); return 0; }
  *mem = m;
  return (int)n;
}

/* 1.10: the errnos before any response byte that let the call try the next
 * vetted address. */
int sbx__errno_is_fallback(int err) {
  switch (err) {
    case ECONNREFUSED: case ECONNRESET: case EHOSTUNREACH: case ENETUNREACH:
    case EAFNOSUPPORT: case EADDRNOTAVAIL: case ETIMEDOUT: return 1;
    default: return 0;
  }
}

/* The attempt is over: decide, call done, free. kind_hint overrides (idle
 * timer); rc is curl's result otherwise. */
static void finish(sf_req_t *r, CURLcode rc, int kind_hint) {
  sbx__attempt_out_t o;
  long os_errno = 0;
  memset(&o, 0, sizeof o);
  o.a = r;
  if (r->easy != NULL) curl_easy_getinfo(r->easy, CURLINFO_OS_ERRNO, &os_errno);
  if (kind_hint != 0) o.kind = kind_hint;
  else if (r->kind != 0) o.kind = r->kind;
  else if (rc == CURLE_OK) {
    if (!r->in_final || !r->head_done) o.kind = SF_BAD_STATUS;
    else o.kind = sbx__body_finish(&r->body);
  } else if (rc == CURLE_OPERATION_TIMEDOUT && !r->connected && !r->got_bytes) {
    o.kind = SF_CONNECT_TIMEOUT;
    o.err = ETIMEDOUT;
    o.fallback = 1;
  } else {
    o.kind = SF_TRANSPORT;
    o.err = (int)os_errno;
    o.fallback = !r->got_bytes && sbx__errno_is_fallback(o.err);
    o.message = r->errbuf[0] != '\0' ? r->errbuf : curl_easy_strerror(rc);
  }
  if (r->in_final && r->status > 0) {
    o.has_status = 1;
    o.status = r->status;
    if (r->has_reason) {
      o.reason = r->head_store + r->reason_off;
      o.reason_len = r->reason_len;
    }
    if (r->head_done) {
      o.has_headers = 1;
      field_get(r, "location", 8, &o.location_count);
    }
  }
  if (o.kind == SF_REDIRECT) r->body.len = 0;
  if (o.kind == SF_OK || o.kind == SF_REDIRECT) {
    o.body = r->body.buf;
    o.len = r->body.len;
    r->body.buf = NULL;
  }
  if (r->idle != NULL) uv_timer_stop(r->idle);
  r->done(r->ud, &o);
  free(o.body);
  req_destroy(r);
}

void sbx__attempt_curl_done(void *priv, CURL *easy, CURLcode rc) {
  (void)easy;
  finish(priv, rc, 0);
}

static void on_idle(uv_timer_t *t) {
  sf_req_t *r = t->data;
  if (r == NULL) return;
  finish(r, CURLE_OK, SF_IDLE);
}

static void idle_kick(sf_req_t *r) {
  r->got_bytes = 1;
  if (r->idle != NULL && r->connected) uv_timer_start(r->idle, on_idle, r->idle_ms, 0);
}

/* ---- pinning callbacks ------------------------------------------------ */

int sbx__pin_socket_ok(const sbx__pin_t *pin, int is_ipcxn, int family, const struct sockaddr *sa,
                       size_t len) {
  if (!is_ipcxn || sa == NULL || family != pin->family) return 0;
  if (family == AF_INET) {
    const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
    return len == sizeof *sin && sin->sin_family == AF_INET && memcmp(&sin->sin_addr, pin->addr, 4) == 0 &&
           ntohs(sin->sin_port) == pin->port;
  }
  if (family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    return len == sizeof *s6 && s6->sin6_family == AF_INET6 && memcmp(&s6->sin6_addr, pin->addr, 16) == 0 &&
           ntohs(s6->sin6_port) == pin->port && s6->sin6_scope_id == 0;
  }
  return 0;
}

int sbx__pin_peer_ok(const sbx__pin_t *pin, const char *primary_ip, int primary_port) {
  unsigned char got[16];
  if (primary_ip == NULL || primary_port != pin->port) return 0;
  if (pin->family != AF_INET && pin->family != AF_INET6) return 0;
  if (inet_pton(pin->family, primary_ip, got) != 1) return 0;
  return memcmp(got, pin->addr, pin->family == AF_INET ? 4 : 16) == 0;
}

static sbx__pin_t pin_of(const sf_req_t *r) {
  sbx__pin_t p;
  p.family = r->family;
  memcpy(p.addr, r->addr, sizeof p.addr);
  p.port = r->port;
  return p;
}

static curl_socket_t on_opensocket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  sf_req_t *r = ud;
  sbx__pin_t pin = pin_of(r);
  int fd;
  if (!sbx__pin_socket_ok(&pin, purpose == CURLSOCKTYPE_IPCXN, a->family, (const struct sockaddr *)&a->addr,
                          a->addrlen))
    return CURL_SOCKET_BAD;
  fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

static int on_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port) {
  sf_req_t *r = ud;
  sbx__pin_t pin = pin_of(r);
  (void)local_ip; (void)local_port;
  if (!sbx__pin_peer_ok(&pin, primary_ip, primary_port)) {
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
    if (ok && len > r->body.max) return SF_DECLARED_TOO_LARGE;
    if (ok) r->body.declared = (size_t)len;
  }
  f = field_get(r, "content-encoding", 16, &n);
  if (n > 1) return SF_ENCODING;
  if (f != NULL) {
    int coding = sbx__body_coding(r->head_store + f->val_off, f->val_len);
    if (coding < 0) return SF_ENCODING;
    r->body.coding = coding;
  }
  return 0;
}

/* CURLOPT_HEADERFUNCTION: every line of every block (interim ones too). */
static size_t on_header(char *p, size_t size, size_t nitems, void *ud) {
  sf_req_t *r = ud;
  size_t n = size * nitems;
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
  switch (sbx__http_field(p, n, r->head_store, &r->hb_len, SF_MAX_HEAD_BYTES,
                          &r->fields[r->nfields])) {
  case 0: r->nfields++; return n;
  case -1: r->kind = SF_BAD_STATUS; return 0;                  /* obs-fold, no name */
  default: r->kind = SF_HEAD_TOO_LARGE; return 0;
  }
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
  sf_req_t *r = ud;
  size_t n = size * nmemb;
  if (r->kind != 0) return 0;
  if (!r->head_done) { r->kind = SF_BAD_STATUS; return 0; }
  idle_kick(r);
  if (n == 0) return 0;
  r->kind = sbx__body_feed(&r->body, (const unsigned char *)p, n);
  return r->kind == 0 ? n : 0;
}

/* ---- starting an attempt ---------------------------------------------- */

int sbx__header_line_ok(const char *s, size_t n) {
  size_t i = 0, k;
  while (i < n && sbx__http_is_tchar((unsigned char)s[i])) i++;
  if (i == 0 || i >= n || s[i] != ':') return 0;
  for (k = i + 1; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    if (c != '\t' && (c < 0x20 || c == 0x7f)) return 0;
  }
  return 1;
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
  int bad = sbx__curl_harden(r->easy, "http,https", cainfo) != 0;
  SET(CURLOPT_PRIVATE, (char *)r);
  SET(CURLOPT_URL, url);
  SET(CURLOPT_ERRORBUFFER, r->errbuf);
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
  return bad ? -1 : 0;
}

#undef SET

sbx__attempt_t *sbx__attempt_start(sbx__curl_loop_t *cl, uv_loop_t *loop,
                                   const sbx__attempt_params_t *p,
                                   sbx__attempt_done_fn done, void *ud, const char **err) {
  char pin_text[INET6_ADDRSTRLEN + 2], connect_to[128];
  unsigned char bin[16];
  int fam = p->family;
  size_t i;
  long connect_ms = p->connect_ms < p->timeout_ms ? p->connect_ms : p->timeout_ms;
  sf_req_t *r;
  (void)cl;
  *err = "out of memory";
  memcpy(bin, p->addr, 16);
  /* A vetted IPv4-mapped answer is connected as its IPv4 address. */
  if (fam == AF_INET6 && IN6_IS_ADDR_V4MAPPED((struct in6_addr *)bin)) {
    fam = AF_INET;
    memmove(bin, bin + 12, 4);
  }
  if ((fam != AF_INET && fam != AF_INET6) || p->port < 1 || p->port > 65535 ||
      p->nlines > SF_MAX_HEADERS || p->max_bytes < 1 || p->max_bytes > SF_MAX_BYTES) {
    *err = "bad attempt parameters";
    return NULL;
  }
  r = calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->done = done;
  r->ud = ud;
  r->family = fam;
  memcpy(r->addr, bin, fam == AF_INET ? 4 : 16);
  r->port = p->port;
  r->body.max = p->max_bytes;
  r->idle_ms = p->idle_ms;
  r->head_store = malloc(SF_MAX_HEAD_BYTES);
  if (r->head_store == NULL) goto fail;
  /* CONNECT_TO with an empty source host and port: this handle has one URL,
   * so every connection it makes goes to the pin (IPv6 in brackets). */
  inet_ntop(fam, bin, pin_text, sizeof pin_text);
  snprintf(connect_to, sizeof connect_to, fam == AF_INET6 ? "::[%s]:%d" : "::%s:%d",
           pin_text, p->port);
  if (slist_add(&r->connect_to, connect_to) != 0) goto fail;
  for (i = 0; i < p->nlines; i++) {
    if (!sbx__header_line_ok(p->lines[i], strlen(p->lines[i]))) { *err = "bad header line"; goto fail; }
    if (slist_add(&r->headers, p->lines[i]) != 0) goto fail;
  }
  r->easy = curl_easy_init();
  if (r->easy == NULL) goto fail;
  *err = "fetch client setup failed";
  if (setup_easy(r, p->url, connect_ms, p->timeout_ms, p->cainfo) != 0) goto fail;
  r->cl = sbx__curl_loop_new(loop, sbx__attempt_curl_done);
  if (r->cl == NULL) goto fail;
  *err = "out of memory";
  r->idle = malloc(sizeof *r->idle);
  if (r->idle == NULL) goto fail;
  uv_timer_init(loop, r->idle);
  r->idle->data = r;
  *err = "fetch client setup failed";
  if (sbx__curl_loop_add(r->cl, r->easy) != 0) goto fail;
  *err = NULL;
  return r;
fail:
  req_destroy(r);
  return NULL;
}
