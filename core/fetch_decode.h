/*
 * fetch_decode.h: the body of one safe-fetch attempt, bounded as its bytes
 * arrive (shared/spec/fetch-and-delegation.md 1.12 steps 4-6): the wire
 * bytes against maxBytes, then identity, gzip (any number of members),
 * deflate (zlib or raw) or brotli decoded into at most maxBytes + 1 bytes,
 * so a decompression bomb stops, it is never buffered. fetch_decode.c;
 * used by the attempt (fetch_attempt.c) only.
 */
#ifndef SBX_FETCH_DECODE_H
#define SBX_FETCH_DECODE_H

#include <stddef.h>

#include <brotli/decode.h>
#include <zlib.h>

enum { SBX__CODING_IDENTITY = 0, SBX__CODING_GZIP, SBX__CODING_DEFLATE, SBX__CODING_BR };

typedef struct sbx__body {
  size_t max;                /* maxBytes: wire and decoded bytes stay within it */
  size_t declared;           /* a valid Content-Length (<= max), else 0 */
  int coding;                /* SBX__CODING_* (sbx__body_coding) */
  size_t wire;               /* wire bytes fed so far */
  char *buf;                 /* decoded bytes (malloc'd), cap <= max + 1 */
  size_t len, cap;
  int started, ended;        /* decoder state; ended 2: a gzip member ended */
  z_stream z;
  BrotliDecoderState *br;
} sbx__body_t;

/* The coding a Content-Encoding value names (case-insensitive), or -1 for
 * one safe fetch does not decode. */
int sbx__body_coding(const char *v, size_t n);

/* Takes n more wire bytes. Returns 0, or the SBX__ATT_* kind that ends the
 * attempt (BODY_TOO_LARGE, WIRE_TOO_LARGE, DECODE, NOMEM). */
int sbx__body_feed(sbx__body_t *b, const unsigned char *p, size_t n);

/* At a clean end of the transfer: SBX__ATT_OK, or SBX__ATT_DECODE when the
 * coded stream was cut short. */
int sbx__body_finish(const sbx__body_t *b);

/* Ends the decoder and frees the bytes (buf NULL: taken by the caller). */
void sbx__body_free(sbx__body_t *b);

#endif
