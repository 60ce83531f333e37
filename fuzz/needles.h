/*
 * needles.h: the six needles of one key built naively, byte by byte, for the
 * harnesses that check the reflection filter against a reference
 * (reflect_fuzz.c, reflect_stream_fuzz.c). Header-only: each harness is its
 * own program.
 */
#ifndef SBX_FUZZ_NEEDLES_H
#define SBX_FUZZ_NEEDLES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEY 64

static inline void die(const char *what) {
  fprintf(stderr, "fuzz: %s\n", what);
  abort();
}

/* The six needles, naively; out[i] gets needle i, len[i] its length. */
static inline void build_needles(const uint8_t *k, size_t n, char out[6][4 * MAX_KEY + 8], size_t len[6]) {
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

#endif
