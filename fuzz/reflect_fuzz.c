/*
 * reflect_fuzz.c: libFuzzer harness for the reflection filter (core/reflect.c).
 *
 * Input layout: byte 0 picks the key length (1..64, bounded by the input),
 * byte 1 picks a needle to plant (0..5) or none (6, 7) and byte 2 where to
 * plant it; then the key, then the haystack. The filter's answer is compared
 * with a naive reference: the six encodings built byte by byte here and one
 * memmem per needle (fuzz/needles.h). The haystack is copied to a buffer of its exact size so
 * a read past its end is caught by ASan. Any difference aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Relative path: core/limits.h would shadow <limits.h> under -Icore. */
#include "../core/sbx.h"

#include "needles.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char nd[6][4 * MAX_KEY + 8];
  size_t ndlen[6], klen, hlen, at, plant;
  const uint8_t *key, *rest;
  sbx_reflect_t *f;
  uint8_t *hay;
  int want = 0, got;
  if (size < 4) return 0;
  klen = 1 + data[0] % MAX_KEY;
  if (klen > size - 3) klen = size - 3;
  plant = data[1] & 7;
  key = data + 3;
  rest = key + klen;
  hlen = size - 3 - klen;
  build_needles(key, klen, nd, ndlen);
  at = hlen ? data[2] % (hlen + 1) : 0;
  /* Haystack: the rest, with needle `plant` inserted at `at` when < 6. */
  {
    size_t extra = plant < 6 ? ndlen[plant] : 0;
    hay = malloc(hlen + extra ? hlen + extra : 1);
    if (hay == NULL) die("out of memory");
    memcpy(hay, rest, at);
    if (extra) memcpy(hay + at, nd[plant], extra);
    memcpy(hay + at + extra, rest + at, hlen - at);
    hlen += extra;
  }
  if (sbx_reflect_new((const char *)key, klen, &f) != 0) die("sbx_reflect_new failed");
  for (int i = 0; i < 6 && !want; i++)
    want = memmem(hay, hlen, nd[i], ndlen[i]) != NULL;
  got = sbx_reflect_hit(f, (const char *)hay, hlen);
  if (got != want) {
    fprintf(stderr, "reflect_fuzz: key %zu bytes, hay %zu bytes, want %d got %d\n", klen, hlen, want, got);
    abort();
  }
  /* Every suffix start too: exercises alignment and the tail paths. */
  for (size_t off = 1; off < 17 && off <= hlen; off++) {
    int w = 0;
    for (int i = 0; i < 6 && !w; i++) w = memmem(hay + off, hlen - off, nd[i], ndlen[i]) != NULL;
    uint8_t *copy = malloc(hlen - off ? hlen - off : 1);
    if (copy == NULL) die("out of memory");
    memcpy(copy, hay + off, hlen - off);
    if (sbx_reflect_hit(f, (const char *)copy, hlen - off) != w) die("suffix disagreement");
    free(copy);
  }
  sbx_reflect_free(f);
  free(hay);
  return 0;
}
