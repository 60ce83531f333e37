/*
 * scrub_fuzz.c: libFuzzer harness for scrub_diagnostic (core/scrub.c,
 * shared/spec/fetch-and-delegation.md section 2).
 *
 * Input layout: bytes 0-1 pick max: byte 0 == 0 no bound (+INFINITY),
 * 1 the integral 1e18 (must give the unbounded result), 2 an invalid limit
 * (byte 1 picks NaN, 0.5, -inf, 0 or 1.5; must give SBX_SCRUB_E_LIMIT),
 * otherwise 1 + (bytes 0-1 as a 16-bit number) % 700. Byte 2 picks a secret
 * to plant: none, `password=<token derived from the input>`, a fixed ` ghp_`
 * token or ` Bearer <credential-shaped run> `; byte 3 where to plant it. The
 * rest is the text, copied to a buffer of its exact size so ASan catches a
 * read past its end.
 *
 * Invariants on every input: the call returns 0; the output is valid UTF-8
 * of *out_len bytes with a NUL after them; it has at most max code points;
 * no C0 control but tab and LF and no DEL; it neither starts nor ends with
 * white space (spec 3.2); the planted secret is gone (unless the text
 * already held it); with no `]` in the text, no `]]` appears. Time:
 * libFuzzer's -timeout catches a blow-up.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sbx_scrub.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "scrub_fuzz: %s\n", #c); abort(); } } while (0)

static const char GHP[] = "ghp_Zq8xV3kLm9Tn2Rw5Yb7c";
static const char BEARER_RUN[] = "A1b2C3d4e5F6g7H8";

/* Length of the valid UTF-8 sequence at p (strict), or 0. */
static size_t seq(const unsigned char *p, size_t n, unsigned long *cp) {
  unsigned c = p[0];
  if (c < 0x80) { *cp = c; return 1; }
  if (c >= 0xC2 && c < 0xE0 && n >= 2 && (p[1] & 0xC0) == 0x80) {
    *cp = ((unsigned long)(c & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c < 0xF0 && n >= 3 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80) {
    *cp = ((unsigned long)(c & 0x0F) << 12) | ((unsigned long)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return *cp >= 0x800 && (*cp < 0xD800 || *cp > 0xDFFF) ? 3 : 0;
  }
  if (c >= 0xF0 && c < 0xF5 && n >= 4 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80 &&
      (p[3] & 0xC0) == 0x80) {
    *cp = ((unsigned long)(c & 0x07) << 18) | ((unsigned long)(p[1] & 0x3F) << 12) |
          ((unsigned long)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return *cp >= 0x10000 && *cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

static int trim_space(unsigned long cp) {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

static void check_output(const char *out, size_t len, double max) {
  const unsigned char *s = (const unsigned char *)out;
  size_t i = 0, cps = 0;
  unsigned long cp = 0, first = 0, last = 0;
  CHECK(out != NULL && out[len] == '\0');
  while (i < len) {
    size_t k = seq(s + i, len - i, &cp);
    CHECK(k != 0);
    CHECK(cp >= 0x20 ? cp != 0x7F : (cp == '\t' || cp == '\n'));
    if (cps == 0) first = cp;
    last = cp;
    cps++;
    i += k;
  }
  CHECK(isinf(max) || (double)cps <= max);
  CHECK(cps == 0 || (!trim_space(first) && !trim_space(last)));
}

/* A token derived from the input (FNV-1a), letters and digits only. */
static void derived_token(const uint8_t *data, size_t size, char tok[24]) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ULL;
  snprintf(tok, 24, "Pk%016llXz9", (unsigned long long)h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const double bad[] = {NAN, 0.5, -INFINITY, 0.0, 1.5};
  char tok[24], plant[64], *out = NULL, *ref = NULL, *text;
  const char *secret = NULL;
  size_t tlen, plen = 0, at, out_len, ref_len;
  double max;
  int rc;
  if (size < 4) return 0;
  if (data[0] == 0) max = INFINITY;
  else if (data[0] == 1) max = 1e18;
  else if (data[0] == 2) max = bad[data[1] % 5];
  else max = 1 + (double)(((unsigned)data[0] << 8 | data[1]) % 700);

  derived_token(data, size, tok);
  switch (data[2] % 4) {
  case 1: plen = (size_t)snprintf(plant, sizeof plant, "password=%s", tok); secret = tok; break;
  case 2: plen = (size_t)snprintf(plant, sizeof plant, " %s ", GHP); secret = GHP; break;
  case 3: plen = (size_t)snprintf(plant, sizeof plant, " Bearer %s ", BEARER_RUN); secret = BEARER_RUN; break;
  default: break;
  }
  tlen = size - 4;
  at = data[3] % (tlen + 1);
  text = malloc(tlen + plen ? tlen + plen : 1);
  CHECK(text != NULL);
  memcpy(text, data + 4, at);
  memcpy(text + at, plant, plen);
  memcpy(text + at + plen, data + 4 + at, tlen - at);
  tlen += plen;

  rc = sbx_scrub_diagnostic(text, tlen, max, &out, &out_len);
  if (data[0] == 2) {
    CHECK(rc == SBX_SCRUB_E_LIMIT && out == NULL);
    CHECK(strcmp(sbx_scrub_strerror(rc), "Invalid diagnostic limit") == 0);
    free(text);
    return 0;
  }
  CHECK(rc == 0);
  check_output(out, out_len, max);
  /* (Unless the fuzzer wrote the secret into the text itself, unplanted.) */
  if (secret && !memmem(data + 4, size - 4, secret, strlen(secret)))
    CHECK(memmem(out, out_len, secret, strlen(secret)) == NULL);
  if (!memchr(text, ']', tlen)) CHECK(memmem(out, out_len, "]]", 2) == NULL);
  if (data[0] == 1) {
    CHECK(sbx_scrub_diagnostic(text, tlen, INFINITY, &ref, &ref_len) == 0);
    CHECK(ref_len == out_len && memcmp(ref, out, out_len) == 0);
    free(ref);
  }
  free(out);
  free(text);
  return 0;
}
