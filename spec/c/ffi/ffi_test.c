/*
 * ffi_test.c: a C driver of the embedding ABI (core/sbx_ffi.h), linked
 * against libsbx.so (and, in the ASan variant, the sanitizer build of it).
 *
 * usage: ffi_test TESTS_DIR [NAME...]
 *   TESTS_DIR holds the config scripts (spec/c/ffi). The Lua tree is found by
 *   the library itself (next to libsbx.so, or $SBX_LUA_DIR).
 * Prints "ok   <case>" / "FAIL <case>: <why>" per case and, last,
 * "ffi: N passed, N failed". Exits 1 if any case failed.
 * Must not run as root (the runtime refuses root): run it as the service
 * account (scripts/check.sh does).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runner.h"
#include "sbx_ffi.h"

static const char *dir;

/* ---- collected outputs (callback mode) ---------------------------------- */

#define MAX_OUT 4096

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  char *items[MAX_OUT];
  int64_t ids[MAX_OUT];
  int n;
  sbx_engine *engine;        /* for the reentrancy case */
  int reentrant_code;
  int reentrant_done;
} sink_t;

static void sink_init(sink_t *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cond, NULL);
}

static void sink_free(sink_t *s) {
  int i;
  for (i = 0; i < s->n; i++) free(s->items[i]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cond);
}

/* The result callback: runs on the engine thread; copies the JSON. */
static void on_result(void *user, int64_t id, const char *json, size_t len) {
  sink_t *s = user;
  char *copy = malloc(len + 1);
  if (copy == NULL) return;
  memcpy(copy, json, len + 1);
  if (s->engine != NULL && !s->reentrant_done) {
    int32_t code = 0;
    char *r = sbx_engine_call(s->engine, "{\"type\":\"ping\"}", 15, 100, &code);
    sbx_free(r);
    s->reentrant_code = code;
    s->reentrant_done = 1;
  }
  pthread_mutex_lock(&s->mu);
  if (s->n < MAX_OUT) {
    s->ids[s->n] = id;
    s->items[s->n++] = copy;
  } else {
    free(copy);
  }
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mu);
}

/* Waits until an output containing every needle (NULL-terminated list)
 * exists; returns its index or -1 after ms. */
static int sink_wait(sink_t *s, int ms, ...) {
  struct timespec dl;
  const char *needles[8];
  int nn = 0, i, j, found = -1;
  va_list ap;
  va_start(ap, ms);
  while (nn < 8 && (needles[nn] = va_arg(ap, const char *)) != NULL) nn++;
  va_end(ap);
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += ms / 1000;
  dl.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
  pthread_mutex_lock(&s->mu);
  for (;;) {
    for (i = 0; i < s->n && found < 0; i++) {
      for (j = 0; j < nn && strstr(s->items[i], needles[j]) != NULL; j++) {}
      if (j == nn) found = i;
    }
    if (found >= 0) break;
    if (pthread_cond_timedwait(&s->cond, &s->mu, &dl) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&s->mu);
  return found;
}

static int sink_count(sink_t *s, const char *needle) {
  int i, c = 0;
  pthread_mutex_lock(&s->mu);
  for (i = 0; i < s->n; i++) if (strstr(s->items[i], needle) != NULL) c++;
  pthread_mutex_unlock(&s->mu);
  return c;
}

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static sbx_engine *fake_engine(sink_t *s, const char *options) {
  char path[4096], *err = NULL;
  sbx_engine *e;
  path_of(path, sizeof path, "fake_app.lua");
  e = sbx_engine_new(path, options, s != NULL ? on_result : NULL, s, &err);
  if (e == NULL) snprintf(why, sizeof why, "sbx_engine_new failed: %s", err ? err : "(no message)");
  sbx_free(err);
  return e;
}

static int submit(sbx_engine *e, const char *json) {
  return (int)sbx_engine_submit(e, json, strlen(json));
}

/* ---- cases --------------------------------------------------------------- */

static int t_abi_version(void) {
  CHECK(sbx_ffi_abi_version() == SBX_FFI_ABI_VERSION, "abi %d", sbx_ffi_abi_version());
  return 0;
}

static int t_new_unknown_option(void) {
  char path[4096], *err = NULL;
  sbx_engine *e;
  path_of(path, sizeof path, "bogus_option.lua");
  e = sbx_engine_new(path, NULL, NULL, NULL, &err);
  CHECK(e == NULL, "engine created from a bad config");
  CHECK(err != NULL && strcmp(err, "unknown sandbox option: bogus") == 0, "error %s", err ? err : "NULL");
  sbx_free(err);
  return 0;
}

static int t_new_errors(void) {
  char path[4096], *err = NULL;
  sbx_engine *e;
  path_of(path, sizeof path, "does_not_exist.lua");
  e = sbx_engine_new(path, NULL, NULL, NULL, &err);
  CHECK(e == NULL && err != NULL && strstr(err, "cannot load config") != NULL, "missing file: %s", err ? err : "NULL");
  sbx_free(err);
  err = NULL;
  path_of(path, sizeof path, "fake_app.lua");
  e = sbx_engine_new(path, "{not json", NULL, NULL, &err);
  CHECK(e == NULL && err != NULL && strstr(err, "invalid options_json") != NULL, "bad options: %s", err ? err : "NULL");
  sbx_free(err);
  err = NULL;
  e = sbx_engine_new(path, "{\"host\":{\"failStart\":true}}", NULL, NULL, &err);
  CHECK(e == NULL && err != NULL && strcmp(err, "start refused by the fake app") == 0, "failed start: %s", err ? err : "NULL");
  sbx_free(err);
  e = sbx_engine_new(path, "{}", NULL, NULL, NULL);   /* error_out may be NULL */
  CHECK(e != NULL, "engine without error_out");
  sbx_engine_free(e);
  sbx_engine_free(NULL);
  sbx_free(NULL);
  return 0;
}

/* Waits (at most 5 s) for the next polled output containing `needle`;
 * returns it (free with sbx_free) or NULL. Other outputs are dropped. */
static char *poll_for(sbx_engine *e, const char *needle) {
  for (int i = 0; i < 5000; i++) {
    char *o = sbx_engine_poll(e);
    if (o == NULL) {
      usleep(1000);
      continue;
    }
    if (strstr(o, needle) != NULL) return o;
    sbx_free(o);
  }
  return NULL;
}

/* A NULL config makes a utility engine: no app, but the host facilities,
 * including a host call (a safe fetch's resolve seam) answered from C. */
static int t_utility_engine(void) {
  char *err = NULL, *r, needle[64];
  int32_t code = 0;
  int64_t fetch_id;
  static const char claim[] = "{\"type\":\"claim\",\"event\":{}}";
  static const char pub[] = "{\"type\":\"isPublicAddress\",\"text\":\"93.184.216.34\"}";
  static const char fetch[] = "{\"type\":\"fetch\",\"url\":\"http://example.com/\",\"owner\":\"f1\","
                              "\"seams\":{\"resolve\":true}}";
  static const char answer[] = "{\"type\":\"callback.result\",\"id\":1,\"ok\":true,"
                               "\"value\":[{\"address\":\"10.0.0.1\",\"family\":4}]}";
  sbx_engine *e = sbx_engine_new(NULL, NULL, NULL, NULL, &err);
  CHECK(e != NULL && err == NULL, "utility engine refused: %s", err ? err : "NULL");
  r = sbx_engine_call(e, claim, sizeof claim - 1, 5000, &code);
  if (r == NULL || strstr(r, "\"ok\":false") == NULL || strstr(r, "this engine has no app") == NULL) {
    snprintf(why, sizeof why, "claim on a utility engine: %s", r ? r : "NULL");
    goto fail;
  }
  sbx_free(r);
  r = sbx_engine_call(e, pub, sizeof pub - 1, 5000, &code);
  if (r == NULL || strstr(r, "\"value\":true") == NULL) {
    snprintf(why, sizeof why, "isPublicAddress: %s", r ? r : "NULL");
    goto fail;
  }
  sbx_free(r);
  fetch_id = sbx_engine_submit(e, fetch, sizeof fetch - 1);
  if (fetch_id <= 0) {
    snprintf(why, sizeof why, "fetch not submitted");
    r = NULL;
    goto fail;
  }
  r = poll_for(e, "\"callback.request\"");
  if (r == NULL || strstr(r, "\"fn\":\"resolve\"") == NULL || strstr(r, "\"args\":[\"example.com\"]") == NULL ||
      strstr(r, "\"owner\":\"f1\"") == NULL) {
    snprintf(why, sizeof why, "host call: %s", r ? r : "NULL");
    goto fail;
  }
  sbx_free(r);
  if (sbx_engine_submit(e, answer, sizeof answer - 1) <= 0) {
    snprintf(why, sizeof why, "answer not submitted");
    r = NULL;
    goto fail;
  }
  snprintf(needle, sizeof needle, "\"type\":\"result\",\"request\":%lld,", (long long)fetch_id);
  r = poll_for(e, needle);
  if (r == NULL || strstr(r, "\"ok\":false") == NULL ||
      strstr(r, "\"errorInfo\":{\"name\":\"UnsafeUrlError\",\"message\":\"URL resolves to a non-public address\"") == NULL) {
    snprintf(why, sizeof why, "fetch result: %s", r ? r : "NULL");
    goto fail;
  }
  sbx_free(r);
  sbx_engine_free(e);
  return 0;
fail:
  sbx_free(r);
  sbx_engine_free(e);
  return -1;
}

static int t_status_sync(void) {
  sbx_engine *e = fake_engine(NULL, NULL);
  char *st;
  if (e == NULL) return -1;
  st = sbx_engine_status(e);
  if (st == NULL || strstr(st, "\"ok\":true") == NULL || strstr(st, "\"abi\":1") == NULL ||
      strstr(st, "\"channels\":[\"discord:1\"]") == NULL) {
    snprintf(why, sizeof why, "status %s", st ? st : "NULL");
    sbx_free(st);
    sbx_engine_free(e);
    return -1;
  }
  sbx_free(st);
  CHECK(sbx_engine_poll(e) == NULL, "status result leaked into the poll queue");
  sbx_engine_free(e);
  return 0;
}

/* sbx_engine_metrics needs an app that has metrics: a duck-typed app
 * without them and a utility engine give NULL, never JSON or a crash, and
 * the failed request leaks nothing into the poll queue. */
static int t_metrics_unavailable(void) {
  sbx_engine *e = fake_engine(NULL, NULL);
  char *m;
  if (e == NULL) return -1;
  m = sbx_engine_metrics(e);
  if (m != NULL) {
    snprintf(why, sizeof why, "metrics of a fake app: %.100s", m);
    sbx_free(m);
    sbx_engine_free(e);
    return -1;
  }
  CHECK(sbx_engine_poll(e) == NULL, "the metrics result leaked into the poll queue");
  sbx_engine_free(e);
  e = sbx_engine_new(NULL, NULL, NULL, NULL, NULL);
  CHECK(e != NULL, "utility engine");
  m = sbx_engine_metrics(e);
  sbx_engine_free(e);
  CHECK(m == NULL, "metrics of a utility engine: %.100s", m);
  return 0;
}

static int t_poll_mode(void) {
  sbx_engine *e = fake_engine(NULL, "{\"luaDir\":null}");
  struct pollfd p;
  int64_t id;
  char *r, expect[64];
  int rc;
  CHECK(e == NULL, "luaDir null accepted");
  e = fake_engine(NULL, NULL);
  if (e == NULL) return -1;
  p.fd = sbx_engine_fd(e);
  p.events = POLLIN;
  CHECK(p.fd >= 0, "no fd");
  CHECK(poll(&p, 1, 0) == 0, "fd readable with an empty queue");
  id = sbx_engine_submit(e, "{\"type\":\"ping\"}", 15);
  CHECK(id > 0, "submit %lld", (long long)id);
  rc = poll(&p, 1, 5000);
  CHECK(rc == 1 && (p.revents & POLLIN), "fd not readable after a result (rc %d)", rc);
  r = sbx_engine_poll(e);
  snprintf(expect, sizeof expect, "\"request\":%lld,\"ok\":true,\"value\":true", (long long)id);
  if (r == NULL || strstr(r, expect) == NULL) {
    snprintf(why, sizeof why, "poll %s", r ? r : "NULL");
    sbx_free(r);
    sbx_engine_free(e);
    return -1;
  }
  sbx_free(r);
  CHECK(sbx_engine_poll(e) == NULL, "second poll not empty");
  CHECK(poll(&p, 1, 0) == 0, "fd still readable after draining");
  /* Results left queued are released by free (ASan checks it). */
  CHECK(submit(e, "{\"type\":\"ping\"}") > 0, "submit");
  CHECK(poll(&p, 1, 5000) == 1, "second result");
  sbx_engine_free(e);
  return 0;
}

static int t_bad_requests(void) {
  sink_t s;
  sbx_engine *e;
  char big_dummy = 'x';
  int rc = 0;
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  if (sbx_engine_submit(e, NULL, 3) != -1001 || sbx_engine_submit(e, "x", 0) != -1001 ||
      sbx_engine_submit(NULL, "x", 1) != -1001 ||
      sbx_engine_submit(e, &big_dummy, (size_t)SBX_FFI_MAX_REQUEST_BYTES + 1) != -1003) {
    snprintf(why, sizeof why, "argument checks");
    rc = -1;
  }
  submit(e, "not json");
  submit(e, "[1,2]");
  submit(e, "{\"type\":\"nope\"}");
  submit(e, "{\"type\":\"message\"}");
  submit(e, "{\"type\":\"stop\"}");
  submit(e, "{\"type\":\"service\",\"op\":\"frobnicate\"}");
  if (rc == 0 && (sink_wait(&s, 5000, "unknown service op: frobnicate", NULL) < 0 ||
                  sink_count(&s, "\"ok\":false") != 6 ||
                  sink_count(&s, "invalid request: invalid json") != 1 ||
                  sink_count(&s, "unknown type: nope") != 1 ||
                  sink_count(&s, "event must be an object") != 1)) {
    snprintf(why, sizeof why, "expected six ok=false results, got %d", sink_count(&s, "\"ok\":false"));
    rc = -1;
  }
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

static const char MSG[] =
  "{\"type\":\"message\",\"event\":{\"type\":\"message\",\"id\":\"m1\",\"surface\":\"discord\","
  "\"channelId\":\"1\",\"guildId\":\"9\",\"author\":{\"id\":\"alice\",\"name\":\"Alice\"},"
  "\"mentionsBot\":true,\"text\":\"%s\",\"quoted\":null},"
  "\"admission\":{\"tier\":\"member\",\"principalId\":\"p_alice\"}}";

static int64_t submit_msg(sbx_engine *e, const char *text) {
  char buf[1024];
  snprintf(buf, sizeof buf, MSG, text);
  return sbx_engine_submit(e, buf, strlen(buf));
}

static int t_message(void) {
  sink_t s;
  sbx_engine *e;
  int64_t id;
  char want[128];
  int rc = 0, i;
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  id = submit_msg(e, "hi \\u00e9");
  snprintf(want, sizeof want, "\"type\":\"result\",\"request\":%lld,\"ok\":true", (long long)id);
  i = sink_wait(&s, 5000, want, "\"replies\":[\"echo: hi \xc3\xa9\"]", "\"action\":\"answer\"", NULL);
  if (i < 0) { snprintf(why, sizeof why, "no message result"); rc = -1; }
  if (rc == 0 && (sink_count(&s, "\"name\":\"claim\"") != 1 || sink_count(&s, "\"name\":\"typing\",\"on\":true") != 1 ||
                  sink_count(&s, "\"name\":\"typing\",\"on\":false") != 1)) {
    snprintf(why, sizeof why, "claim/typing events missing");
    rc = -1;
  }
  if (rc == 0 && s.ids[i] != id) { snprintf(why, sizeof why, "callback id %lld", (long long)s.ids[i]); rc = -1; }
  /* a channel the app does not claim */
  if (rc == 0) {
    const char *m = "{\"type\":\"message\",\"event\":{\"channelId\":\"2\",\"text\":\"x\"},\"admission\":null}";
    id = submit(e, m);
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true,\"value\":{\"claim\":{\"claim\":false", (long long)id);
    if (sink_wait(&s, 5000, want, "\"result\":null", NULL) < 0) { snprintf(why, sizeof why, "unclaimed"); rc = -1; }
  }
  /* a turn that raises: ok=false with the message */
  if (rc == 0) {
    id = submit_msg(e, "raise");
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":false,\"error\":\"fake turn exploded\"", (long long)id);
    if (sink_wait(&s, 5000, want, NULL) < 0) { snprintf(why, sizeof why, "raise"); rc = -1; }
  }
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

static int t_commands_services(void) {
  sbx_engine *e = fake_engine(NULL, NULL);
  static const struct { const char *req, *want; } cases[] = {
    {"{\"type\":\"command\",\"event\":{\"type\":\"command\",\"channelId\":\"1\",\"subcommand\":\"on\"},"
     "\"admission\":{\"tier\":\"owner\"}}", "\"value\":{\"ephemeral\":true,\"replies\":[\"sandbox on\"]}"},
    {"{\"type\":\"claim\",\"event\":{\"channelId\":\"1\"},\"admission\":null}", "\"action\":\"drop\""},
    {"{\"type\":\"stop\",\"channel\":\"discord:1\"}", "\"value\":true"},
    {"{\"type\":\"stop\",\"channel\":\"discord:2\"}", "\"value\":false"},
    {"{\"type\":\"startFresh\",\"channel\":\"discord:1\"}", "\"value\":\"sandbox\""},
    {"{\"type\":\"owns\",\"channel\":\"discord:1\"}", "\"value\":true"},
    {"{\"type\":\"background\",\"channel\":\"discord:1\"}", "\"skipped\":true"},
    {"{\"type\":\"service\",\"op\":\"enable\",\"args\":[\"discord:7\"]}", "\"value\":true"},
    {"{\"type\":\"service\",\"op\":\"list\"}", "\"value\":[\"discord:1\",\"discord:7\"]"},
    {"{\"type\":\"service\",\"op\":\"has\",\"args\":[\"discord:8\"]}", "\"value\":false"},
    {"{\"type\":\"service\",\"op\":\"runTurn\",\"args\":[\"discord:1\",{\"id\":\"bob\"},\"hey\"]}",
     "\"text\":\"discord:1/bob: hey\""},
    {"{\"type\":\"service\",\"op\":\"busy\"}", "\"value\":false"},
    {"{\"type\":\"apiKey.result\",\"id\":99,\"key\":\"x\"}", "\"value\":false"},
  };
  size_t i;
  if (e == NULL) return -1;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t code = 0;
    char *r = sbx_engine_call(e, cases[i].req, strlen(cases[i].req), 5000, &code);
    if (r == NULL || strstr(r, cases[i].want) == NULL) {
      snprintf(why, sizeof why, "case %zu: %s (code %d)", i, r ? r : "NULL", code);
      sbx_free(r);
      sbx_engine_free(e);
      return -1;
    }
    sbx_free(r);
  }
  sbx_engine_free(e);
  return 0;
}

static int t_api_key_host(void) {
  sink_t s;
  sbx_engine *e;
  int64_t id1, id2;
  char want[160], ans[160];
  int rc = 0, i;
  long key_id;
  const char *p;
  sink_init(&s);
  e = fake_engine(&s, "{\"apiKey\":\"host\"}");
  if (e == NULL) { sink_free(&s); return -1; }
  id1 = submit_msg(e, "key");
  i = sink_wait(&s, 5000, "\"type\":\"apiKey.request\"",
                "\"scope\":{\"channel\":\"discord:1\",\"speaker\":{\"id\":\"alice\",\"name\":\"Alice\",\"principalId\":\"p_alice\"}}",
                NULL);
  if (i < 0) { snprintf(why, sizeof why, "no apiKey.request"); rc = -1; }
  if (rc == 0) {
    p = strstr(s.items[i], "\"id\":");
    key_id = p ? strtol(p + 5, NULL, 10) : -1;
    snprintf(ans, sizeof ans, "{\"type\":\"apiKey.result\",\"id\":%ld,\"key\":\"k-123\"}", key_id);
    submit(e, ans);
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id1);
    if (sink_wait(&s, 5000, want, "key=k-123", NULL) < 0) { snprintf(why, sizeof why, "key not used"); rc = -1; }
  }
  /* null key: fails closed (the app sees nil) */
  if (rc == 0) {
    id2 = submit_msg(e, "key");
    if (sink_wait(&s, 5000, "\"type\":\"apiKey.request\",\"request\":0,\"id\":2", NULL) < 0) {
      snprintf(why, sizeof why, "no second apiKey.request");
      rc = -1;
    } else {
      submit(e, "{\"type\":\"apiKey.result\",\"id\":2,\"key\":null}");
      snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id2);
      if (sink_wait(&s, 5000, want, "key=nil", NULL) < 0) { snprintf(why, sizeof why, "null key not nil"); rc = -1; }
    }
  }
  /* an unanswered request fails closed when the engine stops */
  if (rc == 0) {
    int64_t id3 = submit_msg(e, "key");
    if (sink_wait(&s, 5000, "\"type\":\"apiKey.request\",\"request\":0,\"id\":3", NULL) < 0) {
      snprintf(why, sizeof why, "no third apiKey.request");
      rc = -1;
    } else {
      sbx_engine_stop(e);
      snprintf(want, sizeof want, "\"request\":%lld,", (long long)id3);
      if (sink_wait(&s, 100, want, "key=nil", NULL) < 0) { snprintf(why, sizeof why, "stop did not fail the key closed"); rc = -1; }
    }
  }
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

/* Two threads submit pings concurrently; every id is unique and answered. */
#define PER_THREAD 500
typedef struct { sbx_engine *e; int64_t ids[PER_THREAD]; int bad; } sub_arg;

static void *submitter(void *arg) {
  sub_arg *a = arg;
  int i;
  for (i = 0; i < PER_THREAD; i++) {
    a->ids[i] = sbx_engine_submit(a->e, "{\"type\":\"ping\"}", 15);
    if (a->ids[i] <= 0) a->bad++;
  }
  return NULL;
}

static int cmp64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

static int t_concurrent_submits(void) {
  sink_t s;
  sbx_engine *e;
  pthread_t t1, t2;
  sub_arg a1, a2;
  int64_t all[2 * PER_THREAD];
  int i, rc = 0, got;
  struct timespec ts = {0, 10 * 1000000L};
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  memset(&a1, 0, sizeof a1);
  memset(&a2, 0, sizeof a2);
  a1.e = a2.e = e;
  pthread_create(&t1, NULL, submitter, &a1);
  pthread_create(&t2, NULL, submitter, &a2);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  if (a1.bad || a2.bad) { snprintf(why, sizeof why, "submit failed (%d, %d)", a1.bad, a2.bad); rc = -1; }
  for (i = 0; i < 500 && rc == 0; i++) {
    pthread_mutex_lock(&s.mu);
    got = s.n;
    pthread_mutex_unlock(&s.mu);
    if (got >= 2 * PER_THREAD) break;
    nanosleep(&ts, NULL);
  }
  if (rc == 0 && sink_count(&s, "\"ok\":true,\"value\":true") != 2 * PER_THREAD) {
    snprintf(why, sizeof why, "%d of %d results", sink_count(&s, "\"ok\":true"), 2 * PER_THREAD);
    rc = -1;
  }
  if (rc == 0) {
    memcpy(all, a1.ids, sizeof a1.ids);
    memcpy(all + PER_THREAD, a2.ids, sizeof a2.ids);
    qsort(all, 2 * PER_THREAD, sizeof all[0], cmp64);
    for (i = 1; i < 2 * PER_THREAD; i++) if (all[i] == all[i - 1]) { snprintf(why, sizeof why, "duplicate id"); rc = -1; break; }
    qsort(s.ids, (size_t)s.n, sizeof s.ids[0], cmp64);
    for (i = 0; i < 2 * PER_THREAD && rc == 0; i++)
      if (s.ids[i] != all[i]) { snprintf(why, sizeof why, "result ids differ from submitted ids"); rc = -1; }
  }
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

/* stop while a turn runs: the turn ends with its own result before stop
 * returns, later submits are refused, status is NULL. */
static int t_stop_during_turn(void) {
  sink_t s;
  sbx_engine *e;
  int64_t id;
  char want[128];
  int rc = 0;
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  id = submit_msg(e, "slow");
  if (sink_wait(&s, 5000, "\"name\":\"typing\",\"on\":true", NULL) < 0) { snprintf(why, sizeof why, "turn did not start"); rc = -1; }
  sbx_engine_stop(e);
  snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
  if (rc == 0 && sink_wait(&s, 0, want, "slow ended: disposed", NULL) < 0) { snprintf(why, sizeof why, "turn did not end on stop"); rc = -1; }
  if (rc == 0 && submit(e, "{\"type\":\"ping\"}") != SBX_ESTOPPED) { snprintf(why, sizeof why, "submit after stop"); rc = -1; }
  if (rc == 0) {
    char *st = sbx_engine_status(e);
    if (st != NULL) { snprintf(why, sizeof why, "status after stop"); rc = -1; }
    sbx_free(st);
  }
  sbx_engine_stop(e);                        /* idempotent */
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

/* free with requests still running and queued, in polling mode. */
static int t_free_while_busy(void) {
  sbx_engine *e = fake_engine(NULL, NULL);
  int i;
  char *r;
  int n = 0, stopped = 0;
  if (e == NULL) return -1;
  for (i = 0; i < 3; i++) submit_msg(e, "slow");
  for (i = 0; i < 50; i++) submit(e, "{\"type\":\"ping\"}");
  sbx_engine_stop(e);
  while ((r = sbx_engine_poll(e)) != NULL) {
    n++;
    if (strstr(r, "slow ended: disposed") != NULL) stopped++;
    sbx_free(r);
  }
  sbx_engine_free(e);
  CHECK(stopped == 3, "%d slow turns ended by stop (of %d outputs)", stopped, n);
  return 0;
}

static int t_reentrant_call_refused(void) {
  sink_t s;
  sbx_engine *e;
  int rc = 0;
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  s.engine = e;                              /* the callback tries sbx_engine_call */
  submit(e, "{\"type\":\"ping\"}");
  if (sink_wait(&s, 5000, "\"value\":true", NULL) < 0) { snprintf(why, sizeof why, "no result"); rc = -1; }
  if (rc == 0 && s.reentrant_code != SBX_ETHREAD) { snprintf(why, sizeof why, "code %d", s.reentrant_code); rc = -1; }
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

/* The real app: sandbox{} with a Lua fake driver, no Docker. */
static int t_real_app(void) {
  sink_t s;
  sbx_engine *e;
  char path[4096], tmpl[] = "/tmp/sbx-ffi-XXXXXX", opts[1024], *err = NULL, *st;
  char *tmp;
  int rc = 0;
  int64_t id;
  char want[128];
  const char *base = getenv("TMPDIR");
  if (base != NULL && base[0] != '\0' && strlen(base) < 40) {
    static char t2[64];
    snprintf(t2, sizeof t2, "%s/sbx-ffi-XXXXXX", base);
    tmp = mkdtemp(t2);
  } else {
    tmp = mkdtemp(tmpl);
  }
  CHECK(tmp != NULL, "mkdtemp");
  sink_init(&s);
  path_of(path, sizeof path, "real_app.lua");
  snprintf(opts, sizeof opts, "{\"apiKey\":\"host\",\"host\":{\"timeZone\":\"UTC\"},"
           "\"sandbox\":{\"initialChannels\":[\"discord:1\"]},\"root\":\"%s\"}", tmp);
  e = sbx_engine_new(path, opts, on_result, &s, &err);
  if (e == NULL) {
    snprintf(why, sizeof why, "sbx_engine_new: %s", err ? err : "NULL");
    sbx_free(err);
    sink_free(&s);
    return -1;
  }
  st = sbx_engine_status(e);
  if (st == NULL || strstr(st, "\"ok\":true") == NULL || strstr(st, "discord:1") == NULL) {
    snprintf(why, sizeof why, "status %s", st ? st : "NULL");
    rc = -1;
  }
  sbx_free(st);
  if (rc == 0) {
    id = submit_msg(e, "hello");
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
    char typing[96];
    snprintf(typing, sizeof typing, "\"type\":\"event\",\"request\":%lld,\"name\":\"typing\",\"on\":false", (long long)id);
    if (sink_wait(&s, 10000, want, "fake: hello", NULL) < 0 || sink_wait(&s, 0, typing, NULL) < 0) {
      int i;
      snprintf(why, sizeof why, "no reply");
      pthread_mutex_lock(&s.mu);
      for (i = 0; i < s.n; i++) fprintf(stderr, "  output: %.300s\n", s.items[i]);
      pthread_mutex_unlock(&s.mu);
      rc = -1;
    }
  }
  /* the host-side apiKey through the real broker: the key the host answers
   * is the one the model provider receives; a null key fails closed (502,
   * the provider is never contacted) */
  if (rc == 0) {
    int i;
    long key_id;
    const char *p;
    char ans[128];
    id = submit_msg(e, "model");
    i = sink_wait(&s, 10000, "\"type\":\"apiKey.request\"",
                  "\"scope\":{\"channel\":\"discord:1\",\"speaker\":{\"id\":\"alice\",\"name\":\"Alice\",\"principalId\":\"p_alice\"}}",
                  NULL);
    if (i < 0) { snprintf(why, sizeof why, "no apiKey.request from the real broker"); rc = -1; }
    if (rc == 0) {
      p = strstr(s.items[i], "\"id\":");
      key_id = p ? strtol(p + 5, NULL, 10) : -1;
      snprintf(ans, sizeof ans, "{\"type\":\"apiKey.result\",\"id\":%ld,\"key\":\"ts-key-1\"}", key_id);
      submit(e, ans);
      snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
      if (sink_wait(&s, 10000, want, "model 200 auth=Bearer ts-key-1", NULL) < 0) {
        snprintf(why, sizeof why, "the host's key did not reach the provider");
        rc = -1;
      }
    }
    if (rc == 0) {
      id = submit_msg(e, "model");
      snprintf(ans, sizeof ans, "\"type\":\"apiKey.request\",\"request\":0,\"id\":%ld", key_id + 1);
      if (sink_wait(&s, 10000, ans, NULL) < 0) { snprintf(why, sizeof why, "no second apiKey.request"); rc = -1; }
      snprintf(ans, sizeof ans, "{\"type\":\"apiKey.result\",\"id\":%ld,\"key\":null}", key_id + 1);
      submit(e, ans);
      snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
      if (rc == 0 && sink_wait(&s, 10000, want, "model 502 auth=none", NULL) < 0) {
        snprintf(why, sizeof why, "a null key did not fail closed");
        rc = -1;
      }
    }
  }
  /* a turn's failure reason through the ABI: the runTurn result names it,
   * with the provider's status, its tokens and the fix (operations.md 1) */
  if (rc == 0) {
    int i;
    long key_id;
    const char *p;
    char ans[128];
    static const char req[] = "{\"type\":\"service\",\"op\":\"runTurn\",\"args\":[\"discord:1\","
      "{\"id\":\"alice\",\"name\":\"Alice\",\"principalId\":\"p_alice\"},\"refused\"]}";
    int before = sink_count(&s, "\"type\":\"apiKey.request\"");
    id = submit(e, req);
    for (i = 0; i < 200 && sink_count(&s, "\"type\":\"apiKey.request\"") <= before; i++) usleep(50000);
    key_id = -1;
    pthread_mutex_lock(&s.mu);
    for (i = s.n - 1; i >= 0 && key_id < 0; i--) {
      if (strstr(s.items[i], "\"type\":\"apiKey.request\"") == NULL) continue;
      p = strstr(s.items[i], "\"id\":");
      key_id = p ? strtol(p + 5, NULL, 10) : -1;
    }
    pthread_mutex_unlock(&s.mu);
    snprintf(ans, sizeof ans, "{\"type\":\"apiKey.result\",\"id\":%ld,\"key\":\"ts-key-2\"}", key_id);
    submit(e, ans);
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
    if (sink_wait(&s, 10000, want, "\"reason\":\"upstream_status\"", "\"status\":401",
                  "\"code\":\"invalid_api_key\"", "\"fix\":\"check the credential apiKey returns for this channel\"",
                  NULL) < 0) {
      snprintf(why, sizeof why, "the runTurn result does not carry the turn's reason");
      pthread_mutex_lock(&s.mu);
      for (i = 0; i < s.n; i++) fprintf(stderr, "  output: %.300s\n", s.items[i]);
      pthread_mutex_unlock(&s.mu);
      rc = -1;
    }
  }
  /* the Prometheus exposition through the ABI (spec/operations.md 4): the
   * text itself, moved by the turns above (three ok, one upstream_status;
   * the first /model call answered 200, the null key's and the refused
   * one 502; the provider answered 200 once and 401 once) */
  if (rc == 0) {
    static const char *lines[] = {
      "# TYPE sbx_turns_total counter\n",
      "\nsbx_turns_total{reason=\"ok\"} 3\n",
      "\nsbx_turns_total{reason=\"upstream_status\"} 1\n",
      "\nsbx_broker_requests_total{route_kind=\"model\",status=\"200\"} 1\n",
      "\nsbx_broker_requests_total{route_kind=\"model\",status=\"502\"} 2\n",
      "\nsbx_upstream_responses_total{route_kind=\"model\",status=\"401\"} 1\n",
      "\nsbx_turn_duration_seconds_count 4\n",
      "\nsbx_containers{state=\"warm\"} 0\n",
    };
    size_t i;
    char *m = sbx_engine_metrics(e);
    if (m == NULL || m[0] != '#') {
      snprintf(why, sizeof why, "sbx_engine_metrics: %.100s", m ? m : "NULL");
      rc = -1;
    }
    for (i = 0; rc == 0 && i < sizeof lines / sizeof lines[0]; i++) {
      if (strstr(m, lines[i]) == NULL) {
        snprintf(why, sizeof why, "the exposition lacks %s", lines[i]);
        fprintf(stderr, "%s", m);
        rc = -1;
      }
    }
    sbx_free(m);
  }
  /* stop while a real turn runs: the turn is aborted, its message request
   * still gets its own result (the guest-visible failure text) before stop
   * returns */
  if (rc == 0) {
    int i;
    id = submit_msg(e, "slow");
    snprintf(want, sizeof want, "\"request\":%lld,\"name\":\"typing\",\"on\":true", (long long)id);
    if (sink_wait(&s, 10000, want, NULL) < 0) { snprintf(why, sizeof why, "slow turn did not start"); rc = -1; }
    sbx_engine_stop(e);
    snprintf(want, sizeof want, "\"request\":%lld,\"ok\":true", (long long)id);
    if (rc == 0 && sink_wait(&s, 0, want, "The sandbox turn failed or was stopped.", NULL) < 0) {
      snprintf(why, sizeof why, "the stopped turn's result is missing");
      rc = -1;
    }
    if (rc != 0) {
      pthread_mutex_lock(&s.mu);
      for (i = 0; i < s.n; i++) fprintf(stderr, "  output: %.300s\n", s.items[i]);
      pthread_mutex_unlock(&s.mu);
    }
  }
  sbx_engine_free(e);
  sink_free(&s);
  {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "ffi_test: could not remove %s\n", tmp);
  }
  return rc;
}

/* sbx_engine_call gives up after its timeout; the late result is dropped,
 * neither delivered to the callback nor leaked. */
static int t_call_timeout(void) {
  sink_t s;
  sbx_engine *e;
  char buf[1024];
  char *r;
  int32_t code = 0;
  int rc = 0;
  sink_init(&s);
  e = fake_engine(&s, NULL);
  if (e == NULL) { sink_free(&s); return -1; }
  snprintf(buf, sizeof buf, MSG, "slow");
  r = sbx_engine_call(e, buf, strlen(buf), 100, &code);
  if (r != NULL || code != SBX_ETIMEOUT) { snprintf(why, sizeof why, "code %d", code); rc = -1; }
  sbx_free(r);
  sbx_engine_stop(e);                        /* ends the slow turn */
  if (rc == 0 && sink_count(&s, "\"type\":\"result\"") != 0) {
    snprintf(why, sizeof why, "the abandoned result reached the callback");
    rc = -1;
  }
  r = sbx_engine_call(e, "{\"type\":\"ping\"}", 15, 100, &code);
  if (rc == 0 && (r != NULL || code != SBX_ESTOPPED)) { snprintf(why, sizeof why, "call after stop: %d", code); rc = -1; }
  sbx_free(r);
  sbx_engine_free(e);
  sink_free(&s);
  return rc;
}

/* ---- runner ----------------------------------------------------------------- */

static const test_case CASES[] = {
  {"abi_version", t_abi_version},
  {"new_unknown_option_error", t_new_unknown_option},
  {"new_errors", t_new_errors},
  {"utility_engine_and_host_calls", t_utility_engine},
  {"status_sync", t_status_sync},
  {"metrics_unavailable", t_metrics_unavailable},
  {"poll_mode_eventfd", t_poll_mode},
  {"bad_requests", t_bad_requests},
  {"message_events_and_result", t_message},
  {"commands_and_services", t_commands_services},
  {"api_key_from_host", t_api_key_host},
  {"concurrent_submits", t_concurrent_submits},
  {"stop_during_turn", t_stop_during_turn},
  {"free_while_busy", t_free_while_busy},
  {"reentrant_call_refused", t_reentrant_call_refused},
  {"call_timeout_drops_late_result", t_call_timeout},
  {"real_app_fake_driver_and_host_api_key", t_real_app},
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: ffi_test TESTS_DIR [CASE...]\n");
    return 2;
  }
  if (geteuid() == 0) {
    fprintf(stderr, "ffi_test: refusing to run as root (the runtime refuses root); use runuser -u sbx --\n");
    return 2;
  }
  dir = argv[1];
  return run_cases("ffi", CASES, sizeof CASES / sizeof CASES[0], argv + 2, argc - 2) ? 1 : 0;
}
