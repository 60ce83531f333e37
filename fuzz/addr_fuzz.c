/*
 * addr_fuzz.c: libFuzzer harness for safe fetch's address policy
 * (core/netaddr.c, shared/spec/fetch-and-delegation.md 1.6 and 1.7).
 *
 * Input: the first byte picks a mode.
 *   even: the rest is address text for sbx_addr_is_public_n / sbx_addr_parse;
 *   odd:  the rest fills a socket address (family, port, scope id, bytes) for
 *         sbx_addr_classify, including wrong lengths and unknown families.
 * Invariants, against an independent model written here as CIDR prefixes
 * (not the hextet comparisons of netaddr.c):
 *
 *  - the verdict equals the model's: IPv4 public iff in none of the 14
 *    refused ranges; IPv6 public iff IPv4-mapped with a public IPv4, or in
 *    2000::/3 and in none of the 7 refused prefixes; port 0, a scope id, an
 *    unknown family or a short length are never public;
 *  - a text the parser accepts is one glibc's inet_pton accepts, to the same
 *    bytes, and the other way round (for texts without brackets or '%');
 *  - the canonical text of a parsed address parses back to the same bytes
 *    and is never longer than SBX_ADDR_TEXT_MAX - 1;
 *  - an address listed as the host's own is refused by sbx_addr_vet, and a
 *    public one not listed passes it; at start-up, the real interface list
 *    (getifaddrs) loads and each of its addresses is refused.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "netaddr.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

typedef struct { uint8_t p[16]; unsigned bits; } prefix_t;

/* 1.6, IPv4 refused ranges, as IPv4-mapped /96+n prefixes. */
static const prefix_t v4_refused[] = {
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 0}, 96 + 8},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10}, 96 + 8},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 100, 64}, 96 + 10},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 127}, 96 + 8},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 169, 254}, 96 + 16},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 172, 16}, 96 + 12},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 192, 0, 0}, 96 + 24},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 192, 0, 2}, 96 + 24},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 192, 88, 99}, 96 + 24},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 192, 168}, 96 + 16},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 198, 18}, 96 + 15},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 198, 51, 100}, 96 + 24},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 203, 0, 113}, 96 + 24},
  {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 224}, 96 + 3},
};

static const prefix_t v6_holes[] = {
  {{0x20, 0x02}, 16},                       /* 6to4 */
  {{0x20, 0x01, 0x00, 0x00}, 32},           /* Teredo */
  {{0x20, 0x01, 0x00, 0x02}, 32},           /* benchmarking */
  {{0x20, 0x01, 0x0d, 0xb8}, 32},           /* documentation */
  {{0x20, 0x01, 0x00, 0x10}, 28},           /* ORCHID */
  {{0x20, 0x01, 0x00, 0x20}, 28},           /* ORCHIDv2 */
  {{0x3f, 0xff}, 16},                       /* documentation */
};

static const prefix_t mapped = {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255}, 96};
static const prefix_t global = {{0x20}, 3};

static int in_prefix(const uint8_t a[16], const prefix_t *p) {
  unsigned full = p->bits / 8, rest = p->bits % 8;
  if (memcmp(a, p->p, full) != 0) return 0;
  if (rest == 0) return 1;
  uint8_t mask = (uint8_t)(0xFF << (8 - rest));
  return (a[full] & mask) == (p->p[full] & mask);
}

/* The model: a is 16 bytes, IPv4 given as ::ffff:a.b.c.d. */
static int model_public(const uint8_t a[16]) {
  if (in_prefix(a, &mapped)) {
    for (size_t k = 0; k < sizeof v4_refused / sizeof v4_refused[0]; k++)
      if (in_prefix(a, &v4_refused[k])) return 0;
    return 1;
  }
  if (!in_prefix(a, &global)) return 0;
  for (size_t k = 0; k < sizeof v6_holes / sizeof v6_holes[0]; k++)
    if (in_prefix(a, &v6_holes[k])) return 0;
  return 1;
}

static void bytes_of(const struct sockaddr_storage *ss, uint8_t a[16]) {
  if (ss->ss_family == AF_INET) {
    memcpy(a, mapped.p, 12);
    memcpy(a + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
  } else {
    memcpy(a, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
  }
}

static void check_parsed(const struct sockaddr_storage *ss, socklen_t len, int verdict_text) {
  uint8_t a[16], b[16];
  char text[SBX_ADDR_TEXT_MAX];
  struct sockaddr_storage again;
  socklen_t alen;
  const char *why = NULL;
  int n;

  bytes_of(ss, a);
  CHECK(verdict_text == model_public(a));
  CHECK(sbx_addr_is_public_sa((const struct sockaddr *)ss, len) == verdict_text);
  n = sbx_addr_format((const struct sockaddr *)ss, len, text, sizeof text);
  CHECK(n > 0 && n < SBX_ADDR_TEXT_MAX && (size_t)n == strlen(text));
  CHECK(sbx_addr_parse(text, (size_t)n, 443, &again, &alen) == 0);
  CHECK(again.ss_family == ss->ss_family && alen == len);
  bytes_of(&again, b);
  CHECK(memcmp(a, b, 16) == 0);
  /* with a port: same verdict; with port 0: refused */
  CHECK(sbx_addr_classify((const struct sockaddr *)&again, alen, &why) == verdict_text);
  CHECK(why != NULL);
  CHECK(sbx_addr_parse(text, (size_t)n, 0, &again, &alen) == 0);
  CHECK(sbx_addr_classify((const struct sockaddr *)&again, alen, &why) == 0);

  /* the host's own addresses */
  {
    static sbx_local_addrs_t local;
    const char *texts[2] = {text, "192.0.2.1"};
    size_t lens[2] = {(size_t)n, 9};
    CHECK(sbx_local_addrs_from_texts(texts, lens, 2, &local) == 0);
    CHECK(sbx_addr_parse(text, (size_t)n, 443, &again, &alen) == 0);
    CHECK(sbx_addr_is_local(&local, (const struct sockaddr *)&again, alen) == 1);
    CHECK(sbx_addr_vet((const struct sockaddr *)&again, alen, &local, &why) == 0);
    CHECK(sbx_addr_vet((const struct sockaddr *)&again, alen, NULL, &why) == 0);
    CHECK(sbx_local_addrs_from_texts(texts + 1, lens + 1, 1, &local) == 0);
    CHECK(sbx_addr_vet((const struct sockaddr *)&again, alen, &local, &why) == verdict_text);
  }
}

static void text_mode(const uint8_t *data, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len;
  const char *why = NULL;
  int pub = sbx_addr_is_public_n((const char *)data, size, &why);
  int rc = sbx_addr_parse((const char *)data, size, 443, &ss, &len);
  CHECK(why != NULL);
  if (rc != 0) {
    CHECK(pub == 0);
  } else {
    check_parsed(&ss, len, pub);
  }

  /* differential against inet_pton, for plain texts only */
  if (size == 0 || size >= 64 || memchr(data, '[', size) || memchr(data, ']', size) ||
      memchr(data, '%', size) || memchr(data, 0, size))
    return;
  char t[64];
  uint8_t want[16];
  memcpy(t, data, size);
  t[size] = '\0';
  int fam = memchr(t, ':', size) ? AF_INET6 : AF_INET;
  int ok = inet_pton(fam, t, want) == 1;
  CHECK(ok == (rc == 0));
  if (ok) {
    if (fam == AF_INET)
      CHECK(memcmp(&((struct sockaddr_in *)&ss)->sin_addr, want, 4) == 0);
    else
      CHECK(memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, want, 16) == 0);
  }
}

static void sockaddr_mode(const uint8_t *data, size_t size) {
  struct sockaddr_storage ss;
  const char *why = NULL;
  uint8_t ctl, a[16] = {0};
  uint16_t port;
  uint32_t scope;
  socklen_t len;
  int v;

  if (size < 8) return;
  ctl = data[0];
  port = (uint16_t)(data[1] << 8 | data[2]);
  scope = (ctl & 0x10) ? data[3] : 0;
  memcpy(a, data + 4, size - 4 > 16 ? 16 : size - 4);
  memset(&ss, 0, sizeof ss);
  if ((ctl & 3) == 0) {
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    memcpy(&s4->sin_addr, a, 4);
    len = sizeof *s4;
  } else if ((ctl & 3) == 3) {
    ss.ss_family = (sa_family_t)(AF_UNIX + (ctl >> 5));
    if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) ss.ss_family = AF_UNIX;
    len = sizeof ss;
  } else {
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    s6->sin6_scope_id = scope;
    memcpy(&s6->sin6_addr, a, 16);
    len = sizeof *s6;
  }
  if (ctl & 0x20 && len > 2) len = (socklen_t)(len - 1 - (ctl >> 6));   /* short */

  v = sbx_addr_classify((const struct sockaddr *)&ss, len, &why);
  CHECK(why != NULL && (v == 0 || v == 1));
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) { CHECK(v == 0); return; }
  if ((ss.ss_family == AF_INET && len < (socklen_t)sizeof(struct sockaddr_in)) ||
      (ss.ss_family == AF_INET6 && len < (socklen_t)sizeof(struct sockaddr_in6))) {
    CHECK(v == 0);
    CHECK(sbx_addr_is_public_sa((const struct sockaddr *)&ss, len) == 0);
    return;
  }
  if (ss.ss_family == AF_INET6 && scope != 0) { CHECK(v == 0); return; }
  uint8_t b[16];
  bytes_of(&ss, b);
  CHECK(v == (port != 0 && model_public(b)));
  check_parsed(&ss, len, sbx_addr_is_public_sa((const struct sockaddr *)&ss, len));
}

/* Once: the real interface list loads, every entry round-trips through the
 * canonical text, and each is refused by sbx_addr_vet against the list. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  static sbx_local_addrs_t real;
  int rc;
  const sbx_local_addrs_t *cached;
  (void)argc;
  (void)argv;
  CHECK(sbx_local_addrs_load(&real) == 0);
  cached = sbx_local_addrs_cached(SBX_LOCAL_ADDRS_MAX_AGE_MS, &rc);
  CHECK(rc == 0 && cached != NULL && cached->n == real.n);
  for (size_t k = 0; k < real.n; k++) {
    struct sockaddr_in6 s6;
    memset(&s6, 0, sizeof s6);
    s6.sin6_family = AF_INET6;
    s6.sin6_port = htons(443);
    memcpy(&s6.sin6_addr, real.a[k], 16);
    CHECK(sbx_addr_is_local(&real, (const struct sockaddr *)&s6, sizeof s6) == 1);
    CHECK(sbx_addr_vet((const struct sockaddr *)&s6, sizeof s6, &real, NULL) == 0);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) sockaddr_mode(data + 1, size - 1);
  else text_mode(data + 1, size - 1);
  return 0;
}
