/*
 * reflect_stream_fuzz.c: libFuzzer harness for the bounded reflection stream
 * (core/reflect_stream.c, spec/rich-mode.md 11.5).
 *
 * Input: byte 0 picks the key length (1..64), byte 1 a needle to plant
 * (0..5) or none (6, 7), byte 2 where, byte 3 seeds the chunking (chunk
 * lengths 0..96, so a needle is split at every offset and across empty
 * chunks), byte 4 the size cap (none, or somewhere inside the haystack);
 * then the key, then the haystack. Checked against the naive reference of
 * fuzz/needles.h over the whole haystack:
 *  - the stream fails "reflected" exactly when, and at the first chunk where,
 *    the bytes pushed so far hold a needle (split anywhere: caught);
 *  - otherwise "too large" exactly at the first chunk that takes the total
 *    over the cap;
 *  - every push emits all bytes so far minus the last `carry` (longest form
 *    minus one), and with no failure the emitted bytes plus finish() equal
 *    the input;
 *  - a failure is sticky.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sbx.h"

#include "needles.h"

/* 1 when hay[0..n) holds one of the six needles. */
static int naive_hit(const uint8_t *hay, size_t n, char nd[6][4 * MAX_KEY + 8], const size_t *len) {
  for (int i = 0; i < 6; i++)
    if (memmem(hay, n, nd[i], len[i]) != NULL) return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char nd[6][4 * MAX_KEY + 8];
  size_t ndlen[6], klen, hlen, at, plant, cap, longest = 0;
  const uint8_t *key, *rest;
  uint8_t *hay, *out;
  size_t pos = 0, outlen = 0;
  unsigned seed;
  sbx_reflect_t *f;
  sbx_reflect_stream_t *s;
  int failed = 0;
  if (size < 6) return 0;
  klen = 1 + data[0] % MAX_KEY;
  if (klen > size - 5) klen = size - 5;
  plant = data[1] & 7;
  seed = data[3] * 2654435761u + 1;
  key = data + 5;
  rest = key + klen;
  hlen = size - 5 - klen;
  build_needles(key, klen, nd, ndlen);
  for (int i = 0; i < 6; i++) if (ndlen[i] > longest) longest = ndlen[i];
  at = hlen ? data[2] % (hlen + 1) : 0;
  {
    size_t extra = plant < 6 ? ndlen[plant] : 0;
    hay = malloc(hlen + extra + 1);
    if (hay == NULL) die("out of memory");
    memcpy(hay, rest, at);
    if (extra) memcpy(hay + at, nd[plant], extra);
    memcpy(hay + at + extra, rest + at, hlen - at);
    hlen += extra;
  }
  cap = data[4] < 128 ? SIZE_MAX : (size_t)(data[4] - 128) * (hlen + 1) / 127;
  out = malloc(hlen + 1);
  if (out == NULL) die("out of memory");
  if (sbx_reflect_new((const char *)key, klen, &f) != 0) die("sbx_reflect_new failed");
  if (sbx_reflect_carry(f) != longest - 1) die("carry is not the longest form minus one");
  if (sbx_reflect_stream_new(f, cap, &s) != 0) die("sbx_reflect_stream_new failed");
  while (pos < hlen || (seed & 3) == 0) {
    size_t n, elen, want;
    const char *e;
    int rc;
    seed = seed * 1103515245u + 12345u;
    n = (seed >> 16) % 97;
    if (n > hlen - pos) n = hlen - pos;
    /* A copy of exactly the chunk, so a read past it is caught. */
    uint8_t *chunk = malloc(n ? n : 1);
    if (chunk == NULL) die("out of memory");
    memcpy(chunk, hay + pos, n);
    rc = sbx_reflect_stream_push(s, (const char *)chunk, n, &e, &elen);
    free(chunk);
    pos += n;
    if (naive_hit(hay, pos, nd, ndlen)) {
      if (rc != SBX_EREFLECT) die("a needle in the bytes so far was not reported");
      failed = rc;
      break;
    }
    if (pos > cap) {
      if (rc != SBX_ETOOBIG) die("the cap was passed without too large");
      failed = rc;
      break;
    }
    if (rc != 0) die("a clean chunk failed");
    want = pos > longest - 1 ? pos - (longest - 1) : 0;
    if (outlen + elen != want) die("emitted bytes are not the input minus the carry");
    memcpy(out + outlen, e, elen);
    outlen += elen;
    if (pos == hlen && (seed & 1)) break;
  }
  if (failed) {
    const char *e;
    size_t elen;
    if (sbx_reflect_stream_push(s, "x", 1, &e, &elen) != failed) die("failure not sticky");
    if (sbx_reflect_stream_finish(s, &e, &elen) != failed) die("failure not sticky at finish");
  } else {
    const char *e;
    size_t elen;
    if (sbx_reflect_stream_finish(s, &e, &elen) != 0) die("finish failed");
    memcpy(out + outlen, e, elen);
    outlen += elen;
    if (outlen != hlen || memcmp(out, hay, hlen) != 0) die("emitted bytes differ from the input");
    if (sbx_reflect_stream_total(s) != hlen) die("total differs");
  }
  sbx_reflect_stream_free(s);
  sbx_reflect_free(f);
  free(out);
  free(hay);
  return 0;
}
