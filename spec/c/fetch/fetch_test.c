/*
 * fetch_test.c: the C driver of core/sbx_fetch.h (safe fetch's C API).
 *
 * Drives sbx_fetch_start / sbx_assert_public_url_start on a libuv loop
 * against a loopback HTTP server this program runs on the same loop. Names
 * never reach DNS: a resolve seam answers a public address as data, the
 * local_addresses seam answers an empty list (or the real getifaddrs runs),
 * and the trusted test_connect_address override sends the real pinned
 * transport to 127.0.0.1:<port>. Nothing leaves loopback.
 *
 * Prints "ok   <case>" / "FAIL <case>: <why>" per case and, last,
 * "fetch: N passed, M failed". Exit status 0 only when nothing failed and the
 * loop closed with no handle left (ASan checks leaks at exit).
 *
 * Usage: fetch_test [CASE...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include "fetch_internal.h"
#include "runner.h"
#include "sbx_fetch.h"

static uv_loop_t loop;
static int port;

/* ---- the loopback server ------------------------------------------------ */

typedef struct {
  uv_tcp_t tcp;
  char buf[8192];
  size_t len;
  int replied;
} conn_t;

static uv_tcp_t server;
static int requests;

static void conn_closed(uv_handle_t *h) { free(h->data); }

static void written(uv_write_t *w, int status) {
  conn_t *c = w->data;
  (void)status;
  free(w);
  if (c->replied == 1) uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void reply(conn_t *c, const char *text, int close_after) {
  uv_write_t *w = malloc(sizeof *w);
  uv_buf_t b = uv_buf_init((char *)text, (unsigned)strlen(text));
  c->replied = close_after ? 1 : 2;
  w->data = c;
  uv_write(w, (uv_stream_t *)&c->tcp, &b, 1, written);
}

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *b) {
  conn_t *c = h->data;
  (void)want;
  *b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof c->buf - 1 - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  conn_t *c = s->data;
  (void)b;
  if (n < 0) {
    if (!uv_is_closing((uv_handle_t *)s)) uv_close((uv_handle_t *)s, conn_closed);
    return;
  }
  c->len += (size_t)n;
  c->buf[c->len] = '\0';
  if (c->replied || strstr(c->buf, "\r\n\r\n") == NULL) return;
  requests++;
  if (strncmp(c->buf, "GET /ok ", 8) == 0)
    reply(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
             "Content-Length: 5\r\nConnection: close\r\n\r\nhello", 1);
  else if (strncmp(c->buf, "GET /r1 ", 8) == 0)
    reply(c, "HTTP/1.1 302 Found\r\nLocation: /r2\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 1);
  else if (strncmp(c->buf, "GET /r2 ", 8) == 0)
    reply(c, "HTTP/1.1 301 Moved\r\nLocation: http://next.example:0/x\r\nContent-Length: 0\r\n\r\n", 1);
  else if (strncmp(c->buf, "GET /r3 ", 8) == 0)
    reply(c, "HTTP/1.1 307 Temporary\r\nLocation: /ok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 1);
  else if (strncmp(c->buf, "GET /big ", 9) == 0)
    reply(c, "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n", 1);
  else if (strncmp(c->buf, "GET /stall ", 11) == 0)
    reply(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart", 0);   /* then silence */
  else
    reply(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 1);
}

static void on_conn(uv_stream_t *s, int status) {
  conn_t *c;
  if (status < 0) return;
  c = calloc(1, sizeof *c);
  uv_tcp_init(&loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(s, (uv_stream_t *)&c->tcp) != 0) { uv_close((uv_handle_t *)&c->tcp, conn_closed); return; }
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static int server_start(void) {
  struct sockaddr_in a;
  struct sockaddr_storage got;
  int len = sizeof got;
  uv_tcp_init(&loop, &server);
  uv_ip4_addr("127.0.0.1", 0, &a);
  if (uv_tcp_bind(&server, (struct sockaddr *)&a, 0) != 0) return -1;
  if (uv_listen((uv_stream_t *)&server, 16, on_conn) != 0) return -1;
  uv_tcp_getsockname(&server, (struct sockaddr *)&got, &len);
  port = ntohs(((struct sockaddr_in *)&got)->sin_port);
  return 0;
}

/* Closes every connection the server still holds (a stalled one). */
static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (h != (uv_handle_t *)&server && h->type == UV_TCP && !uv_is_closing(h))
    uv_close(h, conn_closed);
}

/* ---- seams ---------------------------------------------------------------- */

typedef struct {
  int lookups, transports, locals;
  const char *answer;              /* NULL: never answer (keep the reply) */
  sbx_fetch_reply_t *held;
  int refuse_first;                /* transport seam: ECONNREFUSED on the first address */
} seams_t;

static void seam_resolve(void *ud, const char *host, size_t len, sbx_fetch_reply_t *r) {
  seams_t *s = ud;
  sbx_fetch_address_t a[2] = {{"93.184.216.34", 13, 4}, {"93.184.216.35", 13, 4}};
  (void)host; (void)len;
  s->lookups++;
  if (s->answer == NULL) { s->held = r; return; }
  sbx_fetch_reply_addresses(r, a, 2);             /* at once, from inside the seam */
}

static void seam_local(void *ud, sbx_fetch_reply_t *r) {
  seams_t *s = ud;
  s->locals++;
  sbx_fetch_reply_addresses(r, NULL, 0);
}

static void seam_transport(void *ud, const sbx_fetch_attempt_info *in, sbx_fetch_reply_t *r) {
  seams_t *s = ud;
  sbx_fetch_header_t h = {"content-type", 12, "text/plain", 10};
  s->transports++;
  if (s->refuse_first && strcmp(in->address, "93.184.216.34") == 0) {
    sbx_fetch_reply_fail(r, "ECONNREFUSED", 0, "Connection refused");
    return;
  }
  sbx_fetch_reply_result(r, sbx_fetch_result_new(in->url, in->url_len, 200, "OK", 2, &h, 1, "seam", 4));
}

/* ---- running one call ---------------------------------------------------- */

typedef struct {
  int done;
  sbx_fetch_result_t *res;
  int code;
  char message[256];
  int status;
  char header[64];                 /* ResponseTooLarge: its content-length */
} outcome_t;

static void on_done(sbx_fetch_t *f, sbx_fetch_result_t *res, const sbx_fetch_error_t *err, void *ud) {
  outcome_t *o = ud;
  size_t i;
  (void)f;
  o->done++;
  o->res = res;
  if (err != NULL) {
    o->code = err->code;
    snprintf(o->message, sizeof o->message, "%s", err->message);
    o->status = err->status;
    for (i = 0; i < err->nheaders; i++)
      if (strcmp(err->headers[i].name, "content-length") == 0)
        snprintf(o->header, sizeof o->header, "%s", err->headers[i].value);
  }
}

static void base_opts(sbx_fetch_opts *o, seams_t *s) {
  sbx_fetch_opts_init(o);
  o->resolve = seam_resolve;
  o->local_addresses = seam_local;
  o->seam_ud = s;
  o->test_connect_address = "127.0.0.1";
  o->test_connect_port = (uint16_t)port;
}

static void run_until(outcome_t *o) {
  while (!o->done) uv_run(&loop, UV_RUN_ONCE);
}

static void turn_done(uv_timer_t *t) { (void)t; }

/* Lets the loop turn for ms (the loopback server keeps it alive). */
static void turn_for(uint64_t ms) {
  uv_timer_t t;
  uv_timer_init(&loop, &t);
  uv_timer_start(&t, turn_done, ms, 0);
  while (uv_is_active((uv_handle_t *)&t)) uv_run(&loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);                /* its close callback */
}

static sbx_fetch_t *fetch(const char *url, const sbx_fetch_opts *opts, outcome_t *o, int *err) {
  memset(o, 0, sizeof *o);
  return sbx_fetch_start(&loop, url, strlen(url), opts, on_done, o, err);
}

static const sbx_fetch_header_t *find(const sbx_fetch_result_t *r, const char *name) {
  size_t i;
  for (i = 0; i < r->nheaders; i++)
    if (strcmp(r->headers[i].name, name) == 0) return &r->headers[i];
  return NULL;
}

/* ---- cases ---------------------------------------------------------------- */

static int t_ok_body(void) {
  seams_t s = {0, 0, 0, "a", NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  char url[128];
  const sbx_fetch_header_t *h;
  base_opts(&o, &s);
  snprintf(url, sizeof url, "HTTP://Ok.Example:%d/a/../ok#frag", port);
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  CHECK(out.done == 0, "done_cb ran inside sbx_fetch_start");
  run_until(&out);
  CHECK(out.res != NULL, "error %d %s", out.code, out.message);
  CHECK(out.res->status == 200 && out.res->body_len == 5 && memcmp(out.res->body, "hello", 5) == 0,
        "status %d body %zu", out.res->status, out.res->body_len);
  snprintf(url, sizeof url, "http://ok.example:%d/ok", port);
  CHECK(strcmp(out.res->url, url) == 0, "url %s", out.res->url);
  CHECK(out.res->status_text != NULL && strcmp(out.res->status_text, "OK") == 0, "status text");
  h = find(out.res, "set-cookie");
  CHECK(h != NULL && strcmp(h->value, "a=1, b=2") == 0, "set-cookie not joined: %s", h ? h->value : "NULL");
  CHECK(s.lookups == 1 && s.locals == 1, "lookups %d locals %d", s.lookups, s.locals);
  sbx_fetch_result_free(out.res);
  /* the real getifaddrs list: 93.184.216.34 is not one of ours */
  o.local_addresses = NULL;
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res != NULL && out.res->status == 200, "with getifaddrs: %d %s", out.code, out.message);
  sbx_fetch_result_free(out.res);
  return 0;
}

static int t_redirect_chain(void) {
  seams_t s = {0, 0, 0, "a", NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  char url[128];
  base_opts(&o, &s);
  snprintf(url, sizeof url, "http://start.example:%d/r3", port);
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res != NULL && out.res->status == 200, "error %d %s", out.code, out.message);
  CHECK(s.lookups == 2, "one lookup per hop: %d", s.lookups);
  snprintf(url, sizeof url, "http://start.example:%d/ok", port);
  CHECK(strcmp(out.res->url, url) == 0, "url %s", out.res->url);
  sbx_fetch_result_free(out.res);
  /* /r1 -> /r2 -> a target with port 0: the admission message */
  snprintf(url, sizeof url, "http://start.example:%d/r1", port);
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res == NULL && out.code == SBX_FETCH_E_PORT0, "got %d %s", out.code, out.message);
  /* max_redirects = 0 refuses the first */
  o.max_redirects = 0;
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.code == SBX_FETCH_E_REDIRECTS && strcmp(out.message, "Too many redirects") == 0,
        "got %d %s", out.code, out.message);
  /* follow_redirects = 0 hands the redirect back */
  o.max_redirects = 5;
  o.follow_redirects = 0;
  CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res != NULL && out.res->status == 302 && out.res->body_len == 0 &&
        find(out.res, "location") != NULL, "no redirect result");
  sbx_fetch_result_free(out.res);
  return 0;
}

static int t_bound_refusals(void) {
  seams_t s = {0, 0, 0, "a", NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  sbx_fetch_header_t bad_hdr[] = {{"Host", 4, "evil", 4}};
  sbx_fetch_header_t crlf[] = {{"x-ok", 4, "a\r\nb: 1", 8}};
  sbx_fetch_header_t dup[] = {{"X-A", 3, "1", 1}, {"x-a", 3, "2", 1}};
  double bad[] = {0, -1, 1.5, NAN, INFINITY, 33554433};
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    base_opts(&o, &s);
    o.max_bytes = bad[i];
    CHECK(fetch("file:///not-parsed", &o, &out, &err) == NULL && err == SBX_FETCH_E_BOUNDS,
          "max_bytes %g: err %d", bad[i], err);
  }
  base_opts(&o, &s);
  o.timeout_ms = 120001;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_BOUNDS, "timeout");
  base_opts(&o, &s);
  o.max_redirects = 11;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_BOUNDS, "redirects");
  base_opts(&o, &s);
  o.follow_redirects = 2;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_BOUNDS, "follow");
  base_opts(&o, &s);
  o.headers = bad_hdr;
  o.nheaders = 1;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_HEADERS, "host header");
  o.headers = crlf;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_HEADERS, "crlf header");
  o.headers = dup;
  o.nheaders = 2;
  CHECK(fetch("http://x.example/", &o, &out, &err) == NULL && err == SBX_FETCH_E_HEADERS, "dup header");
  base_opts(&o, &s);
  CHECK(fetch("/etc/hosts", &o, &out, &err) == NULL && err == SBX_FETCH_E_URL, "url");
  CHECK(fetch("file:///etc/passwd", &o, &out, &err) == NULL && err == SBX_FETCH_E_CREDENTIALS, "scheme");
  CHECK(fetch("http://x.example:0/", &o, &out, &err) == NULL && err == SBX_FETCH_E_PORT0, "port 0");
  CHECK(strcmp(sbx_fetch_strerror(SBX_FETCH_E_BOUNDS), "Invalid fetch bounds") == 0 &&
        strcmp(sbx_fetch_strerror(SBX_FETCH_E_PORT0), "Port 0 is not allowed") == 0 &&
        strcmp(sbx_fetch_error_name(SBX_FETCH_E_DECLARED), "ResponseTooLargeError") == 0,
        "catalogue");
  CHECK(s.lookups == 0, "a refusal looked something up");
  /* a declared length over the cap: ResponseTooLargeError with its headers */
  base_opts(&o, &s);
  o.max_bytes = 1000;
  {
    char url[128];
    snprintf(url, sizeof url, "http://big.example:%d/big", port);
    CHECK(fetch(url, &o, &out, &err) != NULL, "start refused: %d", err);
    run_until(&out);
    CHECK(out.code == SBX_FETCH_E_DECLARED && out.status == 200 && strcmp(out.header, "5000") == 0,
          "got %d %s status %d length %s", out.code, out.message, out.status, out.header);
  }
  return 0;
}

typedef struct { sbx_fetch_t *f; int requests_at_start; } cancel_ctx_t;

static void cancel_tick(uv_timer_t *t) {
  cancel_ctx_t *c = t->data;
  if (requests > c->requests_at_start) {         /* the server has the request: mid-transfer */
    sbx_fetch_cancel(c->f);
    uv_close((uv_handle_t *)t, NULL);
  }
}

static int t_cancel_mid_transfer(void) {
  seams_t s = {0, 0, 0, "a", NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  char url[128];
  uv_timer_t t;
  cancel_ctx_t c;
  base_opts(&o, &s);
  snprintf(url, sizeof url, "http://stall.example:%d/stall", port);
  c.requests_at_start = requests;
  c.f = fetch(url, &o, &out, &err);
  CHECK(c.f != NULL, "start refused: %d", err);
  uv_timer_init(&loop, &t);
  t.data = &c;
  uv_timer_start(&t, cancel_tick, 5, 5);
  run_until(&out);
  CHECK(out.done == 1 && out.code == SBX_FETCH_E_ABORTED, "got %d %s", out.code, out.message);
  uv_run(&loop, UV_RUN_NOWAIT);
  /* cancel during a seam that never answers, then a late answer is discarded */
  s.answer = NULL;
  c.f = fetch(url, &o, &out, &err);
  CHECK(c.f != NULL, "start refused: %d", err);
  while (s.held == NULL) uv_run(&loop, UV_RUN_NOWAIT);   /* the seam runs in the timer phase */
  sbx_fetch_cancel(c.f);
  CHECK(out.done == 1 && out.code == SBX_FETCH_E_ABORTED, "mid-seam cancel: %d", out.code);
  CHECK(sbx_fetch_reply_addresses(s.held, NULL, 0) == 1, "late answer not discarded");
  s.held = NULL;
  return 0;
}

static int t_deadline(void) {
  seams_t s = {0, 0, 0, NULL, NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  uint64_t t0;
  base_opts(&o, &s);
  o.timeout_ms = 30;
  t0 = uv_hrtime();
  CHECK(fetch("http://slow.example/", &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.code == SBX_FETCH_E_TIMEOUT && strcmp(out.message, "Fetch deadline exceeded") == 0,
        "got %d %s", out.code, out.message);
  CHECK(uv_hrtime() - t0 < 1000000000ull, "not on time");
  CHECK(s.held != NULL, "resolver not asked");
  sbx_fetch_reply_release(s.held);               /* a seam that never answers gives it up */
  return 0;
}

static int t_transport_seam_fallback(void) {
  seams_t s = {0, 0, 0, "a", NULL, 1};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  base_opts(&o, &s);
  o.transport = seam_transport;
  CHECK(fetch("http://seam.example/x", &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res != NULL && out.res->body_len == 4 && memcmp(out.res->body, "seam", 4) == 0,
        "got %d %s", out.code, out.message);
  CHECK(s.transports == 2 && s.lookups == 1, "transports %d lookups %d", s.transports, s.lookups);
  sbx_fetch_result_free(out.res);
  return 0;
}

static int t_assert_public_url(void) {
  seams_t s = {0, 0, 0, "a", NULL, 0};
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  base_opts(&o, &s);
  memset(&out, 0, sizeof out);
  CHECK(sbx_assert_public_url_start(&loop, "http://127.0.0.1/", 17, &o, on_done, &out, &err) != NULL,
        "start refused: %d", err);
  run_until(&out);
  CHECK(out.code == SBX_FETCH_E_NON_PUBLIC && strcmp(out.message, "URL resolves to a non-public address") == 0,
        "got %d %s", out.code, out.message);
  CHECK(s.lookups == 0, "a literal was looked up");
  memset(&out, 0, sizeof out);
  CHECK(sbx_assert_public_url_start(&loop, "http://0x7f.1/", 14, &o, on_done, &out, &err) != NULL,
        "start refused: %d", err);
  run_until(&out);
  CHECK(out.code == SBX_FETCH_E_NON_PUBLIC, "encoded loopback: %d", out.code);
  memset(&out, 0, sizeof out);
  CHECK(sbx_assert_public_url_start(&loop, "HTTP://Example.ORG:80/a/../b?q=1#f", 34, &o, on_done, &out,
                                    &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.res != NULL && strcmp(out.res->url, "http://example.org/b?q=1") == 0, "got %d %s",
        out.code, out.message);
  sbx_fetch_result_free(out.res);
  o.check_timeout_ms = 0;
  CHECK(sbx_assert_public_url_start(&loop, "http://x.example/", 17, &o, on_done, &out, &err) == NULL &&
        err == SBX_FETCH_E_BOUNDS, "check bounds");
  return 0;
}

static uv_sem_t pool_gate;
static void pool_blocked(uv_work_t *w) { (void)w; uv_sem_wait(&pool_gate); }
static void pool_released(uv_work_t *w, int status) { (void)w; (void)status; }

/* The default resolver (getaddrinfo on the thread pool) for a name in
 * /etc/hosts (no DNS): its loopback answers are vetted and refused. Then a
 * call cancelled while its lookup is queued abandons it: the pool's one
 * thread (main sets UV_THREADPOOL_SIZE=1) is held by a blocked work item, so
 * the lookup cannot answer before the cancel; done_cb says ABORTED once, the
 * late answer is dropped, and nothing leaks (ASan checks the lookup block is
 * freed at exit). */
static int t_system_resolver(void) {
  sbx_fetch_opts o;
  outcome_t out;
  int err = 0;
  sbx_fetch_t *f;
  uv_work_t blocker;
  sbx_fetch_opts_init(&o);
  CHECK(fetch("http://localhost/", &o, &out, &err) != NULL, "start refused: %d", err);
  run_until(&out);
  CHECK(out.code == SBX_FETCH_E_NON_PUBLIC, "localhost: got %d %s", out.code, out.message);
  CHECK(uv_sem_init(&pool_gate, 0) == 0, "semaphore");
  CHECK(uv_queue_work(&loop, &blocker, pool_blocked, pool_released) == 0, "queue the blocker");
  f = fetch("http://localhost/", &o, &out, &err);
  if (f == NULL) uv_sem_post(&pool_gate);
  CHECK(f != NULL, "start refused: %d", err);
  uv_run(&loop, UV_RUN_NOWAIT);                /* the kick: the lookup is queued */
  err = out.done;
  sbx_fetch_cancel(f);
  uv_sem_post(&pool_gate);
  turn_for(200);                               /* blocker, then the abandoned answer */
  uv_sem_destroy(&pool_gate);
  CHECK(err == 0, "finished before its lookup could answer");
  CHECK(out.done == 1 && out.code == SBX_FETCH_E_ABORTED, "cancel: done %d code %d", out.done, out.code);
  return 0;
}

/* The pin checks of 1.8 (libcurl's OPENSOCKET and PREREQ callbacks) with
 * mismatches a real attempt, whose CONNECT_TO comes from the same pin, never
 * produces: another address, port, family, scope id, purpose, AF_UNIX. */
static int t_pin_checks(void) {
  sbx__pin_t v4 = {AF_INET, {0}, 8443}, v6 = {AF_INET6, {0}, 443};
  struct sockaddr_in sin;
  struct sockaddr_in6 s6;
  struct sockaddr_un sun;
  inet_pton(AF_INET, "93.184.216.34", v4.addr);
  inet_pton(AF_INET6, "2606:2800:220:1::1", v6.addr);
  memset(&sin, 0, sizeof sin);
  sin.sin_family = AF_INET;
  sin.sin_port = htons(8443);
  inet_pton(AF_INET, "93.184.216.34", &sin.sin_addr);
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_INET, (struct sockaddr *)&sin, sizeof sin) == 1, "the pinned v4 refused");
  CHECK(sbx__pin_socket_ok(&v4, 0, AF_INET, (struct sockaddr *)&sin, sizeof sin) == 0, "a non-IP purpose allowed");
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_INET, (struct sockaddr *)&sin, sizeof sin - 1) == 0, "a short length allowed");
  sin.sin_port = htons(8444);
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_INET, (struct sockaddr *)&sin, sizeof sin) == 0, "another port allowed");
  sin.sin_port = htons(8443);
  inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_INET, (struct sockaddr *)&sin, sizeof sin) == 0, "another address allowed");
  memset(&s6, 0, sizeof s6);
  s6.sin6_family = AF_INET6;
  s6.sin6_port = htons(443);
  inet_pton(AF_INET6, "2606:2800:220:1::1", &s6.sin6_addr);
  CHECK(sbx__pin_socket_ok(&v6, 1, AF_INET6, (struct sockaddr *)&s6, sizeof s6) == 1, "the pinned v6 refused");
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_INET6, (struct sockaddr *)&s6, sizeof s6) == 0, "another family allowed");
  s6.sin6_scope_id = 2;
  CHECK(sbx__pin_socket_ok(&v6, 1, AF_INET6, (struct sockaddr *)&s6, sizeof s6) == 0, "a scope id allowed");
  memset(&sun, 0, sizeof sun);
  sun.sun_family = AF_UNIX;
  CHECK(sbx__pin_socket_ok(&v4, 1, AF_UNIX, (struct sockaddr *)&sun, sizeof sun) == 0, "AF_UNIX allowed");
  CHECK(sbx__pin_peer_ok(&v4, "93.184.216.34", 8443) == 1, "the pinned peer refused");
  CHECK(sbx__pin_peer_ok(&v4, "93.184.216.35", 8443) == 0, "another peer allowed");
  CHECK(sbx__pin_peer_ok(&v4, "93.184.216.34", 443) == 0, "another peer port allowed");
  CHECK(sbx__pin_peer_ok(&v4, NULL, 8443) == 0, "no peer allowed");
  CHECK(sbx__pin_peer_ok(&v4, "::ffff:93.184.216.34", 8443) == 0, "a v6 text for a v4 pin allowed");
  CHECK(sbx__pin_peer_ok(&v6, "2606:2800:220:1:0:0:0:1", 443) == 1, "an equal v6 text refused");
  return 0;
}

/* Last: the server and every connection it still holds are closed, and the
 * loop must then close (a handle left behind is a leak). */
static int t_teardown(void) {
  int rc;
  uv_close((uv_handle_t *)&server, NULL);
  uv_walk(&loop, close_walk, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&loop);
  CHECK(rc == 0, "the loop still holds handles (%s)", uv_strerror(rc));
  return 0;
}

static const test_case CASES[] = {
  {"a 200 with its body through the pinned transport (hostname kept, repeats joined)", t_ok_body},
  {"a redirect chain, one lookup per hop; port 0 target; max_redirects 0; follow off", t_redirect_chain},
  {"invalid bounds, headers and URLs give NULL and their code; ResponseTooLarge", t_bound_refusals},
  {"cancel mid-transfer and mid-seam gives SBX_FETCH_E_ABORTED; a late answer is discarded", t_cancel_mid_transfer},
  {"a resolver that never answers ends with the whole-call deadline", t_deadline},
  {"a transport seam's ECONNREFUSED falls back to the next address", t_transport_seam_fallback},
  {"assert_public_url refuses a non-public literal and canonicalises a public URL", t_assert_public_url},
  {"the system resolver's answers are vetted; a cancel abandons its lookup in flight", t_system_resolver},
  {"the pin checks refuse another address, port, family, scope id, purpose or AF_UNIX", t_pin_checks},
  {"teardown: the loop closes with no handle left", t_teardown},
};

int main(int argc, char **argv) {
  int failed;
  setenv("UV_THREADPOOL_SIZE", "1", 1);        /* before the pool starts: t_system_resolver */
  uv_loop_init(&loop);
  if (server_start() != 0) { printf("FAIL server: cannot listen on loopback\nfetch: 0 passed, 1 failed\n"); return 1; }
  failed = run_cases("fetch", CASES, sizeof CASES / sizeof CASES[0], argv + 1, argc - 1);
  return failed == 0 ? 0 : 1;
}
