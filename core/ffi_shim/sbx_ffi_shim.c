/*
 * sbx_ffi_shim.c: libsbx_ffi.so, the library a JavaScript runtime loads.
 *
 * Why: Bun's executable exports its own `uv_*` functions (Node-API
 * compatibility stubs, several of which abort: "unsupported uv function").
 * A plain dlopen of libsbx.so binds libsbx's libuv calls to those, because
 * the executable comes first in the global symbol scope, and the engine
 * dies at its first uv_cond_init. This shim has no libuv dependency: it
 * dlopen()s the real libsbx.so with RTLD_DEEPBIND | RTLD_LOCAL, so libsbx.so
 * and the libraries it pulls in (libuv, Lua, curl, OpenSSL) resolve their
 * symbols among themselves first, then forwards every function of
 * sbx_ffi.h to it. Same ABI, same header; memory is still freed only
 * through sbx_free (forwarded).
 *
 * The real library: $SBX_LIBSBX if set, else libsbx.so in this shim's own
 * directory. A load failure makes sbx_engine_new return NULL with the reason
 * in *error_out and every other call a no-op / error code.
 * (RTLD_DEEPBIND cannot be used under AddressSanitizer: sanitizer builds
 * link libsbx.so directly.)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sbx_ffi.h"

static struct {
  int32_t (*abi_version)(void);
  sbx_engine *(*engine_new)(const char *, const char *, sbx_result_fn, void *, char **);
  int64_t (*submit)(sbx_engine *, const char *, size_t);
  char *(*poll)(sbx_engine *);
  int32_t (*fd)(sbx_engine *);
  char *(*call)(sbx_engine *, const char *, size_t, int32_t, int32_t *);
  char *(*status)(sbx_engine *);
  char *(*metrics)(sbx_engine *);
  void (*stop)(sbx_engine *);
  void (*engine_free)(sbx_engine *);
  void (*mem_free)(void *);
} api;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded;
static char load_error[PATH_MAX + 256];

static void load(void) {
  char path[PATH_MAX];
  const char *env = getenv("SBX_LIBSBX");
  Dl_info info;
  void *h;
  char *slash;
  if (env != NULL && env[0] != '\0') {
    if (strlen(env) >= sizeof path) {
      snprintf(load_error, sizeof load_error, "SBX_LIBSBX is too long");
      return;
    }
    memcpy(path, env, strlen(env) + 1);
  } else {
    if (dladdr((void *)load, &info) == 0 || info.dli_fname == NULL ||
        strlen(info.dli_fname) >= sizeof path) {
      snprintf(load_error, sizeof load_error, "cannot locate libsbx_ffi.so; set SBX_LIBSBX");
      return;
    }
    memcpy(path, info.dli_fname, strlen(info.dli_fname) + 1);
    slash = strrchr(path, '/');
    if (slash == NULL) {
      snprintf(path, sizeof path, "libsbx.so");
    } else if ((size_t)(slash - path) + sizeof "/libsbx.so" > sizeof path) {
      snprintf(load_error, sizeof load_error, "libsbx.so path too long");
      return;
    } else {
      memcpy(slash, "/libsbx.so", sizeof "/libsbx.so");
    }
  }
  h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == NULL) {
    snprintf(load_error, sizeof load_error, "cannot load %s: %s", path, dlerror());
    return;
  }
#define SYM(field, name) \
  if ((*(void **)&api.field = dlsym(h, name)) == NULL) { \
    snprintf(load_error, sizeof load_error, "%s lacks %s", path, name); \
    return; \
  }
  SYM(abi_version, "sbx_ffi_abi_version")
  SYM(engine_new, "sbx_engine_new")
  SYM(submit, "sbx_engine_submit")
  SYM(poll, "sbx_engine_poll")
  SYM(fd, "sbx_engine_fd")
  SYM(call, "sbx_engine_call")
  SYM(status, "sbx_engine_status")
  SYM(metrics, "sbx_engine_metrics")
  SYM(stop, "sbx_engine_stop")
  SYM(engine_free, "sbx_engine_free")
  SYM(mem_free, "sbx_free")
#undef SYM
  if (api.abi_version() != SBX_FFI_ABI_VERSION) {
    snprintf(load_error, sizeof load_error, "%s has ABI %d, the shim %d", path,
             (int)api.abi_version(), SBX_FFI_ABI_VERSION);
    return;
  }
  loaded = 1;   /* the handle stays open for the life of the process */
}

static int ready(void) {
  pthread_once(&once, load);
  return loaded;
}

int32_t sbx_ffi_abi_version(void) { return ready() ? api.abi_version() : -1; }

sbx_engine *sbx_engine_new(const char *config_path, const char *options_json,
                           sbx_result_fn cb, void *user, char **error_out) {
  if (!ready()) {
    if (error_out != NULL) *error_out = strdup(load_error);
    return NULL;
  }
  return api.engine_new(config_path, options_json, cb, user, error_out);
}

int64_t sbx_engine_submit(sbx_engine *e, const char *json, size_t len) {
  return ready() ? api.submit(e, json, len) : SBX_ESTOPPED;
}

char *sbx_engine_poll(sbx_engine *e) { return ready() ? api.poll(e) : NULL; }

int32_t sbx_engine_fd(sbx_engine *e) { return ready() ? api.fd(e) : -1; }

char *sbx_engine_call(sbx_engine *e, const char *json, size_t len,
                      int32_t timeout_ms, int32_t *code_out) {
  if (!ready()) {
    if (code_out != NULL) *code_out = SBX_ESTOPPED;
    return NULL;
  }
  return api.call(e, json, len, timeout_ms, code_out);
}

char *sbx_engine_status(sbx_engine *e) { return ready() ? api.status(e) : NULL; }

char *sbx_engine_metrics(sbx_engine *e) { return ready() ? api.metrics(e) : NULL; }

void sbx_engine_stop(sbx_engine *e) { if (ready()) api.stop(e); }

void sbx_engine_free(sbx_engine *e) { if (ready()) api.engine_free(e); }

/* Both sides use the same libc allocator; forwarding keeps the rule exact. */
void sbx_free(void *p) {
  if (ready()) api.mem_free(p); else free(p);
}
