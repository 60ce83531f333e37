/*
 * utf8_put.h: UTF-8 writing shared by the core's JSON (core/json.c) and the
 * worker's text primitives (worker/utf8.c). Header-only, so the worker takes
 * it without linking anything more of the core.
 */
#ifndef SBX_UTF8_PUT_H
#define SBX_UTF8_PUT_H

#include <stddef.h>

/* Writes code point cp (at most U+10FFFF, not a surrogate) as UTF-8 into out
 * (room for 4 bytes); returns its length. */
static inline size_t sbx__utf8_put(char *out, unsigned long cp) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

#endif
