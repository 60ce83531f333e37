/*
 * runner.h: the one runner of the C drivers under spec/c/ (libuv's
 * test/runner.c + test-list.h, in a header): a case is `int fn(void)`
 * returning 0, or -1 with the reason in `why` (CHECK fills it); a driver
 * lists its cases in one table and hands it to run_cases, which prints
 * "ok   <case>" / "FAIL <case>: <why>" per case and, last, the summary line
 * "<suite>: N passed, M failed" that scripts/check.sh counts.
 */
#ifndef SBX_SPEC_C_RUNNER_H
#define SBX_SPEC_C_RUNNER_H

#include <stdio.h>
#include <string.h>

static char why[512];

#define CHECK(cond, ...) \
  do { \
    if (!(cond)) { snprintf(why, sizeof why, __VA_ARGS__); return -1; } \
  } while (0)

typedef struct { const char *name; int (*fn)(void); } test_case;

/* Runs every case, or only those named in names[0..nnames). Returns the
 * number that failed. */
static int run_cases(const char *suite, const test_case *cases, size_t ncases,
                     char *const *names, int nnames) {
  int passed = 0, failed = 0, j, run;
  size_t i;
  for (i = 0; i < ncases; i++) {
    run = nnames == 0;
    for (j = 0; j < nnames; j++) if (strcmp(names[j], cases[i].name) == 0) run = 1;
    if (!run) continue;
    why[0] = '\0';
    if (cases[i].fn() == 0) {
      passed++;
      printf("ok   %s\n", cases[i].name);
    } else {
      failed++;
      printf("FAIL %s: %s\n", cases[i].name, why);
    }
    fflush(stdout);
  }
  printf("%s: %d passed, %d failed\n", suite, passed, failed);
  return failed;
}

#endif
