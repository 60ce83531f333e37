/*
 * ffi_bench.c: round trips through the embedding ABI (core/sbx_ffi.h).
 *
 * usage (from the repository root, as a non-root user):
 *   build/bench/ffi_bench [N]        N round trips per case (default 20000)
 *
 * The engine is the real app (spec/c/ffi/real_app.lua: sandbox{} over a Lua
 * fake driver, state in a fresh temp folder), the Lua tree is ./lua. Cases:
 *   status (sync)  sbx_engine_status: submit + engine thread + app:status()
 *                  + JSON encode + condition-variable hand-back
 *   ping (sync)    sbx_engine_call {"type":"ping"}: the no-op command
 *   ping (poll)    submit, poll(2) on sbx_engine_fd, sbx_engine_poll: what a
 *                  JS host without a thread-safe callback does
 *   ping (cb, pipelined)  N submits back to back, results by callback:
 *                  throughput, not latency
 * Prints p50/p99 latency and calls/s per case.
 */
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sbx_ffi.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void report(const char *name, uint64_t *lat, int n, uint64_t total_ns) {
  qsort(lat, (size_t)n, sizeof lat[0], cmp_u64);
  printf("%-26s p50 %7.1f us  p99 %7.1f us  %9.0f calls/s\n", name,
         lat[n / 2] / 1000.0, lat[(int)(n * 0.99)] / 1000.0, n / (total_ns / 1e9));
}

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  int64_t got;
} counter_t;

static void on_result(void *user, int64_t id, const char *json, size_t len) {
  counter_t *c = user;
  (void)json;
  (void)len;
  if (id <= 0) return;
  pthread_mutex_lock(&c->mu);
  c->got++;
  pthread_cond_signal(&c->cond);
  pthread_mutex_unlock(&c->mu);
}

static int bad(const char *what, char *r) {
  fprintf(stderr, "ffi_bench: %s failed: %s\n", what, r ? r : "NULL");
  sbx_free(r);
  return 1;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000, i, rc = 0;
  char tmpl[] = "/tmp/sbx-ffi-bench-XXXXXX", opts[512], *err = NULL, *r, cmd[128];
  const char *ping = "{\"type\":\"ping\"}";
  uint64_t *lat, t0, t1;
  sbx_engine *e;
  counter_t c;
  struct pollfd p;
  if (n < 100) n = 100;
  if (mkdtemp(tmpl) == NULL) return bad("mkdtemp", NULL);
  lat = calloc((size_t)n, sizeof *lat);
  if (lat == NULL) return bad("calloc", NULL);
  pthread_mutex_init(&c.mu, NULL);
  pthread_cond_init(&c.cond, NULL);
  c.got = 0;
  snprintf(opts, sizeof opts, "{\"luaDir\":\"lua\",\"apiKey\":\"host\",\"root\":\"%s\"}", tmpl);
  e = sbx_engine_new("spec/c/ffi/real_app.lua", opts, on_result, &c, &err);
  if (e == NULL) return bad("sbx_engine_new", err);

  /* warm up */
  for (i = 0; i < 200; i++) sbx_free(sbx_engine_status(e));

  t0 = now_ns();
  for (i = 0; i < n; i++) {
    uint64_t s = now_ns();
    r = sbx_engine_status(e);
    lat[i] = now_ns() - s;
    if (r == NULL) { rc = bad("status", r); goto out; }
    sbx_free(r);
  }
  report("status (sync)", lat, n, now_ns() - t0);

  t0 = now_ns();
  for (i = 0; i < n; i++) {
    uint64_t s = now_ns();
    r = sbx_engine_call(e, ping, strlen(ping), 5000, NULL);
    lat[i] = now_ns() - s;
    if (r == NULL) { rc = bad("ping call", r); goto out; }
    sbx_free(r);
  }
  report("ping (sync)", lat, n, now_ns() - t0);

  /* pipelined, results by callback */
  t0 = now_ns();
  for (i = 0; i < n; i++) {
    while (sbx_engine_submit(e, ping, strlen(ping)) == SBX_EBUSY) usleep(50);
  }
  pthread_mutex_lock(&c.mu);
  while (c.got < n) pthread_cond_wait(&c.cond, &c.mu);
  pthread_mutex_unlock(&c.mu);
  t1 = now_ns();
  printf("%-26s %9.0f calls/s (%d submits, results by callback)\n", "ping (cb, pipelined)", n / ((t1 - t0) / 1e9), n);
  sbx_engine_free(e);

  /* polling mode: a second engine without a callback */
  e = sbx_engine_new("spec/c/ffi/real_app.lua", opts, NULL, NULL, &err);
  if (e == NULL) return bad("sbx_engine_new (poll)", err);
  p.fd = sbx_engine_fd(e);
  p.events = POLLIN;
  t0 = now_ns();
  for (i = 0; i < n; i++) {
    uint64_t s = now_ns();
    if (sbx_engine_submit(e, ping, strlen(ping)) <= 0) { rc = bad("submit", NULL); goto out; }
    while ((r = sbx_engine_poll(e)) == NULL) {
      if (poll(&p, 1, 5000) != 1) { rc = bad("poll", NULL); goto out; }
    }
    lat[i] = now_ns() - s;
    sbx_free(r);
  }
  report("ping (poll + eventfd)", lat, n, now_ns() - t0);

out:
  sbx_engine_free(e);
  free(lat);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
  if (system(cmd) != 0) fprintf(stderr, "ffi_bench: could not remove %s\n", tmpl);
  return rc;
}
