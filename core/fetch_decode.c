/*
 * fetch_decode.c: the bounded body of one safe-fetch attempt (see
 * fetch_decode.h; shared/spec/fetch-and-delegation.md 1.12 steps 4-6).
 *
 * A decoder never produces more than the remaining budget plus one byte:
 * the output buffer grows to at most maxBytes + 1, and one byte over is
 * BODY_TOO_LARGE, so a bomb stops after maxBytes + 1 decoded bytes. gzip may
 * carry several members (each must be gzip); deflate is zlib-wrapped when its
 * first two bytes say so, raw otherwise; bytes after the end of a deflate or
 * brotli stream are a decode error. Nothing here logs or calls curl.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fetch_decode.h"
#include "fetch_internal.h"

#define BUF_STEP 65536

int sbx__body_coding(const char *v, size_t l) {
  if (l == 8 && strncasecmp(v, "identity", 8) == 0) return SBX__CODING_IDENTITY;
  if (l == 4 && strncasecmp(v, "gzip", 4) == 0) return SBX__CODING_GZIP;
  if (l == 7 && strncasecmp(v, "deflate", 7) == 0) return SBX__CODING_DEFLATE;
  if (l == 2 && strncasecmp(v, "br", 2) == 0) return SBX__CODING_BR;
  return -1;
}

void sbx__body_free(sbx__body_t *b) {
  if (b->started && (b->coding == SBX__CODING_GZIP || b->coding == SBX__CODING_DEFLATE)) inflateEnd(&b->z);
  b->started = 0;
  if (b->br != NULL) BrotliDecoderDestroyInstance(b->br);
  b->br = NULL;
  free(b->buf);
  b->buf = NULL;
}


/* Makes room for at least `need` more bytes, never past max + 1.
 * Returns 0, -1 (would pass the cap) or -2 (out of memory). */
static int reserve(sbx__body_t *b, size_t need) {
  size_t limit = b->max + 1, cap;
  char *nb;
  if (b->cap - b->len >= need) return 0;
  if (need > limit - b->len) return -1;
  cap = b->cap < BUF_STEP ? BUF_STEP : b->cap;
  while (cap - b->len < need) cap = cap > limit / 2 ? limit : cap * 2;
  if (cap > limit) cap = limit;
  nb = realloc(b->buf, cap);
  if (nb == NULL) return -2;
  b->buf = nb;
  b->cap = cap;
  return 0;
}

/* Room for at least one more decoded byte. */
static int grow(sbx__body_t *b) { return reserve(b, 1); }

/* Feeds n wire bytes to the decoder. Returns 0 or a kind. */
static int decode(sbx__body_t *b, const unsigned char *p, size_t n) {
  while (n > 0 || (b->coding == SBX__CODING_BR && b->br != NULL && BrotliDecoderHasMoreOutput(b->br))) {
    int g;
    if (b->ended == 2 && n > 0) {                /* gzip: the next member */
      if (inflateReset(&b->z) != Z_OK) return SBX__ATT_DECODE;
      b->ended = 0;
    }
    if (b->ended) return SBX__ATT_DECODE;              /* bytes after the end */
    if (!b->started) {
      int wb;
      if (b->coding == SBX__CODING_BR) {
        b->br = BrotliDecoderCreateInstance(NULL, NULL, NULL);
        if (b->br == NULL) return SBX__ATT_NOMEM;
      } else {
        memset(&b->z, 0, sizeof b->z);
        if (b->coding == SBX__CODING_GZIP) wb = 16 + 15;
        else if (n >= 2 && (p[0] & 0x0f) == 8 && (p[0] >> 4) <= 7 &&
                 ((unsigned)p[0] * 256 + p[1]) % 31 == 0) wb = 15;
        else wb = -15;
        if (inflateInit2(&b->z, wb) != Z_OK) return SBX__ATT_NOMEM;
      }
      b->started = 1;
    }
    g = grow(b);
    if (g == -2) return SBX__ATT_NOMEM;
    if (g == -1) return SBX__ATT_BODY_TOO_LARGE;
    if (b->coding == SBX__CODING_BR) {
      size_t in_left = n, out_left = b->cap - b->len;
      const uint8_t *in = p;
      uint8_t *out = (uint8_t *)b->buf + b->len;
      BrotliDecoderResult br = BrotliDecoderDecompressStream(b->br, &in_left, &in, &out_left, &out, NULL);
      b->len = b->cap - out_left;
      p = in;
      n = in_left;
      if (b->len > b->max) return SBX__ATT_BODY_TOO_LARGE;
      if (br == BROTLI_DECODER_RESULT_ERROR) return SBX__ATT_DECODE;
      if (br == BROTLI_DECODER_RESULT_SUCCESS) {
        b->ended = 1;
        if (n > 0) return SBX__ATT_DECODE;
        return 0;
      }
      if (br == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT && n == 0) return 0;
    } else {
      int zr;
      b->z.next_in = (Bytef *)p;
      b->z.avail_in = (uInt)(n > UINT32_MAX ? UINT32_MAX : n);
      b->z.next_out = (Bytef *)b->buf + b->len;
      b->z.avail_out = (uInt)(b->cap - b->len);
      zr = inflate(&b->z, Z_NO_FLUSH);
      b->len = b->cap - b->z.avail_out;
      n -= (size_t)((const unsigned char *)b->z.next_in - p);
      p = b->z.next_in;
      if (b->len > b->max) return SBX__ATT_BODY_TOO_LARGE;
      if (zr == Z_STREAM_END) {
        if (b->coding == SBX__CODING_GZIP) {
          /* another member may follow; one that is not gzip fails later */
          if (n > 0) { if (inflateReset(&b->z) != Z_OK) return SBX__ATT_DECODE; }
          else { b->ended = 2; return 0; }
          continue;
        }
        b->ended = 1;
        if (n > 0) return SBX__ATT_DECODE;
        return 0;
      }
      if (zr == Z_BUF_ERROR && n == 0) return 0;
      if (zr != Z_OK && zr != Z_BUF_ERROR) return SBX__ATT_DECODE;
      if (zr == Z_OK && n == 0 && b->z.avail_out > 0) return 0;
    }
  }
  return 0;
}

int sbx__body_finish(const sbx__body_t *b) {
  if (b->coding == SBX__CODING_IDENTITY) return SBX__ATT_OK;
  if (b->wire == 0) return SBX__ATT_OK;                    /* empty body, nothing to decode */
  if (b->coding == SBX__CODING_DEFLATE && !b->started) return SBX__ATT_DECODE;
  return b->ended ? SBX__ATT_OK : SBX__ATT_DECODE;
}

int sbx__body_feed(sbx__body_t *b, const unsigned char *p, size_t n) {
  if (n > b->max - b->wire)                   /* invariant: wire <= max */
    return b->coding == SBX__CODING_IDENTITY ? SBX__ATT_BODY_TOO_LARGE : SBX__ATT_WIRE_TOO_LARGE;
  b->wire += n;
  if (b->coding == SBX__CODING_IDENTITY) {
    /* one allocation for a declared length (already checked against the cap) */
    int g = reserve(b, b->len == 0 && b->declared > n ? b->declared : n);
    if (g != 0) return g == -2 ? SBX__ATT_NOMEM : SBX__ATT_BODY_TOO_LARGE;
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    return 0;
  }
  if (b->coding == SBX__CODING_DEFLATE && !b->started && n < 2) {
    /* too short to tell zlib from raw: raw deflate it is */
    memset(&b->z, 0, sizeof b->z);
    if (inflateInit2(&b->z, -15) != Z_OK) return SBX__ATT_NOMEM;
    b->started = 1;
  }
  return decode(b, p, n);
}

