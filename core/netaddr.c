/*
 * netaddr.c: the pure half of the safe-fetch SSRF guard (netaddr.h;
 * shared/spec/fetch-and-delegation.md 1.5, 1.6, 1.7, 1.15).
 *
 * URL admission is one forward pass over bytes with no second parser: trim,
 * refuse controls and backslashes, scheme, "//", authority (no '@'), host
 * (percent-decoded, ASCII, lower-cased; a host whose last label is a number
 * is an IPv4 in one of the encoded forms, a bracketed host an IPv6 literal),
 * port, then path and query (dot segments removed, unsafe bytes
 * percent-encoded). The canonical href is built from the parsed parts only.
 * IPv4 arithmetic is done in 64 bits with saturation, so nothing wraps modulo
 * 2^32. Every buffer is bounded (netaddr.h); nothing here allocates.
 *
 * The address policy works on 16 bytes: an IPv4 deny-list, an IPv6
 * allow-list (2000::/3 minus its holes), IPv4-mapped addresses judged by the
 * IPv4 they carry. Reasons are static strings, safe to show an operator.
 *
 * Lua: core.url_admit, core.addr_classify, core.addr_parse (see
 * core/API.md); redirect targets (sbx_url_resolve_ref) and the host's own
 * addresses (sbx_local_addrs_load) are the C hop loop's (fetch_call.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "netaddr.h"
#include "aux.h"
#include "parts.h"

/* ---- small helpers ----------------------------------------------------- */

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int is_alpha(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static unsigned char lower(unsigned char c) {
  return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* Strict UTF-8: no overlongs, no surrogates, nothing above U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t k;
    unsigned long cp, min;
    if (c < 0x80) { i++; continue; }
    if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n - i <= k) return 0;
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += k + 1;
  }
  return 1;
}

/* Bounded appender: any overflow sets ->over and writes nothing more. */
typedef struct {
  char *p;
  size_t cap, len;   /* cap excludes the NUL */
  int over;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n) {
  if (b->over || n > b->cap - b->len) { b->over = 1; return; }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void putc1(sbuf_t *b, char c) { put(b, &c, 1); }

/* ---- IPv4 ---------------------------------------------------------------- */

/* A strict dotted quad (1.6): four decimal parts 0..255, no leading zeros. */
static int v4_strict(const char *s, size_t n, uint32_t *out) {
  uint32_t a = 0;
  size_t i = 0;
  for (int part = 0; part < 4; part++) {
    size_t start = i;
    unsigned v = 0;
    if (part > 0) {
      if (i >= n || s[i] != '.') return -1;
      start = ++i;
    }
    while (i < n && is_digit((unsigned char)s[i]) && i - start < 3) v = v * 10 + (unsigned)(s[i++] - '0');
    if (i == start || v > 255) return -1;
    if (s[start] == '0' && i - start > 1) return -1;
    if (i < n && is_digit((unsigned char)s[i])) return -1;
    a = (a << 8) | v;
  }
  if (i != n) return -1;
  *out = a;
  return 0;
}

#define V4_BIG 0x100000001ULL   /* saturation value: above every legal label */

/* One label of the encoded-IPv4 host grammar (1.5): 0x hex (empty is 0),
 * leading-0 octal, else decimal. */
static int v4_label(const char *s, size_t n, uint64_t *out) {
  unsigned base = 10;
  uint64_t v = 0;
  if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) { base = 16; s += 2; n -= 2; }
  else if (n >= 2 && s[0] == '0') { base = 8; s++; n--; }
  else if (n == 0) return -1;
  for (size_t i = 0; i < n; i++) {
    int d = hexval((unsigned char)s[i]);
    if (d < 0 || (unsigned)d >= base) return -1;
    v = v * base + (unsigned)d;
    if (v > V4_BIG) v = V4_BIG;
  }
  *out = v;
  return 0;
}

/* 1.5 item 8: the last label, after dropping one trailing empty label, is
 * all decimal digits, or 0x followed by hex digits (possibly none). */
static int ends_in_number(const char *h, size_t n) {
  size_t i;
  if (n > 0 && h[n - 1] == '.') n--;
  i = n;
  while (i > 0 && h[i - 1] != '.') i--;
  h += i;
  n -= i;
  if (n == 0) return 0;
  if (n >= 2 && h[0] == '0' && (h[1] == 'x' || h[1] == 'X')) {
    for (size_t j = 2; j < n; j++)
      if (hexval((unsigned char)h[j]) < 0) return 0;
    return 1;
  }
  for (size_t j = 0; j < n; j++)
    if (!is_digit((unsigned char)h[j])) return 0;
  return 1;
}

static int v4_encoded(const char *h, size_t n, uint32_t *out) {
  uint64_t part[4];
  size_t count = 0, i = 0;
  if (n > 0 && h[n - 1] == '.') n--;   /* one trailing empty label */
  for (;;) {
    size_t start = i;
    while (i < n && h[i] != '.') i++;
    if (count == 4) return -1;
    if (v4_label(h + start, i - start, &part[count]) != 0) return -1;
    count++;
    if (i >= n) break;
    i++;
    if (i >= n) return -1;             /* a second trailing dot: empty label */
  }
  uint64_t a = 0;
  for (size_t k = 0; k + 1 < count; k++) {
    if (part[k] > 255) return -1;
    a |= part[k] << (8 * (3 - k));
  }
  if (part[count - 1] >= (1ULL << (8 * (5 - count)))) return -1;
  a += part[count - 1];
  *out = (uint32_t)a;
  return 0;
}

static size_t v4_format(uint32_t a, char *buf) {
  size_t n = 0;
  for (int k = 3; k >= 0; k--) {
    unsigned v = (a >> (8 * k)) & 255;
    if (v >= 100) buf[n++] = (char)('0' + v / 100);
    if (v >= 10) buf[n++] = (char)('0' + (v / 10) % 10);
    buf[n++] = (char)('0' + v % 10);
    if (k) buf[n++] = '.';
  }
  buf[n] = '\0';
  return n;
}

/* ---- IPv6 ---------------------------------------------------------------- */

/* The standard textual forms (the WHATWG host parser's algorithm): hex groups
 * of one to four digits, one "::", an optional strict dotted-quad tail. */
static int v6_parse(const char *s, size_t n, unsigned char out[16]) {
  uint16_t a[8] = {0};
  int piece = 0, compress = -1;
  size_t i = 0;
  if (n == 0) return -1;
  if (s[0] == ':') {
    if (n < 2 || s[1] != ':') return -1;
    i = 2;
    piece = 1;
    compress = 1;
  }
  while (i < n) {
    unsigned v = 0;
    size_t len = 0;
    if (piece == 8) return -1;
    if (s[i] == ':') {
      if (compress != -1) return -1;
      i++;
      piece++;
      compress = piece;
      continue;
    }
    while (len < 4 && i < n && hexval((unsigned char)s[i]) >= 0) {
      v = v * 16 + (unsigned)hexval((unsigned char)s[i]);
      i++;
      len++;
    }
    if (i < n && s[i] == '.') {
      uint32_t q;
      if (len == 0 || piece > 6) return -1;
      if (v4_strict(s + i - len, n - (i - len), &q) != 0) return -1;
      a[piece++] = (uint16_t)(q >> 16);
      a[piece++] = (uint16_t)(q & 0xFFFF);
      i = n;
      break;
    }
    if (len == 0) return -1;
    if (i < n) {
      if (s[i] != ':') return -1;
      i++;
      if (i >= n) return -1;
    }
    a[piece++] = (uint16_t)v;
  }
  if (compress != -1) {
    int swaps = piece - compress;
    piece = 7;
    while (piece != 0 && swaps > 0) {
      uint16_t t = a[piece];
      a[piece] = a[compress + swaps - 1];
      a[compress + swaps - 1] = t;
      piece--;
      swaps--;
    }
  } else if (piece != 8) {
    return -1;
  }
  for (int k = 0; k < 8; k++) {
    out[2 * k] = (unsigned char)(a[k] >> 8);
    out[2 * k + 1] = (unsigned char)(a[k] & 0xFF);
  }
  return 0;
}

/* Lower-case hex, the longest run of two or more zero groups compressed (the
 * first on a tie), never a dotted tail. buf holds SBX_ADDR_TEXT_MAX. */
static size_t v6_format(const unsigned char b[16], char *buf) {
  static const char hx[] = "0123456789abcdef";
  unsigned g[8];
  int best = -1, bestlen = 0;
  size_t n = 0;
  for (int k = 0; k < 8; k++) g[k] = ((unsigned)b[2 * k] << 8) | b[2 * k + 1];
  for (int k = 0; k < 8;) {
    int j = k;
    while (j < 8 && g[j] == 0) j++;
    if (j - k > bestlen) { best = k; bestlen = j - k; }
    k = (j == k) ? k + 1 : j;
  }
  if (bestlen < 2) best = -1;
  for (int k = 0; k < 8; k++) {
    if (k == best) {
      buf[n++] = ':';
      buf[n++] = ':';
      k += bestlen - 1;
      continue;
    }
    if (k > 0 && !(best >= 0 && k == best + bestlen)) buf[n++] = ':';
    int started = 0;
    for (int s = 12; s >= 0; s -= 4) {
      unsigned d = (g[k] >> s) & 15;
      if (d || started || s == 0) { buf[n++] = hx[d]; started = 1; }
    }
  }
  buf[n] = '\0';
  return n;
}

/* ---- URL admission (1.5) ---------------------------------------------------- */

const char *sbx_url_strerror(int code) {
  switch (code) {
  case SBX_URL_OK: return "";
  case SBX_URL_E_CREDENTIALS: return "Only credential-free HTTP(S) URLs are allowed";
  case SBX_URL_E_PORT0: return "Port 0 is not allowed";
  case SBX_URL_E_LOCATION: return "Invalid redirect location";
  default: return "Invalid URL";
  }
}

static int fail(int code, const char **err) {
  if (err) *err = sbx_url_strerror(code);
  return code;
}

static int trim_c0(unsigned char c) { return c <= 0x20; }

/* Host code points refused after decoding (1.5 item 7). */
static int forbidden_host(unsigned char c) {
  if (c <= 0x20 || c >= 0x7F) return 1;
  return strchr("#%/:<>?@[\\]^|", c) != NULL;
}

/* Parses the host text h[0..n) (no brackets handling here) into out. */
static int parse_host(const char *h, size_t n, sbx_url_t *out) {
  if (n > 0 && h[0] == '[') {
    if (n < 2 || h[n - 1] != ']') return SBX_URL_E_INVALID;
    if (v6_parse(h + 1, n - 2, out->ip) != 0) return SBX_URL_E_INVALID;
    out->host_kind = SBX_HOST_IPV6;
    out->host_len = v6_format(out->ip, out->host);
    return SBX_URL_OK;
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)h[i];
    if (c == '%') {
      int hi, lo;
      if (n - i < 3 || (hi = hexval((unsigned char)h[i + 1])) < 0 ||
          (lo = hexval((unsigned char)h[i + 2])) < 0)
        return SBX_URL_E_INVALID;
      c = (unsigned char)(hi * 16 + lo);
      i += 2;
    }
    if (forbidden_host(c) || m >= SBX_URL_HOST_MAX) return SBX_URL_E_INVALID;
    out->host[m++] = (char)lower(c);
  }
  if (m == 0) return SBX_URL_E_INVALID;
  out->host[m] = '\0';
  if (ends_in_number(out->host, m)) {
    uint32_t a;
    if (v4_encoded(out->host, m, &a) != 0) return SBX_URL_E_INVALID;
    out->host_kind = SBX_HOST_IPV4;
    out->ip[0] = (unsigned char)(a >> 24);
    out->ip[1] = (unsigned char)(a >> 16);
    out->ip[2] = (unsigned char)(a >> 8);
    out->ip[3] = (unsigned char)a;
    out->host_len = v4_format(a, out->host);
    return SBX_URL_OK;
  }
  out->host_kind = SBX_HOST_NAME;
  out->host_len = m;
  return SBX_URL_OK;
}

static int encode_byte(unsigned char c) {
  return c >= 0x80 || strchr(" \"<>`{}", c) != NULL;
}

static void put_encoded(sbuf_t *b, const char *s, size_t n) {
  static const char HX[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c != 0 && encode_byte(c)) {
      char e[3] = {'%', HX[c >> 4], HX[c & 15]};
      put(b, e, 3);
    } else {
      putc1(b, (char)c);
    }
  }
}

static int seg_is(const char *s, size_t n, int dots) {
  size_t seen = 0, i = 0;
  while (i < n) {
    if (s[i] == '.') i++;
    else if (n - i >= 3 && s[i] == '%' && s[i + 1] == '2' && lower((unsigned char)s[i + 2]) == 'e') i += 3;
    else return 0;
    seen++;
  }
  return seen == (size_t)dots;
}

/* Path p[0..n) (empty, or starting with '/'): dot segments removed. */
static void put_path(sbuf_t *b, const char *p, size_t n) {
  size_t base = b->len, i = 1;
  if (n == 0) { putc1(b, '/'); return; }
  while (i <= n) {
    size_t start = i;
    while (i < n && p[i] != '/') i++;
    int last = (i >= n);
    const char *seg = p + start;
    size_t sl = i - start;
    if (seg_is(seg, sl, 2)) {
      if (!b->over && b->len > base) {
        while (b->len > base && b->p[b->len - 1] != '/') b->len--;
        if (b->len > base) b->len--;
        b->p[b->len] = '\0';
      }
      if (last) putc1(b, '/');
    } else if (seg_is(seg, sl, 1)) {
      if (last) putc1(b, '/');
    } else {
      putc1(b, '/');
      put_encoded(b, seg, sl);
    }
    i++;
  }
  if (!b->over && b->len == base) putc1(b, '/');
}

int sbx_url_admit(const char *raw, size_t len, sbx_url_t *out, const char **err) {
  const unsigned char *s = (const unsigned char *)raw;
  size_t a = 0, e = len, i, frag;
  int rc;

  if (err) *err = NULL;
  memset(out, 0, offsetof(sbx_url_t, host));
  memset(out->ip, 0, sizeof out->ip);   /* unused bytes stay zero: ip compares whole */
  out->host_len = out->path_len = out->href_len = 0;
  out->port = 0;
  out->port_explicit = 0;
  out->authority_off = out->authority_len = 0;
  out->host[0] = out->path[0] = out->href[0] = '\0';
  if (raw == NULL || len > SBX_URL_MAX || !utf8_valid(s, len)) return fail(SBX_URL_E_INVALID, err);
  while (a < e && trim_c0(s[a])) a++;
  while (e > a && trim_c0(s[e - 1])) e--;
  for (frag = a; frag < e && s[frag] != '#'; frag++) {}
  for (i = a; i < e; i++) {
    if (s[i] < 0x20 || s[i] == 0x7F) return fail(SBX_URL_E_INVALID, err);
    if (s[i] == '\\' && i < frag) return fail(SBX_URL_E_INVALID, err);
  }

  /* scheme */
  i = a;
  if (i >= e || !is_alpha(s[i])) return fail(SBX_URL_E_INVALID, err);
  while (i < frag && (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.')) i++;
  if (i >= frag || s[i] != ':') return fail(SBX_URL_E_INVALID, err);
  if (i - a == 4 && strncasecmp((const char *)s + a, "http", 4) == 0) out->https = 0;
  else if (i - a == 5 && strncasecmp((const char *)s + a, "https", 5) == 0) out->https = 1;
  else return fail(SBX_URL_E_CREDENTIALS, err);
  out->scheme = out->https ? "https" : "http";
  i++;
  if (frag - i < 2 || s[i] != '/' || s[i + 1] != '/') return fail(SBX_URL_E_INVALID, err);
  i += 2;

  /* authority */
  size_t as = i;
  while (i < frag && s[i] != '/' && s[i] != '?') i++;
  size_t ae = i;
  if (memchr(s + as, '@', ae - as) != NULL) return fail(SBX_URL_E_CREDENTIALS, err);
  size_t he, ps = 0;
  int has_port = 0;
  if (as < ae && s[as] == '[') {
    const unsigned char *rb = memchr(s + as, ']', ae - as);
    if (rb == NULL) return fail(SBX_URL_E_INVALID, err);
    he = (size_t)(rb - s) + 1;
    if (he < ae) {
      if (s[he] != ':') return fail(SBX_URL_E_INVALID, err);
      has_port = 1;
      ps = he + 1;
    }
  } else {
    const unsigned char *c = memchr(s + as, ':', ae - as);
    he = c ? (size_t)(c - s) : ae;
    if (c) { has_port = 1; ps = he + 1; }
  }
  /* port before host, in the order of 1.5 (items 6, 7) */
  out->port = out->https ? 443 : 80;
  if (has_port) {
    uint32_t v = 0;
    if (ps >= ae) return fail(SBX_URL_E_INVALID, err);
    for (size_t k = ps; k < ae; k++) {
      if (!is_digit(s[k])) return fail(SBX_URL_E_INVALID, err);
      v = v * 10 + (uint32_t)(s[k] - '0');
      if (v > 65535) return fail(SBX_URL_E_INVALID, err);
    }
    if (v == 0) return fail(SBX_URL_E_PORT0, err);
    out->port = (uint16_t)v;
  }
  out->port_explicit = out->port != (out->https ? 443 : 80);
  rc = parse_host((const char *)s + as, he - as, out);
  if (rc != SBX_URL_OK) return fail(rc, err);

  /* path and query */
  sbuf_t pb = {out->path, SBX_URL_PATH_MAX, 0, 0};
  size_t qs = i;
  while (qs < frag && s[qs] != '?') qs++;
  put_path(&pb, (const char *)s + i, qs - i);
  if (qs < frag) {
    putc1(&pb, '?');
    put_encoded(&pb, (const char *)s + qs + 1, frag - qs - 1);
  }
  if (pb.over) return fail(SBX_URL_E_INVALID, err);
  out->path_len = pb.len;

  /* the canonical href, from the parts only */
  sbuf_t hb = {out->href, SBX_URL_HREF_MAX, 0, 0};
  out->href[0] = '\0';
  put(&hb, out->scheme, strlen(out->scheme));
  put(&hb, "://", 3);
  out->authority_off = hb.len;
  if (out->host_kind == SBX_HOST_IPV6) putc1(&hb, '[');
  put(&hb, out->host, out->host_len);
  if (out->host_kind == SBX_HOST_IPV6) putc1(&hb, ']');
  if (out->port_explicit) {
    char pbuf[8];
    int pn = snprintf(pbuf, sizeof pbuf, ":%u", (unsigned)out->port);
    put(&hb, pbuf, (size_t)pn);
  }
  out->authority_len = hb.len - out->authority_off;
  put(&hb, out->path, out->path_len);
  /* A canonical form longer than the input bound could not be admitted
   * again (a redirect to it would fail): refuse it now, fail closed. */
  if (hb.over || hb.len > SBX_URL_MAX) return fail(SBX_URL_E_INVALID, err);
  out->href_len = hb.len;
  return SBX_URL_OK;
}

int sbx_url_resolve_ref(const sbx_url_t *base, const char *ref, size_t len,
                        sbx_url_t *out, const char **err) {
  char buf[SBX_URL_HREF_MAX + SBX_URL_MAX + 2];
  sbuf_t b = {buf, sizeof buf - 1, 0, 0};
  const unsigned char *s = (const unsigned char *)ref;
  size_t a = 0, e = len, i;
  int rc;

  if (err) *err = NULL;
  if (ref == NULL || len > SBX_URL_MAX) return fail(SBX_URL_E_LOCATION, err);
  while (a < e && trim_c0(s[a])) a++;
  while (e > a && trim_c0(s[e - 1])) e--;
  buf[0] = '\0';
  /* absolute: a scheme before any of / ? # */
  i = a;
  if (i < e && is_alpha(s[i])) {
    while (i < e && (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.')) i++;
  }
  if (i > a && i < e && s[i] == ':') {
    put(&b, (const char *)s + a, e - a);
  } else if (e - a >= 2 && s[a] == '/' && s[a + 1] == '/') {
    put(&b, base->scheme, strlen(base->scheme));
    putc1(&b, ':');
    put(&b, (const char *)s + a, e - a);
  } else {
    size_t plen = base->path_len, q;
    for (q = 0; q < base->path_len && base->path[q] != '?'; q++) {}
    put(&b, base->href, base->authority_off + base->authority_len);
    if (a == e || s[a] == '#') {
      put(&b, base->path, plen);
    } else if (s[a] == '?') {
      put(&b, base->path, q);
    } else if (s[a] != '/') {
      size_t d = q;
      while (d > 0 && base->path[d - 1] != '/') d--;
      put(&b, base->path, d);
    }
    if (a < e) put(&b, (const char *)s + a, e - a);
  }
  if (b.over) return fail(SBX_URL_E_LOCATION, err);
  rc = sbx_url_admit(buf, b.len, out, err);
  if (rc == SBX_URL_E_INVALID) return fail(SBX_URL_E_LOCATION, err);
  return rc;
}

int sbx_url_same_origin(const sbx_url_t *a, const sbx_url_t *b) {
  return a->https == b->https && a->port == b->port && a->host_kind == b->host_kind &&
         a->host_len == b->host_len && memcmp(a->host, b->host, a->host_len) == 0;
}

/* ---- address policy (1.6) ---------------------------------------------------- */

static const struct {
  uint32_t net, mask;
  const char *why;
} v4_refused[] = {
  {0x00000000u, 0xFF000000u, "this network 0.0.0.0/8"},
  {0x0A000000u, 0xFF000000u, "private 10.0.0.0/8"},
  {0x64400000u, 0xFFC00000u, "shared address space 100.64.0.0/10"},
  {0x7F000000u, 0xFF000000u, "loopback 127.0.0.0/8"},
  {0xA9FE0000u, 0xFFFF0000u, "link-local 169.254.0.0/16"},
  {0xAC100000u, 0xFFF00000u, "private 172.16.0.0/12"},
  {0xC0000000u, 0xFFFFFF00u, "IETF protocol assignments 192.0.0.0/24"},
  {0xC0000200u, 0xFFFFFF00u, "documentation 192.0.2.0/24"},
  {0xC0586300u, 0xFFFFFF00u, "6to4 relay anycast 192.88.99.0/24"},
  {0xC0A80000u, 0xFFFF0000u, "private 192.168.0.0/16"},
  {0xC6120000u, 0xFFFE0000u, "benchmarking 198.18.0.0/15"},
  {0xC6336400u, 0xFFFFFF00u, "documentation 198.51.100.0/24"},
  {0xCB007100u, 0xFFFFFF00u, "documentation 203.0.113.0/24"},
  {0xE0000000u, 0xE0000000u, "multicast or reserved 224.0.0.0/3"},
};

static const char *v4_why(uint32_t a) {
  for (size_t k = 0; k < sizeof v4_refused / sizeof v4_refused[0]; k++)
    if ((a & v4_refused[k].mask) == v4_refused[k].net) return v4_refused[k].why;
  return NULL;
}

static const unsigned char v4mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};

/* NULL when public, else the reason. */
static const char *v6_why(const unsigned char b[16]) {
  static const unsigned char zero[16] = {0};
  unsigned h0 = ((unsigned)b[0] << 8) | b[1], h1 = ((unsigned)b[2] << 8) | b[3];
  if (memcmp(b, v4mapped_prefix, 12) == 0) {
    uint32_t a = ((uint32_t)b[12] << 24) | ((uint32_t)b[13] << 16) | ((uint32_t)b[14] << 8) | b[15];
    return v4_why(a);
  }
  if (h0 < 0x2000 || h0 > 0x3FFF) {
    if (memcmp(b, zero, 16) == 0) return "unspecified ::";
    if (memcmp(b, zero, 15) == 0 && b[15] == 1) return "loopback ::1";
    if (memcmp(b, zero, 12) == 0) return "IPv4-compatible ::/96";
    if (h0 == 0x0064 && h1 == 0xFF9B) {
      if (memcmp(b + 4, zero, 8) == 0) return "NAT64 64:ff9b::/96";
      if (b[4] == 0 && b[5] == 1) return "local NAT64 64:ff9b:1::/48";
    }
    if (h0 == 0x0100 && memcmp(b + 2, zero, 6) == 0) return "discard 100::/64";
    if ((h0 & 0xFE00) == 0xFC00) return "unique-local fc00::/7";
    if ((h0 & 0xFFC0) == 0xFE80) return "link-local fe80::/10";
    if ((h0 & 0xFFC0) == 0xFEC0) return "site-local fec0::/10";
    if ((h0 & 0xFF00) == 0xFF00) return "multicast ff00::/8";
    return "outside global unicast 2000::/3";
  }
  if (h0 == 0x2002) return "6to4 2002::/16";
  if (h0 == 0x3FFF) return "documentation 3fff::/16";
  if (h0 == 0x2001) {
    if (h1 == 0x0000) return "Teredo 2001::/32";
    if (h1 == 0x0002) return "benchmarking 2001:2::/32";
    if (h1 == 0x0DB8) return "documentation 2001:db8::/32";
    if (h1 >= 0x0010 && h1 <= 0x002F) return "ORCHID 2001:10::/28, 2001:20::/28";
  }
  return NULL;
}

int sbx_addr_parse(const char *text, size_t len, uint16_t port,
                   struct sockaddr_storage *ss, socklen_t *sslen) {
  char t[64];
  size_t n = 0;
  if (text == NULL) return SBX_EINVAL;
  if (len > 0 && text[0] == '[') { text++; len--; }
  if (len > 0 && text[len - 1] == ']') len--;
  if (len == 0 || len >= sizeof t) return SBX_EINVAL;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '%') return SBX_EINVAL;
    t[n++] = (char)lower((unsigned char)text[i]);
  }
  memset(ss, 0, sizeof *ss);
  if (memchr(t, ':', n) != NULL) {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (v6_parse(t, n, s6->sin6_addr.s6_addr) != 0) return SBX_EINVAL;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    *sslen = (socklen_t)sizeof *s6;
    return 0;
  }
  uint32_t a;
  if (v4_strict(t, n, &a) != 0) return SBX_EINVAL;
  struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
  s4->sin_family = AF_INET;
  s4->sin_port = htons(port);
  s4->sin_addr.s_addr = htonl(a);
  *sslen = (socklen_t)sizeof *s4;
  return 0;
}

/* The address of sa as 16 bytes (IPv4 mapped), its port, its scope id.
 * Returns 0, or -1 for an unknown family or a short length. */
static int sa_bytes(const struct sockaddr *sa, socklen_t len, unsigned char b[16],
                    unsigned *port, uint32_t *scope) {
  if (sa == NULL) return -1;
  if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    memcpy(b, v4mapped_prefix, 12);
    memcpy(b + 12, &s4->sin_addr.s_addr, 4);
    *port = ntohs(s4->sin_port);
    *scope = 0;
    return 0;
  }
  if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    memcpy(b, s6->sin6_addr.s6_addr, 16);
    *port = ntohs(s6->sin6_port);
    *scope = s6->sin6_scope_id;
    return 0;
  }
  return -1;
}

int sbx_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap) {
  unsigned char b[16];
  unsigned port;
  uint32_t scope;
  if (cap < SBX_ADDR_TEXT_MAX || sa_bytes(sa, len, b, &port, &scope) != 0) return SBX_EINVAL;
  if (sa->sa_family == AF_INET)
    return (int)v4_format(((uint32_t)b[12] << 24) | ((uint32_t)b[13] << 16) | ((uint32_t)b[14] << 8) | b[15], buf);
  return (int)v6_format(b, buf);
}

static int classify(const struct sockaddr *sa, socklen_t len, int check_port, const char **why) {
  unsigned char b[16];
  unsigned port;
  uint32_t scope;
  const char *r;
  if (sa_bytes(sa, len, b, &port, &scope) != 0) r = "unknown family or wrong length";
  else if (scope != 0) r = "scope id";
  else if (check_port && port == 0) r = "port 0";
  else r = v6_why(b);
  if (why) *why = r ? r : "public";
  return r == NULL;
}

int sbx_addr_classify(const struct sockaddr *sa, socklen_t len, const char **why) {
  return classify(sa, len, 1, why);
}

int sbx_addr_is_public_sa(const struct sockaddr *sa, socklen_t len) {
  return classify(sa, len, 0, NULL);
}

int sbx_addr_is_public_n(const char *text, size_t len, const char **why) {
  struct sockaddr_storage ss;
  socklen_t sl;
  if (sbx_addr_parse(text, len, 0, &ss, &sl) != 0) {
    if (why) *why = "not a strict IP literal";
    return 0;
  }
  return classify((struct sockaddr *)&ss, sl, 0, why);
}

int sbx_addr_is_public(const char *text) {
  return text != NULL && sbx_addr_is_public_n(text, strlen(text), NULL);
}

/* ---- the host's own addresses (1.6, 1.7) ------------------------------------- */

static int local_add(sbx_local_addrs_t *out, const struct sockaddr *sa, socklen_t len) {
  unsigned char b[16];
  unsigned port;
  uint32_t scope;
  if (sa_bytes(sa, len, b, &port, &scope) != 0) return 0;   /* not an IP address */
  for (size_t k = 0; k < out->n; k++)
    if (memcmp(out->a[k], b, 16) == 0) return 0;
  if (out->n >= SBX_LOCAL_ADDRS_MAX) return SBX_ETOOBIG;
  memcpy(out->a[out->n++], b, 16);
  return 0;
}

int sbx_local_addrs_load(sbx_local_addrs_t *out) {
  struct ifaddrs *list, *it;
  int rc = 0;
  out->n = 0;
  if (getifaddrs(&list) != 0) return -errno;
  for (it = list; it != NULL && rc == 0; it = it->ifa_next) {
    if (it->ifa_addr == NULL) continue;
    if (it->ifa_addr->sa_family == AF_INET)
      rc = local_add(out, it->ifa_addr, sizeof(struct sockaddr_in));
    else if (it->ifa_addr->sa_family == AF_INET6)
      rc = local_add(out, it->ifa_addr, sizeof(struct sockaddr_in6));
  }
  freeifaddrs(list);
  if (rc != 0) out->n = 0;
  return rc;
}

int sbx_local_addrs_from_texts(const char *const *texts, const size_t *lens,
                               size_t n, sbx_local_addrs_t *out) {
  out->n = 0;
  for (size_t k = 0; k < n; k++) {
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc;
    if (texts[k] == NULL) return SBX_EINVAL;
    if (sbx_addr_parse(texts[k], lens ? lens[k] : strlen(texts[k]), 0, &ss, &sl) != 0) return SBX_EINVAL;
    if ((rc = local_add(out, (struct sockaddr *)&ss, sl)) != 0) return rc;
  }
  return 0;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const sbx_local_addrs_t *sbx_local_addrs_cached(uint64_t max_age_ms, int *rc) {
  static sbx_local_addrs_t snap;
  static uint64_t loaded_at;
  static int valid;
  uint64_t now = now_ms();
  int r = 0;
  if (!valid || max_age_ms == 0 || now - loaded_at >= max_age_ms) {
    valid = 0;
    r = sbx_local_addrs_load(&snap);
    if (r == 0) { valid = 1; loaded_at = now; }
  }
  if (rc) *rc = r;
  return valid ? &snap : NULL;
}

int sbx_addr_is_local(const sbx_local_addrs_t *local, const struct sockaddr *sa, socklen_t len) {
  unsigned char b[16];
  unsigned port;
  uint32_t scope;
  if (local == NULL || sa_bytes(sa, len, b, &port, &scope) != 0) return 1;
  for (size_t k = 0; k < local->n; k++)
    if (memcmp(local->a[k], b, 16) == 0) return 1;
  return 0;
}

int sbx_addr_vet(const struct sockaddr *sa, socklen_t len,
                 const sbx_local_addrs_t *local, const char **why) {
  if (!sbx_addr_classify(sa, len, why)) return 0;
  if (local == NULL) {
    if (why) *why = "host interfaces unreadable";
    return 0;
  }
  if (sbx_addr_is_local(local, sa, len)) {
    if (why) *why = "host's own address";
    return 0;
  }
  return 1;
}

/* ---- Lua ------------------------------------------------------------------- */

static void push_url(lua_State *L, const sbx_url_t *u) {
  static const char *kinds[] = {"name", "ipv4", "ipv6"};
  lua_createtable(L, 0, 11);
  lua_pushstring(L, u->scheme);
  lua_setfield(L, -2, "scheme");
  lua_pushlstring(L, u->host, u->host_len);
  lua_setfield(L, -2, "host");
  lua_pushinteger(L, u->port);
  lua_setfield(L, -2, "port");
  lua_pushboolean(L, u->port_explicit);
  lua_setfield(L, -2, "port_explicit");
  lua_pushlstring(L, u->path, u->path_len);
  lua_setfield(L, -2, "path_and_query");
  lua_pushboolean(L, u->host_kind != SBX_HOST_NAME);
  lua_setfield(L, -2, "host_is_ip");
  lua_pushstring(L, kinds[u->host_kind]);
  lua_setfield(L, -2, "host_kind");
  lua_pushlstring(L, u->href, u->href_len);
  lua_setfield(L, -2, "href");
  lua_pushlstring(L, u->href + u->authority_off, u->authority_len);
  lua_setfield(L, -2, "authority");
  lua_pushlstring(L, u->href, u->authority_off + u->authority_len);
  lua_setfield(L, -2, "origin");
  lua_pushboolean(L, u->https);
  lua_setfield(L, -2, "https");
}

/* The struct is large: keep it off the C stack, in a userdata Lua frees. */
static sbx_url_t *new_url(lua_State *L) {
  return lua_newuserdatauv(L, sizeof(sbx_url_t), 0);
}

/* core.url_admit(url) -> table | nil, catalogue message */
static int l_url_admit(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  const char *err;
  sbx_url_t *u = new_url(L);
  if (sbx_url_admit(s, n, u, &err) != SBX_URL_OK) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  push_url(L, u);
  return 1;
}

/* Builds a snapshot from the Lua list at idx (the localAddresses seam). */
static int snapshot_from_list(lua_State *L, int idx, sbx_local_addrs_t *snap) {
  lua_Integer n = luaL_len(L, idx);
  snap->n = 0;
  for (lua_Integer k = 1; k <= n; k++) {
    struct sockaddr_storage ss;
    socklen_t sl;
    size_t tl;
    const char *t;
    int rc;
    lua_geti(L, idx, k);
    t = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &tl) : NULL;
    rc = t ? sbx_addr_parse(t, tl, 0, &ss, &sl) : SBX_EINVAL;
    lua_pop(L, 1);
    if (rc != 0) return SBX_EINVAL;
    if ((rc = local_add(snap, (struct sockaddr *)&ss, sl)) != 0) return rc;
  }
  return 0;
}

/* core.addr_classify(ip [, port [, local_list]]) -> "public" | nil, reason.
 * port: 0..65535 (0 is refused); absent: the address alone is judged.
 * local_list: address texts treated as the host's own (fetch.lua's
 * localAddresses seam); a malformed entry refuses. */
static int l_addr_classify(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  int has_port = !lua_isnoneornil(L, 2);
  lua_Integer port = has_port ? luaL_checkinteger(L, 2) : 0;
  struct sockaddr_storage ss;
  socklen_t sl;
  const char *why;
  luaL_argcheck(L, port >= 0 && port <= 65535, 2, "port out of range");
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  if (sbx_addr_parse(s, n, (uint16_t)port, &ss, &sl) != 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a strict IP literal");
    return 2;
  }
  if (!classify((struct sockaddr *)&ss, sl, has_port, &why)) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
  }
  if (!lua_isnoneornil(L, 3)) {
    sbx_local_addrs_t *snap = lua_newuserdatauv(L, sizeof *snap, 0);
    if (snapshot_from_list(L, 3, snap) != 0) {
      lua_pushnil(L);
      lua_pushliteral(L, "malformed host address list");
      return 2;
    }
    if (sbx_addr_is_local(snap, (struct sockaddr *)&ss, sl)) {
      lua_pushnil(L);
      lua_pushliteral(L, "host's own address");
      return 2;
    }
  }
  lua_pushliteral(L, "public");
  return 1;
}

/* core.addr_parse(text) -> canonical text, family (4 or 6) | nil, reason */
static int l_addr_parse(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  struct sockaddr_storage ss;
  socklen_t sl;
  char buf[SBX_ADDR_TEXT_MAX];
  int len;
  if (sbx_addr_parse(s, n, 0, &ss, &sl) != 0 ||
      (len = sbx_addr_format((struct sockaddr *)&ss, sl, buf, sizeof buf)) < 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a strict IP literal");
    return 2;
  }
  lua_pushlstring(L, buf, (size_t)len);
  lua_pushinteger(L, ss.ss_family == AF_INET ? 4 : 6);
  return 2;
}

void sbx__open_netaddr(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"url_admit", l_url_admit}, {"addr_classify", l_addr_classify}, {"addr_parse", l_addr_parse},
    {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
