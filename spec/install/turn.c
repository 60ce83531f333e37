/*
 * turn.c: a C host of the embedding ABI, built as a user builds one against
 * an installed libsbx:
 *     cc turn.c $(pkg-config --cflags --libs sbx)
 * (spec/install/install_test.sh, with PKG_CONFIG_PATH/SYSROOT into the
 * temporary tree). It runs one real sealed turn through the ABI:
 *     turn CONFIG.lua OPTIONS_JSON CHANNEL TEXT
 * makes an engine in polling mode, submits the SANDBOX service's runTurn,
 * waits on sbx_engine_fd with poll(2) (at most 120 s) until that request's
 * result arrives, prints it on stdout as one line after "version <sbx_version()>",
 * then stops and frees the engine. Exits 0 when the request's result is
 * "ok":true (the caller reads the turn's own value.ok and text), 1 otherwise.
 * Only public headers and exported symbols are used.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sbx.h>
#include <sbx_ffi.h>

#define WAIT_MS 120000
#define STEP_MS 200

int main(int argc, char **argv) {
  char *err = NULL, *out, req[4096];
  sbx_engine *e;
  int64_t id;
  int waited = 0, status = 1, n;

  if (argc != 5) {
    fprintf(stderr, "usage: turn CONFIG.lua OPTIONS_JSON CHANNEL TEXT\n");
    return 2;
  }
  printf("version %s abi %d\n", sbx_version(), (int)sbx_ffi_abi_version());
  e = sbx_engine_new(argv[1], argv[2], NULL, NULL, &err);
  if (e == NULL) {
    fprintf(stderr, "turn: engine: %s\n", err != NULL ? err : "(no message)");
    sbx_free(err);
    return 1;
  }
  /* channel and text are the caller's plain test words: no JSON escaping needed */
  n = snprintf(req, sizeof req,
               "{\"type\":\"service\",\"op\":\"runTurn\",\"args\":[\"%s\","
               "{\"id\":\"u1\",\"name\":\"Ada\",\"principalId\":\"p1\"},\"%s\"]}",
               argv[3], argv[4]);
  if (n < 0 || (size_t)n >= sizeof req || strpbrk(argv[3], "\"\\") || strpbrk(argv[4], "\"\\")) {
    fprintf(stderr, "turn: CHANNEL and TEXT must be short plain words\n");
    sbx_engine_free(e);
    return 2;
  }
  id = sbx_engine_submit(e, req, (size_t)n);
  if (id <= 0) {
    fprintf(stderr, "turn: submit: %s\n", sbx_strerror((int)id));
    sbx_engine_free(e);
    return 1;
  }
  while (waited < WAIT_MS) {
    struct pollfd p = {sbx_engine_fd(e), POLLIN, 0};
    if (poll(&p, 1, STEP_MS) == 0) {
      waited += STEP_MS;
      continue;
    }
    while ((out = sbx_engine_poll(e)) != NULL) {
      char want[64];
      snprintf(want, sizeof want, "\"type\":\"result\",\"request\":%lld,", (long long)id);
      if (strstr(out, want) != NULL) {
        printf("%s\n", out);
        status = strstr(out, "\"ok\":true,\"value\":") != NULL ? 0 : 1;
        sbx_free(out);
        goto done;
      }
      sbx_free(out);
    }
  }
  fprintf(stderr, "turn: no result within %d ms\n", WAIT_MS);
done:
  sbx_engine_stop(e);
  sbx_engine_free(e);
  return status;
}
