/*
 * reflect_fuzz.c: libFuzzer harness for the reflection filter (core/reflect.c).
 *
 * Input layout: byte 0 picks the key length (1..64, bounded by the input),
 * byte 1 picks a needle to plant (0..5) or none (6, 7) and byte 2 where to
 * plant it; then the key, then the haystack. The filter's answer is compared
 * with a naive reference: the six encodings built byte by byte here and one
 * memmem per needle. The haystack is copied to a buffer of its exact size so
 * a read past its end is caught by ASan. Any difference aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Relative path: core/limits.h would shadow <limits.h> under -Icore. */
#include "../core/sbx.h"

#define MAX_KEY 64

static void die(const char *what) {
  fprintf(stderr, "reflect_fuzz: %s\n", what);
  abort();
}

/* The six needles, naively; out[i] gets needle i, len[i] its length. */
static void build_needles(const uint8_t *k, size_t n, char out[6][4 * MAX_KEY + 8], size_t len[6]) {
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o;
  memcpy(out[0], k, n);
  len[0] = n;
  o = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = k[i];
    if (strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.!~*'()", c) && c != 0)
      out[1][o++] = (char)c;
    else
      o += (size_t)sprintf(out[1] + o, "%%%02X", c);
  }
  len[1] = o;
  o = 0;
  for (size_t i = 0; i < n; i += 3) {        /* base64 with padding */
    uint32_t v = (uint32_t)k[i] << 16;
    if (i + 1 < n) v |= (uint32_t)k[i + 1] << 8;
    if (i + 2 < n) v |= k[i + 2];
    out[2][o++] = b64[(v >> 18) & 63];
    out[2][o++] = b64[(v >> 12) & 63];
    out[2][o++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
    out[2][o++] = i + 2 < n ? b64[v & 63] : '=';
  }
  len[2] = o;
  o = 0;
  for (size_t i = 0; i < len[2] && out[2][i] != '='; i++)   /* base64url */
    out[3][o++] = out[2][i] == '+' ? '-' : out[2][i] == '/' ? '_' : out[2][i];
  len[3] = o;
  for (size_t i = 0; i < n; i++) {
    sprintf(out[4] + 2 * i, "%02x", k[i]);
    sprintf(out[5] + 2 * i, "%02X", k[i]);
  }
  len[4] = len[5] = 2 * n;
}

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
