/*
 * demux_fuzz.c: libFuzzer harness for Docker's log-frame demultiplexing
 * (core/docker_demux.c, spec/rich-mode.md 5.4).
 *
 * Byte 0 picks the mode. Even: the rest is taken as a log buffer and the
 * answer is compared with a reference written here (walk whole frames; an
 * invalid header anywhere, including the first bytes of a cut-off last one,
 * or no complete frame, means "the whole buffer"). Odd: the rest is cut into
 * payloads (lengths from byte 1's seed), each framed with a stream byte
 * 0-2, optionally followed by a cut-off frame; the answer must be exactly
 * the payloads joined. The output never exceeds the input (ASan checks the
 * buffer is used within its size).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "docker_demux.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

/* The reference: 1 with the payloads in out/*olen, 0 for "whole buffer". */
static int reference(const uint8_t *b, size_t n, uint8_t *out, size_t *olen) {
  size_t i = 0, frames = 0;
  *olen = 0;
  while (i < n) {
    size_t k;
    uint32_t len;
    if (b[i] > 2) return 0;
    for (k = 1; k <= 3; k++) if (i + k < n && b[i + k] != 0) return 0;
    if (n - i < 8) break;
    len = (uint32_t)b[i + 4] << 24 | (uint32_t)b[i + 5] << 16 | (uint32_t)b[i + 6] << 8 | b[i + 7];
    if (len > n - i - 8) break;
    memcpy(out + *olen, b + i + 8, len);
    *olen += len;
    i += 8 + len;
    frames++;
  }
  return frames > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf, *out, *ref;
  size_t n, olen, rlen;
  int framed, want;
  if (size < 2) return 0;
  if ((data[0] & 1) == 0) {
    n = size - 1;
    buf = malloc(n ? n : 1);
    CHECK(buf != NULL);
    memcpy(buf, data + 1, n);
  } else {
    const uint8_t *p = data + 2;
    size_t left = size - 2, at = 0;
    unsigned seed = data[1] * 2654435761u + 3;
    buf = malloc(left * 9 + 16);              /* at worst one header per byte */
    CHECK(buf != NULL);
    n = 0;
    while (left > 0) {
      size_t len;
      seed = seed * 1103515245u + 12345u;
      len = 1 + (seed >> 16) % 40;           /* zero-length frames: the even mode */
      if (len > left) len = left;
      buf[n] = (uint8_t)((seed >> 8) % 3);
      buf[n + 1] = buf[n + 2] = buf[n + 3] = 0;
      buf[n + 4] = (uint8_t)(len >> 24); buf[n + 5] = (uint8_t)(len >> 16);
      buf[n + 6] = (uint8_t)(len >> 8); buf[n + 7] = (uint8_t)len;
      memcpy(buf + n + 8, p + at, len);
      n += 8 + len;
      at += len;
      left -= len;
    }
    if (data[1] & 1) {                         /* a cut-off last frame */
      static const uint8_t cut[] = {1, 0, 0, 0, 0, 0, 0, 9, 'x'};
      memcpy(buf + n, cut, (data[1] >> 1) % sizeof cut + 1);
      n += (data[1] >> 1) % sizeof cut + 1;
    }
    out = malloc(n ? n : 1);
    CHECK(out != NULL);
    olen = sbx__docker_demux(buf, n, out, &framed);
    CHECK(framed == (at > 0));
    CHECK(olen == at && memcmp(out, p, at) == 0);
    free(out);
    free(buf);
    return 0;
  }
  out = malloc(n ? n : 1);
  ref = malloc(n ? n : 1);
  CHECK(out != NULL && ref != NULL);
  olen = sbx__docker_demux(buf, n, out, &framed);
  want = reference(buf, n, ref, &rlen);
  CHECK(framed == want);
  CHECK(olen <= n);
  if (want) CHECK(olen == rlen && memcmp(out, ref, rlen) == 0);
  else CHECK(olen == 0);
  CHECK(sbx__docker_demux(buf, n, NULL, &framed) == olen);
  free(out);
  free(ref);
  free(buf);
  return 0;
}
