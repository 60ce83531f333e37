/*
 * reflect.c: the credential reflection filter (spec/broker.md section 12).
 *
 * A filter holds the six encodings of one credential: raw, URI component
 * (uppercase %XX outside A-Z a-z 0-9 - _ . ! ~ * ' ( )), standard base64
 * with padding, base64url without padding, lowercase hex and uppercase hex.
 * Needles that another needle already implies are dropped: duplicates (the
 * URI form of an all-unreserved key is the raw key) and needles that contain
 * a shorter needle (padded base64 contains base64url when the key encodes
 * without '+' or '/'); any occurrence of the longer one is an occurrence of
 * the shorter one, so the answer never changes.
 *
 * Scanning is one pass over the haystack for all needles at once:
 *  - shortest needle >= WM_MIN_NEEDLE bytes (the usual case): Wu-Manber, a
 *    multi-needle Horspool on 2-byte blocks. A window as long as the
 *    shortest needle slides along; the block at its end says how far it may
 *    jump (up to the window length) without passing the start of any needle.
 *    Blocks found in no needle take a constant stride, which lets the CPU run
 *    several steps ahead (the trick that makes glibc's memmem fast).
 *  - shorter needles: SSE2 compares every needle's first byte at each start
 *    position and its last byte at start + len - 1, 16 positions at a time
 *    (a portable scalar loop without SSE2).
 * Candidates are verified with memcmp. A per-call verification budget hands
 * a pathological haystack (needle ends matching everywhere) to glibc memmem,
 * which is linear, so no input costs O(n * m).
 *
 * The same scanner serves any small fixed set of needles (sbx__needles_new,
 * needles.h): the SSE watch's "could this event be an error" test.
 *
 * Pure C: no Lua here (its binding, core.reflect_filter, is reflect_lua.c),
 * so json.c can scan with it without meeting the binding, which decodes
 * JSON itself.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "bounds.h"
#include "needles.h"
#include "reflect.h"

#define REFLECT_NEEDLES 6

/* Wu-Manber shift table: 2-byte blocks hashed to WM_BITS bits. */
#define WM_BITS 12
#define WM_SIZE (1u << WM_BITS)
#define WM_HASH(a, b) ((((unsigned)(a) << 5) ^ (unsigned)(b)) & (WM_SIZE - 1))
/* Shortest needle length from which the skipping scan beats SSE2. */
#ifndef WM_MIN_NEEDLE
#define WM_MIN_NEEDLE 5
#endif

typedef struct {
  const unsigned char *s;
  size_t len;
} needle_t;

struct sbx_reflect {
  size_t n;                         /* distinct needles kept, 1..6 */
  size_t minlen, maxlen;            /* shortest and longest kept needle */
  size_t longest;                   /* longest of all six forms (before pruning) */
  needle_t nd[REFLECT_NEEDLES];
  size_t shift_max;                 /* shift of a block in no needle */
  unsigned char near[WM_SIZE];      /* shift_max - shift of each block hash */
  unsigned char store[];            /* the needle bytes, back to back */
};

/* ------------------------------------------------------------------ */
/* Needles                                                             */
/* ------------------------------------------------------------------ */

static int uri_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
         c == '!' || c == '~' || c == '*' || c == '\'' || c == '(' || c == ')';
}

static size_t enc_uri(unsigned char *out, const unsigned char *k, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (uri_unreserved(k[i])) {
      out[o++] = k[i];
    } else {
      out[o++] = '%';
      out[o++] = (unsigned char)hex[k[i] >> 4];
      out[o++] = (unsigned char)hex[k[i] & 15];
    }
  }
  return o;
}

/* Base64 of k[0..n): standard alphabet with '=' padding, or url-safe
 * ('-', '_') without padding. */
static size_t enc_b64(unsigned char *out, const unsigned char *k, size_t n, int url) {
  const char *abc = url
    ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)k[i] << 16 | (uint32_t)k[i + 1] << 8 | k[i + 2];
    out[o++] = (unsigned char)abc[v >> 18];
    out[o++] = (unsigned char)abc[(v >> 12) & 63];
    out[o++] = (unsigned char)abc[(v >> 6) & 63];
    out[o++] = (unsigned char)abc[v & 63];
  }
  if (n - i == 1) {
    uint32_t v = (uint32_t)k[i] << 16;
    out[o++] = (unsigned char)abc[v >> 18];
    out[o++] = (unsigned char)abc[(v >> 12) & 63];
    if (!url) {
      out[o++] = '=';
      out[o++] = '=';
    }
  } else if (n - i == 2) {
    uint32_t v = (uint32_t)k[i] << 16 | (uint32_t)k[i + 1] << 8;
    out[o++] = (unsigned char)abc[v >> 18];
    out[o++] = (unsigned char)abc[(v >> 12) & 63];
    out[o++] = (unsigned char)abc[(v >> 6) & 63];
    if (!url) out[o++] = '=';
  }
  return o;
}

static size_t enc_hex(unsigned char *out, const unsigned char *k, size_t n, int upper) {
  const char *hex = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = (unsigned char)hex[k[i] >> 4];
    out[2 * i + 1] = (unsigned char)hex[k[i] & 15];
  }
  return 2 * n;
}

static int contains(const needle_t *big, const needle_t *small) {
  return small->len <= big->len &&
         memmem(big->s, big->len, small->s, small->len) != NULL;
}

/*
 * Keeps, in order of increasing length, each needle that contains no needle
 * kept before it (equal needles included).
 */
static void prune(struct sbx_reflect *f, needle_t *all, size_t count) {
  for (size_t i = 1; i < count; i++) {            /* insertion sort by length */
    needle_t t = all[i];
    size_t j = i;
    while (j > 0 && all[j - 1].len > t.len) {
      all[j] = all[j - 1];
      j--;
    }
    all[j] = t;
  }
  f->n = 0;
  f->maxlen = 0;
  for (size_t i = 0; i < count; i++) {
    int redundant = 0;
    for (size_t j = 0; j < f->n && !redundant; j++) redundant = contains(&all[i], &f->nd[j]);
    if (redundant) continue;
    f->nd[f->n++] = all[i];
    if (all[i].len > f->maxlen) f->maxlen = all[i].len;
  }
  f->minlen = f->nd[0].len;
}

/*
 * Shift of each 2-byte block: how far a window of minlen bytes ending in
 * that block may move without passing the start of a needle, from every
 * needle's first minlen bytes; at most 255 (any smaller shift is safe too).
 * Stored as near = shift_max - shift, so a block in no needle is 0.
 */
static void build_shifts(struct sbx_reflect *f) {
  size_t m = f->minlen, dmax = m - 1 > 255 ? 255 : m - 1;
  f->shift_max = dmax;
  memset(f->near, 0, sizeof f->near);
  for (size_t k = 0; k < f->n; k++) {
    const unsigned char *s = f->nd[k].s;
    for (size_t j = 1; j < m; j++) {
      size_t sh = m - 1 - j;
      unsigned char *e = &f->near[WM_HASH(s[j - 1], s[j])];
      if (sh < dmax && dmax - sh > *e) *e = (unsigned char)(dmax - sh);
    }
  }
}

int sbx_reflect_new(const char *key, size_t len, sbx_reflect_t **out) {
  const unsigned char *k = (const unsigned char *)key;
  size_t b64 = 4 * ((len + 2) / 3);
  size_t total = len + 3 * len + 2 * b64 + 4 * len;
  needle_t all[REFLECT_NEEDLES];
  struct sbx_reflect *f;
  unsigned char *p;
  *out = NULL;
  if (key == NULL || len == 0 || len > SBX_MAX_CREDENTIAL_BYTES) return SBX_EINVAL;
  f = malloc(sizeof *f + total);
  if (f == NULL) return -ENOMEM;
  p = f->store;
  memcpy(p, k, len);
  all[0] = (needle_t){p, len};
  p += len;
  all[1] = (needle_t){p, enc_uri(p, k, len)};
  p += all[1].len;
  all[2] = (needle_t){p, enc_b64(p, k, len, 0)};
  p += all[2].len;
  all[3] = (needle_t){p, enc_b64(p, k, len, 1)};
  p += all[3].len;
  all[4] = (needle_t){p, enc_hex(p, k, len, 0)};
  p += all[4].len;
  all[5] = (needle_t){p, enc_hex(p, k, len, 1)};
  f->longest = 0;
  for (size_t i = 0; i < REFLECT_NEEDLES; i++)
    if (all[i].len > f->longest) f->longest = all[i].len;
  prune(f, all, REFLECT_NEEDLES);
  if (f->minlen >= WM_MIN_NEEDLE) build_shifts(f);
  *out = f;
  return 0;
}

int sbx__needles_new(const char *const *needles, const size_t *lens, size_t count,
                     sbx_reflect_t **out) {
  needle_t all[REFLECT_NEEDLES];
  size_t total = 0, i;
  struct sbx_reflect *f;
  unsigned char *p;
  *out = NULL;
  if (count == 0 || count > REFLECT_NEEDLES) return SBX_EINVAL;
  for (i = 0; i < count; i++) {
    if (needles[i] == NULL || lens[i] == 0 || lens[i] > SBX_MAX_CREDENTIAL_BYTES) return SBX_EINVAL;
    total += lens[i];
  }
  f = malloc(sizeof *f + total);
  if (f == NULL) return -ENOMEM;
  p = f->store;
  f->longest = 0;
  for (i = 0; i < count; i++) {
    memcpy(p, needles[i], lens[i]);
    all[i] = (needle_t){p, lens[i]};
    p += lens[i];
    if (lens[i] > f->longest) f->longest = lens[i];
  }
  prune(f, all, count);
  if (f->minlen >= WM_MIN_NEEDLE) build_shifts(f);
  *out = f;
  return 0;
}

size_t sbx_reflect_carry(const sbx_reflect_t *f) {
  return f->longest - 1;
}

void sbx_reflect_free(sbx_reflect_t *f) {
  free(f);
}

/* ------------------------------------------------------------------ */
/* Scanning                                                            */
/* ------------------------------------------------------------------ */

/*
 * Work budget: bytes that candidate verifications (memcmp) may compare per
 * call before the scan hands the rest of the haystack to glibc memmem
 * (linear time), so a haystack crafted to match needle ends everywhere
 * costs O(n), not O(n * m).
 */
static size_t verify_budget(size_t len) {
  return 2 * len + 16384;
}

/*
 * Whether needle nd starts at h[at] (h holds len bytes): 1 yes, 0 no, -1
 * when the memcmp would pass the budget (*budget, in bytes).
 */
static inline int needle_at(const needle_t *nd, const unsigned char *h, size_t at, size_t len,
                            size_t *budget) {
  if (nd->len > len - at || h[at] != nd->s[0] || h[at + nd->len - 1] != nd->s[nd->len - 1])
    return 0;
  if (nd->len <= 2) return 1;
  if (*budget < nd->len) return -1;
  *budget -= nd->len;
  return memcmp(h + at + 1, nd->s + 1, nd->len - 2) == 0;
}

/* Every needle over h[from..len) with memmem: the slow-but-linear path. */
static int scan_memmem(const sbx_reflect_t *f, const unsigned char *h, size_t from, size_t len) {
  for (size_t k = 0; k < f->n; k++)
    if (memmem(h + from, len - from, f->nd[k].s, f->nd[k].len) != NULL) return 1;
  return 0;
}

/*
 * Wu-Manber (multi-needle Horspool on 2-byte blocks): a window of the
 * shortest needle's length m slides over the haystack; the last two bytes
 * of the window pick how far it may move without skipping any start of any
 * needle (from the needles' first m bytes). Only a shift of 0 leads to a
 * check of every needle at the window's start. Kept out of line so the
 * short-string exit of sbx_reflect_hit stays cheap.
 */
__attribute__((noinline))
static int scan_wm(const sbx_reflect_t *f, const unsigned char *h, size_t len) {
  const size_t m = f->minlen, dmax = f->shift_max;
  size_t i = m - 1;                               /* last byte of the window */
  size_t budget = verify_budget(len);
  for (;;) {
    unsigned e;
    /* Blocks in no needle (entry 0): a constant stride, so the next loads
     * do not wait for this step's table lookup. */
    while ((e = f->near[WM_HASH(h[i - 1], h[i])]) == 0) {
      i += dmax;
      if (i >= len) return 0;
    }
    if (e != dmax) {
      i += dmax - e;
      if (i >= len) return 0;
      continue;
    }
    size_t at = i - (m - 1);
    for (size_t k = 0; k < f->n; k++) {
      int rc = needle_at(&f->nd[k], h, at, len, &budget);
      if (rc != 0) return rc > 0 ? 1 : scan_memmem(f, h, at, len);
    }
    if (++i >= len) return 0;
  }
}

/* Positions [from, to) of needle nd, byte by byte. */
static int scan_scalar(const needle_t *nd, const unsigned char *h, size_t from, size_t to,
                       size_t len, size_t *budget) {
  unsigned char first = nd->s[0];
  for (size_t i = from; i < to; i++) {
    if (h[i] != first) continue;
    int rc = needle_at(nd, h, i, len, budget);
    if (rc != 0) return rc;
  }
  return 0;
}

#ifdef __SSE2__
/* Candidate bits of needle nd for the 16 start positions at h. */
static inline unsigned block_mask(const needle_t *nd, __m128i a, const unsigned char *h,
                                  __m128i first, __m128i last) {
  __m128i b = _mm_loadu_si128((const __m128i *)(h + nd->len - 1));
  return (unsigned)_mm_movemask_epi8(
      _mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, last)));
}

/* Checks the candidates of mask m at block i: 1 hit, 0 none, -1 budget out. */
static inline int verify_mask(const needle_t *nd, const unsigned char *h, size_t i,
                              unsigned m, size_t *budget) {
  while (m != 0) {
    size_t at = i + (size_t)__builtin_ctz(m);
    if (nd->len <= 2) return 1;
    if (*budget < nd->len) return -1;
    *budget -= nd->len;
    if (memcmp(h + at + 1, nd->s + 1, nd->len - 2) == 0) return 1;
    m &= m - 1;
  }
  return 0;
}

/* Start positions [from, npos) of one needle, 16 at a time; the last block
 * overlaps the one before rather than reading past the haystack. */
static int scan_tail(const needle_t *nd, const unsigned char *h, size_t from, size_t npos,
                     size_t len, size_t *budget) {
  __m128i first, last;
  if (npos - from < 16) {
    if (npos < 16) return scan_scalar(nd, h, from, npos, len, budget);
    from = npos - 16;
  }
  first = _mm_set1_epi8((char)nd->s[0]);
  last = _mm_set1_epi8((char)nd->s[nd->len - 1]);
  for (size_t i = from;; i += 16) {
    if (i > npos - 16) i = npos - 16;
    __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
    unsigned m = block_mask(nd, a, h + i, first, last);
    if (m != 0) {
      int rc = verify_mask(nd, h, i, m, budget);
      if (rc != 0) return rc;
    }
    if (i == npos - 16) return 0;
  }
}

/*
 * Short needles: one pass over 16-byte blocks comparing, for every needle,
 * the first byte at each start position and the last byte at start + len - 1
 * (SSE2); candidates are verified with memcmp.
 */
__attribute__((noinline))
static int scan_short(const sbx_reflect_t *f, const unsigned char *h, size_t len) {
  __m128i first[REFLECT_NEEDLES], last[REFLECT_NEEDLES];
  size_t n = f->n, i = 0, common, budget = verify_budget(len);
  int rc;
  if (len >= f->maxlen + 15) {
    /* Blocks where every needle has 16 start positions: one pass. */
    common = len - f->maxlen + 1;
    for (size_t k = 0; k < n; k++) {
      first[k] = _mm_set1_epi8((char)f->nd[k].s[0]);
      last[k] = _mm_set1_epi8((char)f->nd[k].s[f->nd[k].len - 1]);
    }
    for (; i + 16 <= common; i += 16) {
      __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
      for (size_t k = 0; k < n; k++) {
        unsigned m = block_mask(&f->nd[k], a, h + i, first[k], last[k]);
        if (m != 0 && (rc = verify_mask(&f->nd[k], h, i, m, &budget)) != 0)
          return rc > 0 ? 1 : scan_memmem(f, h, i, len);
      }
    }
  }
  for (size_t k = 0; k < n; k++) {
    const needle_t *nd = &f->nd[k];
    if (len < nd->len || i >= len - nd->len + 1) continue;
    if ((rc = scan_tail(nd, h, i, len - nd->len + 1, len, &budget)) != 0)
      return rc > 0 ? 1 : scan_memmem(f, h, i, len);
  }
  return 0;
}
#else
__attribute__((noinline))
static int scan_short(const sbx_reflect_t *f, const unsigned char *h, size_t len) {
  size_t budget = verify_budget(len);
  for (size_t k = 0; k < f->n; k++) {
    if (len < f->nd[k].len) continue;
    int rc = scan_scalar(&f->nd[k], h, 0, len - f->nd[k].len + 1, len, &budget);
    if (rc != 0) return rc > 0 ? 1 : scan_memmem(f, h, 0, len);
  }
  return 0;
}
#endif

int sbx_reflect_hit(const sbx_reflect_t *f, const char *buf, size_t len) {
  const unsigned char *h = (const unsigned char *)buf;
  if (len < f->minlen) return 0;                  /* shorter than every needle */
  return f->minlen >= WM_MIN_NEEDLE ? scan_wm(f, h, len) : scan_short(f, h, len);
}
