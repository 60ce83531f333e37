/*
 * scrub.c: scrub_diagnostic(text, max), a failure reason that is safe to
 * deliver into a guest channel (shared/spec/fetch-and-delegation.md section 2).
 *
 * Design: the text is first made valid UTF-8 (each invalid byte becomes
 * U+FFFD) and cut to max(4 * max, 4096) code points. Every masking rule then
 * scans that text left to right and marks the bytes to hide in a byte map;
 * no rule rewrites the text, so a later rule sees the original bytes and an
 * earlier mask never splits a later one's value (no `]]`, no surviving tail).
 * Each maximal run of marked bytes becomes one `[redacted]`. Controls become
 * spaces, the result is trimmed and bounded to max code points.
 *
 * Linear time: every rule moves forward only. Literal searches are for
 * needles of at most 16 bytes (memchr, then a compare); a rule resumes after
 * what it consumed, and the regions that one rule scans past a match (an
 * authority, a run, a line) do not overlap, so each byte is looked at a
 * bounded number of times.
 * Marked intervals of one rule do not overlap either, so filling the byte map
 * costs at most a constant times the text length.
 *
 * Lua (sbx__open_scrub): core.scrub_diagnostic(text, max),
 * core.scrub_trim(s), core.scrub_valid_limit(v).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aux.h"
#include "parts.h"
#include "sbx_scrub.h"
#include "utf8_put.h"

#define MASK "[redacted]"
#define MASK_LEN (sizeof MASK - 1)
#define ELLIPSIS "\xE2\x80\xA6"          /* U+2026 */
#define ELLIPSIS_LEN 3
#define REPLACEMENT "\xEF\xBF\xBD"       /* U+FFFD */
#define KEEP_MIN 4096                    /* step 1: at least this many code points */
#define KEEP_FACTOR 4                    /* step 1: 4 x max code points */
#define MAX_EXACT 9007199254740992.0     /* 2^53: larger limits mean "no bound" */
#define NONE SIZE_MAX

/* Byte classes ------------------------------------------------------------------ */

static int is_alnum(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}
static int is_word(unsigned char c) { return is_alnum(c) || c == '_'; }
/* Token characters: A-Z a-z 0-9 - . _ ~ + / = */
static int is_tok(unsigned char c) { return is_alnum(c) || (c && strchr("-._~+/=", c)); }
static int is_b64url(unsigned char c) { return is_alnum(c) || c == '-' || c == '_'; }
static int is_name(unsigned char c) { return is_alnum(c) || c == '-' || c == '_' || c == '.'; }
static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_lower(unsigned char c) { return c >= 'a' && c <= 'z'; }
static int is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }

/* UTF-8 ------------------------------------------------------------------------- */

/* Length (1..4) of the valid UTF-8 sequence at p (n bytes available), or 0.
 * Strict: no overlongs, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) return 0;
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
    if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90)) return 0;
    return 4;
  }
  return 0;
}

/* Code point of the valid sequence at p of length k. */
static unsigned long utf8_cp(const unsigned char *p, size_t k) {
  switch (k) {
  case 1: return p[0];
  case 2: return ((unsigned long)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  case 3: return ((unsigned long)(p[0] & 0x0F) << 12) | ((unsigned long)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  default:
    return ((unsigned long)(p[0] & 0x07) << 18) | ((unsigned long)(p[1] & 0x3F) << 12) |
           ((unsigned long)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

/* White space for trimming (spec 3.2): U+0009..U+000D, U+0020, U+00A0,
 * U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF. */
static int is_trim_space(unsigned long cp) {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

/* Trims s[*a..*b) of that white space at both ends. An invalid byte is not
 * white space. */
static void trim_range(const unsigned char *s, size_t *a, size_t *b) {
  size_t i = *a, j = *b;
  while (i < j) {
    size_t k = utf8_seq(s + i, j - i);
    if (k == 0 || !is_trim_space(utf8_cp(s + i, k))) break;
    i += k;
  }
  while (j > i) {
    size_t start = j - 1, k;
    while (start > i && (s[start] & 0xC0) == 0x80 && j - start < 4) start--;
    k = utf8_seq(s + start, j - start);
    if (k != j - start || !is_trim_space(utf8_cp(s + start, k))) break;
    j = start;
  }
  *a = i;
  *b = j;
}

/* Step 1: the first `keep` code points of text (keep == NONE: all) as valid
 * UTF-8, each invalid byte replaced by U+FFFD. Only the first 4 * keep bytes
 * can hold them. Returns NULL when out of memory. */
static unsigned char *sanitize(const unsigned char *text, size_t len, size_t keep, size_t *n_out) {
  size_t i = 0, o = 0, cps = 0;
  unsigned char *s;
  if (keep != NONE && keep <= SIZE_MAX / 4 && len > 4 * keep) len = 4 * keep;
  if (len > (SIZE_MAX - 1) / 3) return NULL;
  s = malloc(3 * len + 1);
  if (s == NULL) return NULL;
  while (i < len && cps < keep) {
    size_t k = utf8_seq(text + i, len - i);
    if (k) {
      memcpy(s + o, text + i, k);
      o += k;
      i += k;
    } else {
      memcpy(s + o, REPLACEMENT, 3);
      o += 3;
      i++;
    }
    cps++;
  }
  s[o] = '\0';
  *n_out = o;
  return s;
}

/* Masking rules (spec 2, steps 2 and 3) ----------------------------------------------- */

typedef struct {
  const unsigned char *s;   /* sanitized text */
  const unsigned char *ls;  /* the same, ASCII letters lower-cased */
  size_t n;
  unsigned char *m;         /* m[i] != 0: byte i is masked */
} scan_t;

/* Masks bytes [from, to). */
static void mark(scan_t *t, size_t from, size_t to) {
  if (to > from) memset(t->m + from, 1, to - from);
}

/* First occurrence of needle (1..16 bytes) in h[from..n), or NONE: memchr
 * for its first byte, then a compare, O((n - from) * nlen). Not memmem: the
 * sanitizers check memmem's whole haystack on every call, which made a text
 * with many matches quadratic under ASan. */
static size_t find(const unsigned char *h, size_t n, size_t from, const char *needle, size_t nlen) {
  while (from < n && n - from >= nlen) {
    const unsigned char *p = memchr(h + from, (unsigned char)needle[0], n - from - nlen + 1);
    if (p == NULL) return NONE;
    from = (size_t)(p - h);
    if (memcmp(p + 1, needle + 1, nlen - 1) == 0) return from;
    from++;
  }
  return NONE;
}

static size_t find_lit(const unsigned char *h, size_t n, size_t from, const char *needle) {
  return find(h, n, from, needle, strlen(needle));
}

/* Index of the first CR or LF at or after i, or n. */
static size_t line_end(const scan_t *t, size_t i) {
  while (i < t->n && t->s[i] != '\n' && t->s[i] != '\r') i++;
  return i;
}

static size_t skip_blanks(const scan_t *t, size_t i) {
  while (i < t->n && (t->s[i] == ' ' || t->s[i] == '\t')) i++;
  return i;
}

static size_t tok_end(const scan_t *t, size_t i) {
  while (i < t->n && is_tok(t->s[i])) i++;
  return i;
}

static size_t b64_end(const scan_t *t, size_t i) {
  while (i < t->n && is_b64url(t->s[i])) i++;
  return i;
}

/* URL userinfo: after `://`, up to the last `@` of the authority (which ends
 * at `/`, `?`, `#`, white space or the end). The next `://` holds a `/`, so
 * authorities never overlap. */
static void mask_userinfo(scan_t *t) {
  size_t init = 0, p;
  while ((p = find_lit(t->s, t->n, init, "://")) != NONE) {
    size_t i = p + 3, last_at = NONE;
    for (; i < t->n; i++) {
      unsigned char c = t->s[i];
      if (c == '/' || c == '?' || c == '#' || is_space(c)) break;
      if (c == '@') last_at = i;
    }
    if (last_at != NONE) mark(t, p + 3, last_at);
    init = p + 3;
  }
}

/* `authorization` / `proxy-authorization` then `:` or `=`: the rest of the
 * line after the separator. */
static void mask_authorization(scan_t *t) {
  size_t init = 0, p;
  while ((p = find_lit(t->ls, t->n, init, "authorization")) != NONE) {
    size_t q = p + 13, i = skip_blanks(t, q);
    if (i < t->n && (t->s[i] == ':' || t->s[i] == '=')) {
      size_t from = skip_blanks(t, i + 1), to = line_end(t, from);
      mark(t, from, to);
      init = to;
    } else {
      init = q;
    }
  }
}

/* Header lines at the start of a line, after white space or a quote, then
 * `:`: the value to the end of the line. Not after `/` or a word byte, so
 * `https://x-access-token:` in a URL is left to the userinfo rule. */
static void mask_headers(scan_t *t) {
  static const char *const names[] = {"set-cookie", "cookie", "x-api-key", "x-auth-token", "x-access-token"};
  for (size_t h = 0; h < sizeof names / sizeof *names; h++) {
    size_t init = 0, p, nlen = strlen(names[h]);
    while ((p = find(t->ls, t->n, init, names[h], nlen)) != NONE) {
      size_t q = p + nlen;
      init = q;
      if (p == 0 || is_space(t->s[p - 1]) || t->s[p - 1] == '"' || t->s[p - 1] == '\'') {
        size_t i = skip_blanks(t, q);
        if (i < t->n && t->s[i] == ':') {
          size_t from = skip_blanks(t, i + 1), to = line_end(t, from);
          mark(t, from, to);
          init = to;
        }
      }
    }
  }
}

/* Does the token run s[from..to) look like a credential? */
static int looks_like_credential(const scan_t *t, size_t from, size_t to) {
  unsigned char prev = 0;
  if (to - from >= 32) return 1;
  for (size_t i = from; i < to; i++) {
    unsigned char c = t->s[i];
    if (is_digit(c) || c == '+' || c == '/' || c == '=' || c == '_' || c == '~') return 1;
    if (is_upper(c) && is_lower(prev)) return 1;
    prev = c;
  }
  return 0;
}

/* `bearer`, `basic`, `token` as a word, white space, then a run of at least
 * 8 token characters that looks like a credential. */
static void mask_schemes(scan_t *t) {
  static const char *const words[] = {"bearer", "basic", "token"};
  for (size_t w = 0; w < sizeof words / sizeof *words; w++) {
    size_t init = 0, p, wlen = strlen(words[w]);
    while ((p = find(t->ls, t->n, init, words[w], wlen)) != NONE) {
      size_t q = p + wlen, i = q;
      init = q;
      if ((p > 0 && is_word(t->s[p - 1])) || (q < t->n && is_word(t->s[q]))) continue;
      if (i < t->n && is_space(t->s[i])) {
        size_t e;
        while (i < t->n && is_space(t->s[i])) i++;
        e = tok_end(t, i);
        if (e - i >= 8 && looks_like_credential(t, i, e)) {
          mark(t, i, e);
          init = e;
        }
      }
    }
  }
}

/* Well-known token prefixes (case as issued), not after a letter or digit:
 * the whole run of token characters. */
static void mask_prefixes(scan_t *t) {
  static const struct { const char *prefix; size_t min_tail; } pf[] = {
    {"ghp_", 1}, {"gho_", 1}, {"ghu_", 1}, {"ghs_", 1}, {"ghr_", 1}, {"github_pat_", 1},
    {"glpat-", 1}, {"sk-", 1}, {"xoxa-", 1}, {"xoxb-", 1}, {"xoxp-", 1}, {"xoxr-", 1},
    {"xoxs-", 1}, {"AKIA", 4}, {"AIza", 4},
  };
  for (size_t k = 0; k < sizeof pf / sizeof *pf; k++) {
    size_t init = 0, p, plen = strlen(pf[k].prefix);
    while ((p = find(t->s, t->n, init, pf[k].prefix, plen)) != NONE) {
      size_t q = p + plen, e;
      init = q;
      if (p > 0 && is_alnum(t->s[p - 1])) continue;
      e = tok_end(t, q);
      if (e - q >= pf[k].min_tail) {
        mark(t, p, e);
        init = e;
      }
    }
  }
}

/* JWT: `eyJ` + base64url, `.`, base64url (non-empty), `.`, base64url (may be
 * empty), at the start of a run (not after base64url or `.`). */
static void mask_jwts(scan_t *t) {
  size_t init = 0, p;
  while ((p = find_lit(t->s, t->n, init, "eyJ")) != NONE) {
    size_t e1, e2, e3;
    init = p + 3;
    if (p > 0 && (is_b64url(t->s[p - 1]) || t->s[p - 1] == '.')) continue;
    e1 = b64_end(t, p + 3);
    if (e1 >= t->n || t->s[e1] != '.') continue;
    e2 = b64_end(t, e1 + 1);
    if (e2 <= e1 + 1 || e2 >= t->n || t->s[e2] != '.') continue;
    e3 = b64_end(t, e2 + 1);
    mark(t, p, e3);
    init = e3;
  }
}

/* The end of the first `-----END <label>-----` at or after from, or n. The
 * label holds no `-----`, so a compare that starts at one `-----END ` fails
 * before it passes the next one: each byte is compared a bounded number of
 * times. */
static size_t end_line(const scan_t *t, size_t from, const unsigned char *label, size_t llen) {
  size_t e;
  while ((e = find_lit(t->s, t->n, from, "-----END ")) != NONE) {
    size_t i = e + 9, k = 0;
    /* A byte loop, not memcmp: a sanitizer checks memcmp's whole length. */
    while (k < llen && i + k < t->n && t->s[i + k] == label[k]) k++;
    if (k == llen && t->n - i - k >= 5 && memcmp(t->s + i + k, "-----", 5) == 0) return i + k + 5;
    from = e + 1;
  }
  return t->n;
}

/* PEM private keys: `-----BEGIN … PRIVATE KEY-----` (one line) through the
 * matching END line, or to the end of the text. */
static void mask_pem(scan_t *t) {
  static const char pk[] = "PRIVATE KEY";
  size_t init = 0, p;
  while ((p = find_lit(t->s, t->n, init, "-----BEGIN ")) != NONE) {
    size_t q = p + 11, dash = find_lit(t->s, t->n, q, "-----"), llen;
    init = q;
    if (dash == NONE) return;
    llen = dash - q;
    if (memchr(t->s + q, '\n', llen) || memchr(t->s + q, '\r', llen)) continue;
    if (llen >= sizeof pk - 1 && memcmp(t->s + dash - (sizeof pk - 1), pk, sizeof pk - 1) == 0) {
      size_t to = end_line(t, dash + 5, t->s + q, llen);
      mark(t, p, to);
      init = to;
    }
  }
}

/* Step 3: secret-named assignments. */
enum { KIND_NONE, KIND_TOKEN, KIND_SECRET };

static int name_kind(const unsigned char *lname, size_t len) {
  static const char *const keywords[] = {
    "token", "secret", "password", "passwd", "api_key", "api-key", "apikey", "credential"};
  static const char *const suffixes[] = {
    "policy", "rules", "length", "count", "limit", "max", "min", "type", "format", "expir", "ttl",
    "lifetime", "required", "enabled", "strategy", "file", "path", "url", "name", "field", "prompt",
    "hint", "window", "budget", "usage"};
  int kind = KIND_NONE;
  for (size_t k = 0; k < sizeof keywords / sizeof *keywords; k++) {
    size_t init = 0, p, klen = strlen(keywords[k]);
    int is_token = k == 0;
    while ((p = find(lname, len, init, keywords[k], klen)) != NONE) {
      size_t q = p + klen, i = q;
      int ok = !(is_token && q < len && lname[q] == 's');
      init = q;
      if (ok) {
        while (i < len && (lname[i] == '_' || lname[i] == '-' || lname[i] == '.')) i++;
        for (size_t s = 0; s < sizeof suffixes / sizeof *suffixes; s++) {
          size_t slen = strlen(suffixes[s]);
          if (len - i >= slen && memcmp(lname + i, suffixes[s], slen) == 0) {
            ok = 0;
            break;
          }
        }
      }
      if (ok) {
        if (!is_token) return KIND_SECRET;
        kind = KIND_TOKEN;
      }
    }
  }
  return kind;
}

static int value_end(unsigned char c) {
  return c == '"' || c == '\'' || c == ',' || c == '&' || c == ';' || c == '}' || c == ']';
}

/* `name: value`, `name=value`, `"name": "value"`: a name run, its closing
 * quote when it was opened by one, blanks, `:` or `=`, blanks, the value. */
static void mask_assignments(scan_t *t) {
  const unsigned char *s = t->s;
  size_t n = t->n, i = 0;
  while (i < n) {
    size_t from, to, j;
    if (!is_name(s[i])) {
      i++;
      continue;
    }
    from = i;
    while (i < n && is_name(s[i])) i++;
    to = i;
    j = i;
    if (from > 0 && (s[from - 1] == '"' || s[from - 1] == '\'') && j < n && s[j] == s[from - 1]) j++;
    j = skip_blanks(t, j);
    if (j < n && (s[j] == ':' || s[j] == '=')) {
      int kind = name_kind(t->ls + from, to - from);
      if (kind != KIND_NONE) {
        size_t v = skip_blanks(t, j + 1), vfrom, vto, k;
        int digits;
        if (v < n && (s[v] == '"' || s[v] == '\'')) {
          unsigned char qc = s[v];
          vfrom = v + 1;
          k = vfrom;
          while (k < n) {
            if (s[k] == '\\') k += 2;
            else if (s[k] == qc) break;
            else k++;
          }
          vto = k < n ? k : n;
          i = vto + 1;
        } else {
          vfrom = v;
          k = v;
          while (k < n && !is_space(s[k]) && !value_end(s[k])) k++;
          vto = k;
          i = k;
        }
        digits = vto > vfrom;
        for (k = vfrom; digits && k < vto; k++) digits = is_digit(s[k]);
        if (!(kind == KIND_TOKEN && digits)) mark(t, vfrom, vto);
      }
    }
  }
}

/* The public function ------------------------------------------------------------------ */

/* max -> the code point bound (NONE: no bound), or -1 when invalid. */
static int parse_limit(double max, size_t *bound) {
  if (isinf(max) && max > 0) {
    *bound = NONE;
    return 0;
  }
  if (!(max >= 1) || max != floor(max)) return -1;   /* NaN, < 1, -inf, fractions */
  if (max > MAX_EXACT || max >= (double)SIZE_MAX) *bound = NONE;
  else *bound = (size_t)max;
  return 0;
}

/* Steps 2 to 5 on the sanitized text s[0..n). */
static int scrub_valid(const unsigned char *s, size_t n, size_t bound, char **out, size_t *out_len) {
  scan_t t = {s, NULL, n, NULL};
  unsigned char *ls = NULL, *buf = NULL, *m = NULL;
  size_t size = 0, o = 0, a, b, cps = 0, cut = NONE;
  int rc = -ENOMEM;

  ls = malloc(n + 1);
  m = calloc(n + 1, 1);
  if (ls == NULL || m == NULL) goto done;
  for (size_t i = 0; i < n; i++) ls[i] = (s[i] >= 'A' && s[i] <= 'Z') ? (unsigned char)(s[i] + 32) : s[i];
  t.ls = ls;
  t.m = m;

  /* 2 and 3. */
  mask_userinfo(&t);
  mask_authorization(&t);
  mask_headers(&t);
  mask_schemes(&t);
  mask_prefixes(&t);
  mask_jwts(&t);
  mask_pem(&t);
  mask_assignments(&t);

  /* Each masked run becomes one MASK; 4. C0 controls but tab and LF, and
   * DEL, become spaces. */
  for (size_t i = 0; i < n;) {
    if (m[i]) {
      size += MASK_LEN;
      while (i < n && m[i]) i++;
    } else {
      size++;
      i++;
    }
  }
  buf = malloc(size + ELLIPSIS_LEN + 1);
  if (buf == NULL) goto done;
  for (size_t i = 0; i < n;) {
    if (m[i]) {
      memcpy(buf + o, MASK, MASK_LEN);
      o += MASK_LEN;
      while (i < n && m[i]) i++;
    } else {
      unsigned char c = s[i++];
      buf[o++] = (c < 0x20 && c != '\t' && c != '\n') || c == 0x7F ? ' ' : c;
    }
  }

  /* Trim. */
  a = 0;
  b = o;
  trim_range(buf, &a, &b);

  /* 5. Bound to max code points, ending in an ellipsis when cut. */
  if (bound != NONE) {
    for (size_t i = a; i < b; i++) {
      if ((buf[i] & 0xC0) == 0x80) continue;
      if (cps == bound - 1) cut = i;
      cps++;
    }
  }
  if (bound != NONE && cps > bound) {   /* cut: the start of code point number `bound` */
    memmove(buf, buf + a, cut - a);
    o = cut - a;
    memcpy(buf + o, ELLIPSIS, ELLIPSIS_LEN);
    o += ELLIPSIS_LEN;
  } else {
    memmove(buf, buf + a, b - a);
    o = b - a;
  }
  buf[o] = '\0';
  *out = (char *)buf;
  *out_len = o;
  buf = NULL;
  rc = 0;
done:
  free(ls);
  free(m);
  free(buf);
  return rc;
}

int sbx_scrub_diagnostic(const char *text, size_t len, double max, char **out, size_t *out_len) {
  size_t bound, keep, n;
  unsigned char *s;
  int rc;
  *out = NULL;
  *out_len = 0;
  if (parse_limit(max, &bound) != 0) return SBX_SCRUB_E_LIMIT;
  /* 1. Valid UTF-8, cut to max(4 * max, 4096) code points. */
  if (bound == NONE || bound > SIZE_MAX / KEEP_FACTOR) keep = NONE;
  else keep = bound * KEEP_FACTOR < KEEP_MIN ? KEEP_MIN : bound * KEEP_FACTOR;
  s = sanitize((const unsigned char *)(text ? text : ""), text ? len : 0, keep, &n);
  if (s == NULL) return -ENOMEM;
  rc = scrub_valid(s, n, bound, out, out_len);
  free(s);
  return rc;
}

const char *sbx_scrub_strerror(int code) {
  if (code == SBX_SCRUB_E_LIMIT) return "Invalid diagnostic limit";
  if (code == -ENOMEM) return "Out of memory";
  return code == 0 ? "OK" : "Unknown error";
}

/* Lua ------------------------------------------------------------------------------------- */

#define BOX_MT "sbx.scrub_box"

/* The limit at idx as sbx_scrub_diagnostic takes it; 0 when it is not a
 * number (Lua integers above 2^53 become +inf, which gives the same result). */
static int lua_limit(lua_State *L, int idx, double *max) {
  size_t bound;
  if (lua_isnoneornil(L, idx)) {
    *max = SBX_SCRUB_DEFAULT_MAX;
    return 1;
  }
  if (lua_type(L, idx) != LUA_TNUMBER) return 0;
  if (lua_isinteger(L, idx)) {
    lua_Integer v = lua_tointeger(L, idx);
    if (v < 1) return 0;
    *max = v > (lua_Integer)MAX_EXACT ? INFINITY : (double)v;
    return 1;
  }
  *max = lua_tonumber(L, idx);
  return parse_limit(*max, &bound) == 0;
}

static int l_box_gc(lua_State *L) {
  free(sbx__box_detach(luaL_checkudata(L, 1, BOX_MT)));
  return 0;
}

/* core.scrub_diagnostic(text, max) -> string; raises `Invalid diagnostic
 * limit` (a plain message) for a bad max. A non-string text goes through
 * tostring. */
static int l_scrub_diagnostic(lua_State *L) {
  double max;
  const char *text;
  size_t len, out_len;
  sbx__box_t *box;
  char *out = NULL;
  int rc;
  lua_settop(L, 2);
  if (!lua_limit(L, 2, &max)) {
    lua_pushstring(L, sbx_scrub_strerror(SBX_SCRUB_E_LIMIT));
    return lua_error(L);
  }
  text = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &len) : luaL_tolstring(L, 1, &len);
  /* The result lives in a box until it is a Lua string, so an error while
   * pushing it cannot leak it. */
  box = sbx__box_new(L, BOX_MT);
  rc = sbx_scrub_diagnostic(text, len, max, &out, &out_len);
  sbx__box_bind(box, out, NULL);
  if (rc != 0) return luaL_error(L, "scrub_diagnostic: %s", sbx_scrub_strerror(rc));
  lua_pushlstring(L, out, out_len);
  free(sbx__box_detach(box));
  return 1;
}

/* core.scrub_trim(s) -> s without the white space of spec 3.2 at either end. */
static int l_scrub_trim(lua_State *L) {
  size_t len, a = 0, b;
  const char *s = luaL_checklstring(L, 1, &len);
  b = len;
  trim_range((const unsigned char *)s, &a, &b);
  lua_pushlstring(L, s + a, b - a);
  return 1;
}

/* core.scrub_valid_limit(v) -> boolean: an integral value >= 1, or math.huge. */
static int l_scrub_valid_limit(lua_State *L) {
  double max;
  lua_pushboolean(L, !lua_isnoneornil(L, 1) && lua_limit(L, 1, &max));
  return 1;
}

void sbx__open_scrub(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"scrub_diagnostic", l_scrub_diagnostic},
    {"scrub_trim", l_scrub_trim},
    {"scrub_valid_limit", l_scrub_valid_limit},
    {NULL, NULL}};
  static const luaL_Reg no_methods[] = {{NULL, NULL}};
  sbx__class(L, BOX_MT, no_methods, l_box_gc);
  luaL_setfuncs(L, fns, 0);
}
