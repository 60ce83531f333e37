/*
 * fetch_call.c: the safe-fetch hop loop in C (sbx_fetch.h; shared/spec/
 * fetch-and-delegation.md 1.3, 1.7, 1.9, 1.10, 1.11, 1.14, 1.15).
 *
 * One call is one sbx_fetch_t. Every hop: admit (netaddr.c), one lookup
 * (getaddrinfo on the thread pool, or the resolve seam), refuse the hop
 * unless every answer is a strict public literal and not one of the host's
 * own addresses (getifaddrs at every vetting, or the local_addresses seam),
 * then try the vetted addresses one at a time in resolver order, each
 * attempt pinned to its address (fetch_attempt.c, or the transport seam).
 * Redirects are resolved, admitted and vetted again from scratch.
 *
 * Design
 * - A small state machine driven from libuv callbacks only: the kick and
 *   seam-reply timer (`step`), the deadline timer, the lookup callback and
 *   the attempt's done callback. Nothing runs inside sbx_fetch_start, so a
 *   seam is never called from the caller's stack, and a seam's reply (which
 *   may come at once, from inside the seam call) is handled on the next
 *   `step`, never re-entering the seam.
 * - finish() runs once: it stops and releases the in-flight work (attempt
 *   cancelled, lookup abandoned, seam reply orphaned), frees everything but
 *   the call struct, calls done_cb, and closes the two timers; the struct
 *   is freed in the last close callback (libuv's rule).
 * - A seam reply is shared by the call and the seam (two references); each
 *   side drops its own, so a late answer is discarded without touching the
 *   freed call.
 *
 * Nothing here logs a URL, header or body.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "aux.h"
#include "fetch_internal.h"
#include "http_head.h"
#include "netaddr.h"
#include "sbx_fetch.h"

#define DEFAULT_ACCEPT "text/html,application/pdf,text/plain,application/json;q=0.9,*/*;q=0.1"
#define USER_AGENT     "pi-roundtable-sandbox"
#define MAX_LINES      (SBX_FETCH_MAX_HEADERS + 4)
#define CAND_TEXT_MAX  64       /* a longer answer text is malformed */
#define RESULT_FIELDS  100      /* a response carries at most 100 fields (1.12) */

enum { R_RESOLVE = 1, R_LOCAL, R_TRANSPORT };

typedef struct {
  int family;                   /* 4 or 6 as declared; 0: malformed */
  unsigned char addr[16];       /* filled by vetting */
  char text[CAND_TEXT_MAX];
  size_t len;
} cand_t;

typedef struct lookup {
  uv_getaddrinfo_t req;
  sbx_fetch_t *f;               /* NULL once abandoned */
} lookup_t;

struct sbx_fetch_reply {
  sbx_fetch_t *f;               /* NULL once the call dropped it */
  int kind;                     /* R_* */
  int refs;                     /* call + seam */
  int answered;
  /* the answer */
  int failed;
  sbx_fetch_address_t *addrs;   /* copies, in one block with their texts */
  size_t naddrs;
  sbx_fetch_result_t *res;
  char errno_name[24];          /* as the seam gave it, passed on as it came */
  int err;                      /* its errno (0: none known): the fallback rule */
  int after_response;
  char *message;
};

struct sbx_fetch {
  uv_loop_t *loop;
  sbx_fetch_done_cb done;
  void *ud;
  int check;                    /* sbx_assert_public_url_start */
  /* options */
  size_t max_bytes;
  uint64_t idle_ms;
  int max_redirects, follow;
  char *cainfo;
  sbx_fetch_resolve_fn resolve;
  sbx_fetch_transport_fn transport;
  sbx_fetch_local_fn local_addresses;
  void *seam_ud;
  int test_family;              /* 0, or the test_connect_address override */
  unsigned char test_addr[16];
  uint16_t test_port;
  sbx_fetch_header_t caller[SBX_FETCH_MAX_HEADERS];   /* lower-case, sorted */
  size_t ncaller;
  char *caller_mem;
  /* time */
  uint64_t deadline;            /* uv_now() scale */
  uv_timer_t timer;             /* the deadline */
  uv_timer_t step;              /* kick, seam replies */
  int closing;                  /* handles still to close */
  /* hops */
  sbx_url_t *cur, *next;
  int first_https;
  char first_host[SBX_URL_HOST_MAX + 1];
  uint16_t first_port;
  int any_https, dropped, hop, started;
  cand_t *cands;
  size_t ncands, ci;
  sbx_local_addrs_t *locals;
  /* in flight: at most one of these */
  lookup_t *lk;
  sbx__attempt_t *att;
  sbx_fetch_reply_t *reply;
  int finished;
};

/* ---- catalogue ---------------------------------------------------------- */

const char *sbx_fetch_strerror(int code) {
  switch (code) {
    case SBX_FETCH_OK: return "";
    case SBX_FETCH_E_BOUNDS: return "Invalid fetch bounds";
    case SBX_FETCH_E_HEADERS: return "Invalid fetch headers";
    case SBX_FETCH_E_URL: return "Invalid URL";
    case SBX_FETCH_E_CREDENTIALS: return "Only credential-free HTTP(S) URLs are allowed";
    case SBX_FETCH_E_PORT0: return "Port 0 is not allowed";
    case SBX_FETCH_E_NON_PUBLIC: return "URL resolves to a non-public address";
    case SBX_FETCH_E_UNREACHABLE: return "No vetted address could be reached";
    case SBX_FETCH_E_CONNECT_TIMEOUT: return "Connection deadline exceeded";
    case SBX_FETCH_E_IDLE: return "Response idle timeout exceeded";
    case SBX_FETCH_E_HEADER_BLOCK: return "Response header block too large";
    case SBX_FETCH_E_DECLARED: return "Response exceeds bounds";
    case SBX_FETCH_E_ENCODING: return "Response exceeds bounds or uses unsupported encoding";
    case SBX_FETCH_E_WIRE: return "Wire body too large";
    case SBX_FETCH_E_BODY: return "Response body too large";
    case SBX_FETCH_E_REDIRECTS: return "Too many redirects";
    case SBX_FETCH_E_NO_LOCATION: return "Redirect without location";
    case SBX_FETCH_E_LOCATION: return "Invalid redirect location";
    case SBX_FETCH_E_DOWNGRADE: return "Redirect from HTTPS to HTTP refused";
    case SBX_FETCH_E_TIMEOUT: return "Fetch deadline exceeded";
    case SBX_FETCH_E_CHECK_TIMEOUT: return "URL check deadline exceeded";
    case SBX_FETCH_E_DECODE: return "Response body could not be decoded";
    case SBX_FETCH_E_ABORTED: return "Aborted";
    case SBX_FETCH_E_RESOLVE: return "Name resolution failed";
    case SBX_FETCH_E_TRANSPORT: return "Transport failure";
    default: return "Unknown fetch error";
  }
}

const char *sbx_fetch_error_name(int code) {
  switch (code) {
    case SBX_FETCH_E_DECLARED: return "ResponseTooLargeError";
    case SBX_FETCH_E_CONNECT_TIMEOUT: case SBX_FETCH_E_TRANSPORT: return "TransportError";
    case SBX_FETCH_E_TIMEOUT: case SBX_FETCH_E_CHECK_TIMEOUT: return "TimeoutError";
    case SBX_FETCH_E_DECODE: return "DecodeError";
    case SBX_FETCH_E_RESOLVE: return "ResolveError";
    case SBX_FETCH_E_ABORTED: return "AbortError";
    default: return "UnsafeUrlError";
  }
}

/* ---- results -------------------------------------------------------------- */

static size_t cpy(char *dst, const char *src, size_t n) {
  if (n > 0) memcpy(dst, src, n);
  dst[n] = '\0';
  return n + 1;
}

sbx_fetch_result_t *sbx__result_new(const char *url, size_t url_len, int status,
                                    const char *text, size_t text_len,
                                    const sbx_fetch_header_t *h, size_t nh,
                                    char *body, size_t body_len) {
  size_t total = sizeof(sbx_fetch_result_t) + nh * sizeof(sbx_fetch_header_t) + url_len + 1 +
                 (text != NULL ? text_len + 1 : 0), i, used;
  sbx_fetch_result_t *res;
  sbx_fetch_header_t *hs;
  char *p;
  for (i = 0; i < nh; i++) total += h[i].name_len + h[i].value_len + 2;
  res = calloc(1, total);
  if (res == NULL) { free(body); return NULL; }
  hs = (sbx_fetch_header_t *)(res + 1);
  p = (char *)(hs + nh);
  used = 0;
  res->url = p;
  res->url_len = url_len;
  used += cpy(p + used, url != NULL ? url : "", url_len);
  if (text != NULL) {
    res->status_text = p + used;
    res->status_text_len = text_len;
    used += cpy(p + used, text, text_len);
  }
  for (i = 0; i < nh; i++) {
    hs[i].name = p + used;
    hs[i].name_len = h[i].name_len;
    used += cpy(p + used, h[i].name, h[i].name_len);
    hs[i].value = p + used;
    hs[i].value_len = h[i].value_len;
    used += cpy(p + used, h[i].value, h[i].value_len);
  }
  res->headers = hs;
  res->nheaders = nh;
  res->status = status;
  res->body = body;
  res->body_len = body_len;
  return res;
}

sbx_fetch_result_t *sbx_fetch_result_new(const char *url, size_t url_len, int status,
                                         const char *status_text, size_t status_text_len,
                                         const sbx_fetch_header_t *headers, size_t nheaders,
                                         const char *body, size_t body_len) {
  char *copy = NULL;
  if (body != NULL) {
    copy = malloc(body_len > 0 ? body_len : 1);
    if (copy == NULL) return NULL;
    if (body_len > 0) memcpy(copy, body, body_len);
  }
  return sbx__result_new(url, url_len, status, status_text, status_text_len, headers, nheaders,
                         copy, body != NULL ? body_len : 0);
}

void sbx_fetch_result_free(sbx_fetch_result_t *res) {
  if (res == NULL) return;
  free(res->body);
  free(res);
}

/* ---- options (1.3, 1.9) ------------------------------------------------- */

void sbx_fetch_opts_init(sbx_fetch_opts *o) {
  memset(o, 0, sizeof *o);
  o->max_bytes = SBX_FETCH_DEFAULT_MAX_BYTES;
  o->timeout_ms = SBX_FETCH_DEFAULT_TIMEOUT_MS;
  o->idle_timeout_ms = SBX_FETCH_DEFAULT_IDLE_TIMEOUT_MS;
  o->max_redirects = SBX_FETCH_DEFAULT_MAX_REDIRECTS;
  o->check_timeout_ms = SBX_FETCH_DEFAULT_CHECK_TIMEOUT_MS;
  o->follow_redirects = 1;
}

static int bound_ok(double v, double lo, double hi) {
  return v >= lo && v <= hi && v == floor(v);   /* NaN fails every comparison */
}

static int name_is(const sbx_fetch_header_t *h, const char *lower) {
  size_t n = strlen(lower);
  return h->name_len == n && strncasecmp(h->name, lower, n) == 0;
}

static int header_ok(const sbx_fetch_header_t *h) {
  static const char *const forbidden[] = {
    "host", "connection", "content-length", "transfer-encoding", "te", "trailer", "upgrade",
    "keep-alive", "expect", NULL};
  size_t i;
  if (h->name == NULL || h->value == NULL || h->name_len == 0 ||
      h->name_len > SBX_FETCH_MAX_HEADER_NAME || h->value_len > SBX_FETCH_MAX_HEADER_VALUE)
    return 0;
  for (i = 0; i < h->name_len; i++)
    if (!sbx__http_is_tchar((unsigned char)h->name[i])) return 0;
  for (i = 0; i < h->value_len; i++) {
    unsigned char c = (unsigned char)h->value[i];
    if ((c < 0x20 && c != '\t') || c == 0x7f) return 0;
  }
  for (i = 0; forbidden[i] != NULL; i++)
    if (name_is(h, forbidden[i])) return 0;
  if (h->name_len >= 6 && strncasecmp(h->name, "proxy-", 6) == 0) return 0;
  return 1;
}

int sbx_fetch_opts_check(const sbx_fetch_opts *o, int check) {
  size_t i, j;
  if (o == NULL) return SBX_FETCH_E_BOUNDS;
  if (check) return bound_ok(o->check_timeout_ms, 1, SBX_FETCH_MAX_TIMEOUT_MS) ? 0 : SBX_FETCH_E_BOUNDS;
  if (!bound_ok(o->max_bytes, 1, SBX_FETCH_MAX_BYTES) ||
      !bound_ok(o->timeout_ms, 1, SBX_FETCH_MAX_TIMEOUT_MS) ||
      !bound_ok(o->idle_timeout_ms, 1, SBX_FETCH_MAX_TIMEOUT_MS) ||
      !bound_ok(o->max_redirects, 0, SBX_FETCH_MAX_REDIRECTS) ||
      (o->follow_redirects != 0 && o->follow_redirects != 1))
    return SBX_FETCH_E_BOUNDS;
  if (o->nheaders > SBX_FETCH_MAX_HEADERS || (o->nheaders > 0 && o->headers == NULL))
    return SBX_FETCH_E_HEADERS;
  for (i = 0; i < o->nheaders; i++) {
    if (!header_ok(&o->headers[i])) return SBX_FETCH_E_HEADERS;
    for (j = 0; j < i; j++)
      if (o->headers[j].name_len == o->headers[i].name_len &&
          strncasecmp(o->headers[j].name, o->headers[i].name, o->headers[i].name_len) == 0)
        return SBX_FETCH_E_HEADERS;
  }
  return 0;
}

static int header_cmp(const void *a, const void *b) {
  const sbx_fetch_header_t *x = a, *y = b;
  size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
  int c = memcmp(x->name, y->name, n);
  if (c != 0) return c;
  return x->name_len < y->name_len ? -1 : x->name_len > y->name_len;
}

/* The caller's headers, names lower-cased, sorted by name (one block). */
static int copy_caller(sbx_fetch_t *f, const sbx_fetch_opts *o) {
  size_t total = 0, i, used = 0;
  char *m;
  if (o->nheaders == 0) return 0;
  for (i = 0; i < o->nheaders; i++) total += o->headers[i].name_len + o->headers[i].value_len + 2;
  m = malloc(total);
  if (m == NULL) return -1;
  for (i = 0; i < o->nheaders; i++) {
    size_t k;
    f->caller[i].name = m + used;
    f->caller[i].name_len = o->headers[i].name_len;
    for (k = 0; k < o->headers[i].name_len; k++) {
      char c = o->headers[i].name[k];
      m[used + k] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    m[used + o->headers[i].name_len] = '\0';
    used += o->headers[i].name_len + 1;
    f->caller[i].value = m + used;
    f->caller[i].value_len = o->headers[i].value_len;
    used += cpy(m + used, o->headers[i].value, o->headers[i].value_len);
  }
  f->ncaller = o->nheaders;
  f->caller_mem = m;
  qsort(f->caller, f->ncaller, sizeof f->caller[0], header_cmp);
  return 0;
}

/* Request headers for one hop (1.9): defaults, the caller's (replacing
 * defaults; none once dropped), then the forced two. */
static size_t hop_headers(const sbx_fetch_t *f, sbx_fetch_header_t *out) {
  size_t n = 0, i, k;
  out[n++] = (sbx_fetch_header_t){"accept", 6, DEFAULT_ACCEPT, sizeof DEFAULT_ACCEPT - 1};
  out[n++] = (sbx_fetch_header_t){"user-agent", 10, USER_AGENT, sizeof USER_AGENT - 1};
  if (!f->dropped) {
    for (i = 0; i < f->ncaller; i++) {
      const sbx_fetch_header_t *h = &f->caller[i];
      int replaced = 0;
      if (name_is(h, "accept-encoding")) continue;   /* forced below */
      for (k = 0; k < n && !replaced; k++)
        if (out[k].name_len == h->name_len && memcmp(out[k].name, h->name, h->name_len) == 0) {
          out[k].value = h->value;
          out[k].value_len = h->value_len;
          replaced = 1;
        }
      if (!replaced) out[n++] = *h;
    }
  }
  out[n++] = (sbx_fetch_header_t){"accept-encoding", 15, "identity", 8};
  out[n++] = (sbx_fetch_header_t){"connection", 10, "close", 5};
  return n;
}

/* ---- the end of a call ----------------------------------------------------- */

static void reply_unref(sbx_fetch_reply_t *r) {
  if (--r->refs > 0) return;
  free(r->addrs);
  sbx_fetch_result_free(r->res);
  free(r->message);
  free(r);
}

static void handle_closed(uv_handle_t *h) {
  sbx_fetch_t *f = h->data;
  if (--f->closing == 0) free(f);
}

static void release_work(sbx_fetch_t *f) {
  uv_timer_stop(&f->timer);
  uv_timer_stop(&f->step);
  if (f->att != NULL) { sbx__attempt_cancel(f->att); f->att = NULL; }
  if (f->lk != NULL) { f->lk->f = NULL; f->lk = NULL; }    /* freed by on_resolved */
  if (f->reply != NULL) { f->reply->f = NULL; reply_unref(f->reply); f->reply = NULL; }
  free(f->cur); f->cur = NULL;
  free(f->next); f->next = NULL;
  free(f->cands); f->cands = NULL;
  free(f->locals); f->locals = NULL;
  free(f->caller_mem); f->caller_mem = NULL;
  free(f->cainfo); f->cainfo = NULL;
}

static void finish(sbx_fetch_t *f, sbx_fetch_result_t *res, const sbx_fetch_error_t *err) {
  if (f->finished) { sbx_fetch_result_free(res); return; }
  f->finished = 1;
  release_work(f);
  f->done(f, res, err, f->ud);
  f->closing = 2;
  uv_close((uv_handle_t *)&f->timer, handle_closed);
  uv_close((uv_handle_t *)&f->step, handle_closed);
}

static void fail_full(sbx_fetch_t *f, int code, const char *message, const char *errno_name,
                      int after_response, int from_seam) {
  sbx_fetch_error_t e;
  memset(&e, 0, sizeof e);
  e.code = code;
  e.name = sbx_fetch_error_name(code);
  e.message = message != NULL ? message : sbx_fetch_strerror(code);
  e.errno_name = errno_name;
  e.after_response = after_response;
  e.from_seam = from_seam;
  finish(f, NULL, &e);
}

static void fail(sbx_fetch_t *f, int code) { fail_full(f, code, NULL, NULL, 0, 0); }

static int deadline_passed(sbx_fetch_t *f) {
  uv_update_time(f->loop);
  return uv_now(f->loop) >= f->deadline;
}

static void on_deadline(uv_timer_t *t) {
  sbx_fetch_t *f = t->data;
  fail(f, f->check ? SBX_FETCH_E_CHECK_TIMEOUT : SBX_FETCH_E_TIMEOUT);
}

void sbx_fetch_cancel(sbx_fetch_t *f) {
  if (f == NULL || f->finished) return;
  fail(f, SBX_FETCH_E_ABORTED);
}

/* ---- seams ------------------------------------------------------------------- */

static sbx_fetch_reply_t *seam_reply(sbx_fetch_t *f, int kind) {
  sbx_fetch_reply_t *r = calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->f = f;
  r->kind = kind;
  r->refs = 2;
  f->reply = r;
  return r;
}

/* The seam answered (maybe from inside the seam call): handle it on the
 * next step, from the loop. */
static void on_step(uv_timer_t *t);

/* r is not answered yet: the seam's reference goes now. */
static int reply_taken(sbx_fetch_reply_t *r) {
  int live = r->f != NULL;
  r->answered = 1;
  if (live) uv_timer_start(&r->f->step, on_step, 0, 0);
  reply_unref(r);
  return live ? 0 : 1;
}

int sbx_fetch_reply_addresses(sbx_fetch_reply_t *r, const sbx_fetch_address_t *list, size_t n) {
  size_t total = 0, i, used = 0;
  char *m;
  if (r == NULL || r->answered) return 1;     /* a second answer: ignored */
  if (r->f == NULL) return reply_taken(r);
  if (n > SBX_LOCAL_ADDRS_MAX) {             /* fail closed: one malformed entry */
    n = 1;
    list = NULL;
  }
  for (i = 0; list != NULL && i < n; i++) total += (list[i].text != NULL ? list[i].len : 0) + 1;
  m = malloc(n * sizeof(sbx_fetch_address_t) + total + 1);
  if (m == NULL) {
    r->failed = 1;
    r->message = NULL;
    return reply_taken(r);
  }
  r->addrs = (sbx_fetch_address_t *)m;
  used = n * sizeof(sbx_fetch_address_t);
  for (i = 0; i < n; i++) {
    sbx_fetch_address_t *a = &r->addrs[i];
    if (list == NULL || list[i].text == NULL) {
      a->text = NULL;
      a->len = 0;
      a->family = 0;
      continue;
    }
    a->text = m + used;
    a->len = list[i].len;
    a->family = list[i].family;
    used += cpy(m + used, list[i].text, list[i].len);
  }
  r->naddrs = n;
  return reply_taken(r);
}

int sbx_fetch_reply_result(sbx_fetch_reply_t *r, sbx_fetch_result_t *res) {
  if (r == NULL || r->answered) { sbx_fetch_result_free(res); return 1; }
  if (r->f == NULL) { sbx_fetch_result_free(res); return reply_taken(r); }
  r->res = res;
  return reply_taken(r);
}

int sbx_fetch_reply_fail(sbx_fetch_reply_t *r, const char *errno_name, int after_response,
                         const char *message) {
  if (r == NULL || r->answered) return 1;
  if (r->f == NULL) return reply_taken(r);
  r->failed = 1;
  if (errno_name != NULL && strlen(errno_name) < sizeof r->errno_name) {
    strcpy(r->errno_name, errno_name);
    r->err = sbx__errno_from_name(errno_name);    /* the edge: a name becomes an errno */
  }
  r->after_response = after_response;
  if (message != NULL) r->message = strdup(message);
  return reply_taken(r);
}

void sbx_fetch_reply_release(sbx_fetch_reply_t *r) {
  if (r == NULL || r->answered) return;
  r->answered = 1;
  reply_unref(r);
}

/* ---- one hop ----------------------------------------------------------------- */

static void hop_begin(sbx_fetch_t *f);
static void attempt_next(sbx_fetch_t *f);

static int is_redirect(int s) { return s == 301 || s == 302 || s == 303 || s == 307 || s == 308; }

static const sbx_fetch_header_t *header_find(const sbx_fetch_result_t *res, const char *name) {
  size_t i, n = strlen(name);
  for (i = 0; i < res->nheaders; i++)
    if (res->headers[i].name_len == n && memcmp(res->headers[i].name, name, n) == 0)
      return &res->headers[i];
  return NULL;
}

static int url_code(int rc) {
  switch (rc) {
    case SBX_URL_E_CREDENTIALS: return SBX_FETCH_E_CREDENTIALS;
    case SBX_URL_E_PORT0: return SBX_FETCH_E_PORT0;
    case SBX_URL_E_LOCATION: return SBX_FETCH_E_LOCATION;
    default: return SBX_FETCH_E_URL;
  }
}

/* After each completed attempt, in the order of 1.11. Takes res. */
static void hop_result(sbx_fetch_t *f, sbx_fetch_result_t *res) {
  const sbx_fetch_header_t *loc;
  unsigned count;
  sbx_url_t *t;
  int rc;
  if (res->body_len > f->max_bytes) { sbx_fetch_result_free(res); fail(f, SBX_FETCH_E_BODY); return; }
  if (!f->follow || !is_redirect(res->status)) { finish(f, res, NULL); return; }
  if (f->hop >= f->max_redirects) { sbx_fetch_result_free(res); fail(f, SBX_FETCH_E_REDIRECTS); return; }
  loc = header_find(res, "location");
  count = res->location_count;
  if (loc != NULL && count == 0) count = 1;
  if (loc == NULL || loc->value_len == 0) {
    sbx_fetch_result_free(res);
    fail(f, count > 1 ? SBX_FETCH_E_LOCATION : SBX_FETCH_E_NO_LOCATION);
    return;
  }
  if (count > 1) { sbx_fetch_result_free(res); fail(f, SBX_FETCH_E_LOCATION); return; }
  rc = sbx_url_resolve_ref(f->cur, loc->value, loc->value_len, f->next, NULL);
  sbx_fetch_result_free(res);
  if (rc != SBX_URL_OK) { fail(f, rc == SBX_URL_E_INVALID ? SBX_FETCH_E_LOCATION : url_code(rc)); return; }
  if (f->any_https && !f->next->https) { fail(f, SBX_FETCH_E_DOWNGRADE); return; }
  f->any_https = f->any_https || f->next->https;
  if (f->next->https != f->first_https || f->next->port != f->first_port ||
      strcmp(f->next->host, f->first_host) != 0)
    f->dropped = 1;
  t = f->cur;
  f->cur = f->next;
  f->next = t;
  f->hop++;
  hop_begin(f);
}

static int attempt_code(int kind) {
  switch (kind) {
    case SBX__ATT_IDLE: return SBX_FETCH_E_IDLE;
    case SBX__ATT_HEAD_TOO_LARGE: return SBX_FETCH_E_HEADER_BLOCK;
    case SBX__ATT_DECLARED_TOO_LARGE: return SBX_FETCH_E_DECLARED;
    case SBX__ATT_ENCODING: return SBX_FETCH_E_ENCODING;
    case SBX__ATT_WIRE_TOO_LARGE: return SBX_FETCH_E_WIRE;
    case SBX__ATT_BODY_TOO_LARGE: return SBX_FETCH_E_BODY;
    case SBX__ATT_DECODE: return SBX_FETCH_E_DECODE;
    case SBX__ATT_CONNECT_TIMEOUT: return SBX_FETCH_E_CONNECT_TIMEOUT;
    default: return SBX_FETCH_E_TRANSPORT;
  }
}

/* The real transport's outcome (fetch_attempt.c), from a libuv callback. */
static void on_attempt(void *ud, sbx__attempt_out_t *o) {
  sbx_fetch_t *f = ud;
  sbx_fetch_header_t h[RESULT_FIELDS];
  char *mem = NULL;
  int n;
  f->att = NULL;
  if (o->kind == SBX__ATT_OK || o->kind == SBX__ATT_REDIRECT) {
    sbx_fetch_result_t *res;
    n = sbx__attempt_fields(o, h, RESULT_FIELDS, &mem);
    if (n < 0) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    res = sbx__result_new(f->cur->href, f->cur->href_len, (int)o->status, o->reason, o->reason_len,
                          h, (size_t)n, o->body, o->len);
    o->body = NULL;                              /* adopted (or freed) */
    free(mem);
    if (res == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    res->location_count = (unsigned)o->location_count;
    hop_result(f, res);
    return;
  }
  if (o->kind == SBX__ATT_CONNECT_TIMEOUT || o->kind == SBX__ATT_TRANSPORT) {
    if (deadline_passed(f)) { fail(f, f->check ? SBX_FETCH_E_CHECK_TIMEOUT : SBX_FETCH_E_TIMEOUT); return; }
    if (o->fallback) { f->ci++; attempt_next(f); return; }
  }
  if (o->kind == SBX__ATT_DECLARED_TOO_LARGE) {
    sbx_fetch_error_t e;
    n = sbx__attempt_fields(o, h, RESULT_FIELDS, &mem);
    memset(&e, 0, sizeof e);
    e.code = SBX_FETCH_E_DECLARED;
    e.name = sbx_fetch_error_name(e.code);
    e.message = sbx_fetch_strerror(e.code);
    e.status = (int)o->status;
    e.headers = h;
    e.nheaders = n > 0 ? (size_t)n : 0;
    finish(f, NULL, &e);
    free(mem);
    return;
  }
  switch (o->kind) {
    case SBX__ATT_PIN:
      fail_full(f, SBX_FETCH_E_TRANSPORT, "Connection did not reach the pinned address", NULL, 0, 0);
      return;
    case SBX__ATT_BAD_STATUS:
      fail_full(f, SBX_FETCH_E_TRANSPORT, "Invalid HTTP response", NULL, 0, 0);
      return;
    case SBX__ATT_NOMEM:
      fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0);
      return;
    case SBX__ATT_TRANSPORT:
      fail_full(f, SBX_FETCH_E_TRANSPORT, o->message != NULL ? o->message : "transport failure",
                o->err != 0 ? sbx__errno_name(o->err) : NULL, 1, 0);
      return;
    default:
      fail(f, attempt_code(o->kind));
  }
}

/* Tries the vetted address at f->ci (1.10). */
static void attempt_next(sbx_fetch_t *f) {
  sbx_fetch_header_t hs[MAX_LINES];
  size_t nh, i;
  uint64_t left;
  const cand_t *c;
  if (f->ci >= f->ncands) { fail(f, SBX_FETCH_E_UNREACHABLE); return; }
  c = &f->cands[f->ci];
  uv_update_time(f->loop);
  left = f->deadline > uv_now(f->loop) ? f->deadline - uv_now(f->loop) : 1;
  if (left > SBX_FETCH_MAX_TIMEOUT_MS) left = SBX_FETCH_MAX_TIMEOUT_MS;
  nh = hop_headers(f, hs);
  if (f->transport != NULL) {
    sbx_fetch_attempt_info info;
    sbx_fetch_reply_t *r = seam_reply(f, R_TRANSPORT);
    if (r == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    memset(&info, 0, sizeof info);
    info.url = f->cur->href;
    info.url_len = f->cur->href_len;
    info.address = c->text;
    info.address_len = c->len;
    info.family = c->family;
    info.port = f->cur->port;
    info.max_bytes = f->max_bytes;
    info.headers = hs;
    info.nheaders = nh;
    info.time_left_ms = left;
    info.idle_timeout_ms = f->idle_ms;
    info.cainfo = f->cainfo;
    f->transport(f->seam_ud, &info, r);
    return;
  } else {
    char line_mem[MAX_LINES * 64], *heap = NULL, *p;
    const char *lines[MAX_LINES];
    size_t total = 0;
    const char *err = NULL;
    sbx__attempt_params_t ap;
    for (i = 0; i < nh; i++) total += hs[i].name_len + hs[i].value_len + 3;
    p = line_mem;
    if (total > sizeof line_mem) {
      heap = malloc(total);
      if (heap == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
      p = heap;
    }
    for (i = 0; i < nh; i++) {
      lines[i] = p;
      memcpy(p, hs[i].name, hs[i].name_len);
      p += hs[i].name_len;
      *p++ = ':';
      *p++ = ' ';
      memcpy(p, hs[i].value, hs[i].value_len);
      p += hs[i].value_len;
      *p++ = '\0';
    }
    memset(&ap, 0, sizeof ap);
    ap.url = f->cur->href;
    ap.family = c->family == 4 ? AF_INET : AF_INET6;
    memcpy(ap.addr, c->addr, 16);
    ap.port = f->cur->port;
    if (f->test_family != 0) {                     /* the trusted test override */
      ap.family = f->test_family;
      memcpy(ap.addr, f->test_addr, 16);
      ap.port = f->test_port;
    }
    ap.lines = lines;
    ap.nlines = nh;
    ap.max_bytes = f->max_bytes;
    ap.timeout_ms = (long)left;
    ap.connect_ms = SBX_FETCH_CONNECT_TIMEOUT_MS;
    ap.idle_ms = f->idle_ms;
    ap.cainfo = f->cainfo;
    f->att = sbx__attempt_start(NULL, f->loop, &ap, on_attempt, f, &err);
    free(heap);
    if (f->att == NULL) fail_full(f, SBX_FETCH_E_TRANSPORT, err != NULL ? err : "transport failure", NULL, 0, 0);
  }
}

/* Every candidate strict, of its declared family, public and not the host's
 * own (1.7); then the attempts, or (check) the canonical URL. */
static void vet_finish(sbx_fetch_t *f) {
  size_t i;
  for (i = 0; i < f->ncands; i++) {
    cand_t *c = &f->cands[i];
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (c->family != 4 && c->family != 6) { fail(f, SBX_FETCH_E_NON_PUBLIC); return; }
    if (sbx_addr_parse(c->text, c->len, f->cur->port, &ss, &sl) != 0 ||
        ss.ss_family != (c->family == 4 ? AF_INET : AF_INET6) ||
        !sbx_addr_vet((struct sockaddr *)&ss, sl, f->locals, NULL)) {
      fail(f, SBX_FETCH_E_NON_PUBLIC);
      return;
    }
    memset(c->addr, 0, 16);
    if (ss.ss_family == AF_INET) memcpy(c->addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    else memcpy(c->addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
  }
  if (f->check) {
    sbx_fetch_result_t *res = sbx__result_new(f->cur->href, f->cur->href_len, 0, NULL, 0, NULL, 0,
                                              NULL, 0);
    if (res == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    finish(f, res, NULL);
    return;
  }
  f->ci = 0;
  attempt_next(f);
}

static int locals_alloc(sbx_fetch_t *f) {
  if (f->locals == NULL) f->locals = malloc(sizeof *f->locals);
  return f->locals != NULL ? 0 : -1;
}

/* The answers are in: the host's own addresses next. */
static void vet_begin(sbx_fetch_t *f) {
  if (f->ncands == 0) { fail(f, SBX_FETCH_E_NON_PUBLIC); return; }
  if (locals_alloc(f) != 0) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
  if (f->local_addresses != NULL) {
    sbx_fetch_reply_t *r = seam_reply(f, R_LOCAL);
    if (r == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    f->local_addresses(f->seam_ud, r);
    return;
  }
  if (sbx_local_addrs_load(f->locals) != 0) { fail(f, SBX_FETCH_E_NON_PUBLIC); return; }
  vet_finish(f);
}

static int cands_alloc(sbx_fetch_t *f, size_t n) {
  free(f->cands);
  f->cands = calloc(n > 0 ? n : 1, sizeof *f->cands);
  f->ncands = 0;
  return f->cands != NULL ? 0 : -1;
}

static void cand_add(sbx_fetch_t *f, const char *text, size_t len, int family) {
  cand_t *c = &f->cands[f->ncands++];
  if (text == NULL || len >= CAND_TEXT_MAX || memchr(text, '\0', len) != NULL) {
    c->family = 0;                                 /* malformed */
    return;
  }
  memcpy(c->text, text, len);
  c->text[len] = '\0';
  c->len = len;
  c->family = family;
}

static const char *gai_text(int status) {
  if (status == UV_ECANCELED) return "lookup cancelled";
  return gai_strerror(status == UV_EAI_NONAME ? EAI_NONAME : status == UV_EAI_AGAIN ? EAI_AGAIN :
                      status == UV_EAI_FAIL ? EAI_FAIL : status == UV_EAI_NODATA ? EAI_NODATA :
                      status == UV_EAI_MEMORY ? EAI_MEMORY : status == UV_EAI_FAMILY ? EAI_FAMILY :
                      EAI_FAIL);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai) {
  lookup_t *lk = req->data;
  sbx_fetch_t *f = lk->f;
  const struct addrinfo *it;
  size_t n = 0;
  free(lk);
  if (f == NULL) { if (ai != NULL) uv_freeaddrinfo(ai); return; }   /* abandoned */
  f->lk = NULL;
  if (status < 0) { fail_full(f, SBX_FETCH_E_RESOLVE, gai_text(status), NULL, 0, 0); return; }
  for (it = ai; it != NULL; it = it->ai_next) n++;
  if (n > SBX_FETCH_MAX_ANSWERS || cands_alloc(f, n) != 0) {
    uv_freeaddrinfo(ai);
    if (n > SBX_FETCH_MAX_ANSWERS) fail(f, SBX_FETCH_E_NON_PUBLIC);
    else fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0);
    return;
  }
  for (it = ai; it != NULL; it = it->ai_next) {
    char text[INET6_ADDRSTRLEN];
    int fam = 0;
    if (it->ai_family == AF_INET && it->ai_addrlen == sizeof(struct sockaddr_in) && it->ai_addr != NULL &&
        inet_ntop(AF_INET, &((struct sockaddr_in *)it->ai_addr)->sin_addr, text, sizeof text) != NULL)
      fam = 4;
    else if (it->ai_family == AF_INET6 && it->ai_addrlen == sizeof(struct sockaddr_in6) &&
             it->ai_addr != NULL && ((struct sockaddr_in6 *)it->ai_addr)->sin6_scope_id == 0 &&
             inet_ntop(AF_INET6, &((struct sockaddr_in6 *)it->ai_addr)->sin6_addr, text, sizeof text) != NULL)
      fam = 6;
    cand_add(f, fam != 0 ? text : NULL, fam != 0 ? strlen(text) : 0, fam);
  }
  uv_freeaddrinfo(ai);
  vet_begin(f);
}

/* A hop starts: one lookup (or the literal), 1.7. */
static void hop_begin(sbx_fetch_t *f) {
  const sbx_url_t *u = f->cur;
  if (u->host_kind == SBX_HOST_IPV4 || u->host_kind == SBX_HOST_IPV6) {
    if (cands_alloc(f, 1) != 0) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    cand_add(f, u->host, u->host_len, u->host_kind == SBX_HOST_IPV4 ? 4 : 6);
    vet_begin(f);
    return;
  }
  if (f->resolve != NULL) {
    sbx_fetch_reply_t *r = seam_reply(f, R_RESOLVE);
    if (r == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    f->resolve(f->seam_ud, u->host, u->host_len, r);
    return;
  }
  {
    struct addrinfo hints;
    int rc;
    lookup_t *lk = calloc(1, sizeof *lk);
    if (lk == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "out of memory", NULL, 0, 0); return; }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    lk->f = f;
    lk->req.data = lk;
    f->lk = lk;
    rc = uv_getaddrinfo(f->loop, &lk->req, on_resolved, u->host, NULL, &hints);
    if (rc != 0) {
      f->lk = NULL;
      free(lk);
      fail_full(f, SBX_FETCH_E_RESOLVE, uv_strerror(rc), NULL, 0, 0);
    }
  }
}

/* A seam's answer, on the loop. */
static void reply_process(sbx_fetch_t *f, sbx_fetch_reply_t *r) {
  size_t i;
  switch (r->kind) {
    case R_RESOLVE:
      if (r->failed) {
        fail_full(f, SBX_FETCH_E_RESOLVE, r->message != NULL ? r->message : "lookup failed", NULL, 0, 1);
        return;
      }
      if (r->res != NULL || r->naddrs > SBX_FETCH_MAX_ANSWERS || cands_alloc(f, r->naddrs) != 0) {
        fail(f, SBX_FETCH_E_NON_PUBLIC);
        return;
      }
      for (i = 0; i < r->naddrs; i++) cand_add(f, r->addrs[i].text, r->addrs[i].len, r->addrs[i].family);
      vet_begin(f);
      return;
    case R_LOCAL: {
      const char *texts[64] = {0}, **tp = texts;
      size_t lens[64] = {0}, *lp = lens;
      int rc = 0;
      if (r->failed) {
        fail_full(f, SBX_FETCH_E_TRANSPORT, r->message != NULL ? r->message : "localAddresses failed",
                  r->errno_name[0] ? r->errno_name : NULL, r->after_response, 1);
        return;
      }
      if (r->res != NULL) { fail(f, SBX_FETCH_E_NON_PUBLIC); return; }
      if (r->naddrs > 64) {
        tp = malloc(r->naddrs * sizeof *tp);
        lp = malloc(r->naddrs * sizeof *lp);
        if (tp == NULL || lp == NULL) rc = -1;
      }
      for (i = 0; rc == 0 && i < r->naddrs; i++) {
        if (r->addrs[i].text == NULL) rc = -1;
        tp[i] = r->addrs[i].text;
        lp[i] = r->addrs[i].len;
      }
      if (rc == 0) rc = sbx_local_addrs_from_texts(tp, lp, r->naddrs, f->locals);
      if (tp != texts) free((void *)tp);
      if (lp != lens) free(lp);
      if (rc != 0) { fail(f, SBX_FETCH_E_NON_PUBLIC); return; }
      vet_finish(f);
      return;
    }
    default: {                                     /* R_TRANSPORT */
      sbx_fetch_result_t *res = r->res;
      if (r->failed) {
        const char *e = r->errno_name[0] ? r->errno_name : NULL;
        if (!r->after_response && sbx__errno_is_fallback(r->err)) {
          /* a connect deadline clipped to the time left ends the call */
          if (deadline_passed(f)) { fail(f, f->check ? SBX_FETCH_E_CHECK_TIMEOUT : SBX_FETCH_E_TIMEOUT); return; }
          f->ci++;
          attempt_next(f);
          return;
        }
        fail_full(f, SBX_FETCH_E_TRANSPORT, r->message != NULL ? r->message : "transport failure", e,
                  r->after_response, 1);
        return;
      }
      if (res == NULL) { fail_full(f, SBX_FETCH_E_TRANSPORT, "transport returned no result", NULL, 0, 0); return; }
      r->res = NULL;
      hop_result(f, res);
    }
  }
}

static void on_step(uv_timer_t *t) {
  sbx_fetch_t *f = t->data;
  sbx_fetch_reply_t *r = f->reply;
  if (f->finished) return;
  if (!f->started) {
    f->started = 1;
    hop_begin(f);
    return;
  }
  if (r != NULL && r->answered) {
    f->reply = NULL;
    reply_process(f, r);
    reply_unref(r);
  }
}

/* ---- starting ------------------------------------------------------------------ */

static sbx_fetch_t *start(uv_loop_t *loop, const char *url, size_t len, const sbx_fetch_opts *o,
                          sbx_fetch_done_cb done, void *ud, int *err, int check) {
  sbx_fetch_t *f;
  int rc;
  double timeout;
  *err = sbx_fetch_opts_check(o, check);
  if (*err != 0) return NULL;
  if (url == NULL) { *err = SBX_FETCH_E_URL; return NULL; }
  *err = SBX_FETCH_E_TRANSPORT;                    /* out of memory below */
  f = calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  if (!check && o->test_connect_address != NULL) {
    if (o->test_connect_port == 0) { *err = SBX_FETCH_E_BOUNDS; goto fail; }
    if (inet_pton(AF_INET, o->test_connect_address, f->test_addr) == 1) f->test_family = AF_INET;
    else if (inet_pton(AF_INET6, o->test_connect_address, f->test_addr) == 1) f->test_family = AF_INET6;
    else { *err = SBX_FETCH_E_BOUNDS; goto fail; }
    f->test_port = o->test_connect_port;
  }
  f->cur = malloc(sizeof *f->cur);
  f->next = malloc(sizeof *f->next);
  if (f->cur == NULL || f->next == NULL) goto fail;
  rc = sbx_url_admit(url, len, f->cur, NULL);
  if (rc != SBX_URL_OK) { *err = url_code(rc); goto fail; }
  if (!check && copy_caller(f, o) != 0) goto fail;
  if (!check && o->cainfo != NULL && (f->cainfo = strdup(o->cainfo)) == NULL) goto fail;
  f->loop = loop;
  f->done = done;
  f->ud = ud;
  f->check = check;
  f->max_bytes = SBX_FETCH_MAX_BYTES;
  if (!check) {                                    /* checked above */
    f->max_bytes = (size_t)o->max_bytes;
    f->idle_ms = (uint64_t)o->idle_timeout_ms;
    f->max_redirects = (int)o->max_redirects;
    f->follow = o->follow_redirects;
  }
  f->resolve = o->resolve;
  f->transport = check ? NULL : o->transport;
  f->local_addresses = o->local_addresses;
  f->seam_ud = o->seam_ud;
  f->first_https = f->any_https = f->cur->https;
  memcpy(f->first_host, f->cur->host, f->cur->host_len + 1);
  f->first_port = f->cur->port;
  timeout = check ? o->check_timeout_ms : o->timeout_ms;
  uv_update_time(loop);
  f->deadline = uv_now(loop) + (uint64_t)timeout;
  uv_timer_init(loop, &f->timer);
  uv_timer_init(loop, &f->step);
  f->timer.data = f;
  f->step.data = f;
  uv_timer_start(&f->timer, on_deadline, (uint64_t)timeout, 0);
  uv_timer_start(&f->step, on_step, 0, 0);        /* the first hop, from the loop */
  *err = 0;
  return f;
fail:
  free(f->cur);
  free(f->next);
  free(f->caller_mem);
  free(f->cainfo);
  free(f);
  return NULL;
}

sbx_fetch_t *sbx_fetch_start(uv_loop_t *loop, const char *url, size_t len,
                             const sbx_fetch_opts *opts, sbx_fetch_done_cb done_cb,
                             void *ud, int *err) {
  int e;
  if (err == NULL) err = &e;
  return start(loop, url, len, opts, done_cb, ud, err, 0);
}

sbx_fetch_t *sbx_assert_public_url_start(uv_loop_t *loop, const char *url, size_t len,
                                         const sbx_fetch_opts *opts,
                                         sbx_fetch_done_cb done_cb, void *ud, int *err) {
  int e;
  if (err == NULL) err = &e;
  return start(loop, url, len, opts, done_cb, ud, err, 1);
}
