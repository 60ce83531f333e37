/*
 * url_fuzz.c: libFuzzer harness for safe fetch's URL admission
 * (core/netaddr.c, shared/spec/fetch-and-delegation.md 1.5 and 1.11 item 5).
 *
 * Input: the bytes of a URL. It is admitted as an initial URL, and also
 * resolved as a redirect `Location` against a fixed https base. Invariants,
 * checked against a naive re-reading of the result written here:
 *
 *  - the code is one of the four admission codes and *err is its exact
 *    catalogue message;
 *  - an admitted URL is http or https, its href is "scheme://authority" +
 *    path, at most 8,192 bytes, printable ASCII with no space, backslash,
 *    '#' or '@' in the authority, no dot segment left in the path;
 *  - the host is 1..253 bytes without forbidden code points; an IP host is
 *    the canonical text of the bytes in `ip` (re-parsed strictly here), a
 *    name host never "ends in a number";
 *  - the port is 1..65535 and appears in href exactly when it is not the
 *    scheme's default;
 *  - admitting href again gives the same URL, field by field (idempotence),
 *    and resolving "" or "#x" against it gives it back.
 */
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "netaddr.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static int is_seg(const char *s, size_t n, const char *w) {
  return strlen(w) == n && memcmp(s, w, n) == 0;
}

static int forbidden_host(unsigned char c) {
  return c <= 0x20 || c >= 0x7F || strchr("#%/:<>?@[\\]^|", c) != NULL;
}

static void check_url(const sbx_url_t *u) {
  size_t sl = strlen(u->scheme);
  CHECK(strcmp(u->scheme, u->https ? "https" : "http") == 0);
  CHECK(u->href_len <= SBX_URL_MAX && strlen(u->href) == u->href_len);
  CHECK(strlen(u->host) == u->host_len && u->host_len >= 1 && u->host_len <= SBX_URL_HOST_MAX);
  CHECK(strlen(u->path) == u->path_len && u->path_len >= 1 && u->path[0] == '/');
  CHECK(memcmp(u->href, u->scheme, sl) == 0 && memcmp(u->href + sl, "://", 3) == 0);
  CHECK(u->authority_off == sl + 3);
  CHECK(u->authority_off + u->authority_len + u->path_len == u->href_len);
  CHECK(memcmp(u->href + u->authority_off + u->authority_len, u->path, u->path_len) == 0);
  for (size_t i = 0; i < u->href_len; i++) {
    unsigned char c = (unsigned char)u->href[i];
    CHECK(c > 0x20 && c < 0x7F && c != '\\' && c != '#');
  }
  for (size_t i = 0; i < u->path_len; i++)   /* the host may hold " ` { } (1.5 item 7) */
    CHECK(strchr("\"<>`{}", u->path[i]) == NULL);
  CHECK(memchr(u->href + u->authority_off, '@', u->authority_len) == NULL);

  /* port */
  uint16_t def = u->https ? 443 : 80;
  CHECK(u->port >= 1);
  CHECK(u->port_explicit == (u->port != def));
  const char *colon = NULL;
  const char *auth = u->href + u->authority_off;
  if (u->host_kind == SBX_HOST_IPV6) {
    CHECK(auth[0] == '[' && auth[u->host_len + 1] == ']');
    CHECK(memcmp(auth + 1, u->host, u->host_len) == 0);
    if (u->authority_len > u->host_len + 2) colon = auth + u->host_len + 2;
  } else {
    CHECK(memcmp(auth, u->host, u->host_len) == 0);
    if (u->authority_len > u->host_len) colon = auth + u->host_len;
  }
  if (u->port_explicit) {
    unsigned long v;
    char tmp[8];
    size_t pl;
    CHECK(colon != NULL && *colon == ':');
    pl = u->authority_len - (size_t)(colon + 1 - auth);
    CHECK(pl >= 1 && pl <= 5 && colon[1] != '0');
    memcpy(tmp, colon + 1, pl);
    tmp[pl] = '\0';
    v = strtoul(tmp, NULL, 10);
    CHECK(v == u->port);
  } else {
    CHECK(colon == NULL);
  }

  /* host */
  if (u->host_kind == SBX_HOST_NAME) {
    for (size_t i = 0; i < u->host_len; i++) {
      CHECK(!forbidden_host((unsigned char)u->host[i]));
      CHECK(!(u->host[i] >= 'A' && u->host[i] <= 'Z'));
    }
  } else {
    struct sockaddr_storage ss;
    socklen_t len;
    char text[SBX_ADDR_TEXT_MAX];
    int n;
    CHECK(u->host_kind == SBX_HOST_IPV4 || u->host_kind == SBX_HOST_IPV6);
    CHECK(sbx_addr_parse(u->host, u->host_len, u->port, &ss, &len) == 0);
    CHECK(ss.ss_family == (u->host_kind == SBX_HOST_IPV4 ? AF_INET : AF_INET6));
    n = sbx_addr_format((struct sockaddr *)&ss, len, text, sizeof text);
    CHECK(n > 0 && (size_t)n == u->host_len && memcmp(text, u->host, u->host_len) == 0);
    if (u->host_kind == SBX_HOST_IPV4)
      CHECK(memcmp(&((struct sockaddr_in *)&ss)->sin_addr, u->ip, 4) == 0);
    else
      CHECK(memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, u->ip, 16) == 0);
  }

  /* no dot segment left in the path (before the query) */
  size_t q = 0;
  while (q < u->path_len && u->path[q] != '?') q++;
  for (size_t i = 0; i < q;) {
    size_t j = i + 1;
    while (j < q && u->path[j] != '/') j++;
    const char *seg = u->path + i + 1;
    size_t n = j - i - 1;
    CHECK(!is_seg(seg, n, ".") && !is_seg(seg, n, ".."));
    CHECK(!is_seg(seg, n, "%2e") && !is_seg(seg, n, "%2E") && !is_seg(seg, n, ".%2e") &&
          !is_seg(seg, n, "%2e.") && !is_seg(seg, n, "%2e%2e") && !is_seg(seg, n, "%2E%2E"));
    i = j;
  }
}

static void check_same(const sbx_url_t *a, const sbx_url_t *b) {
  CHECK(a->https == b->https && a->host_kind == b->host_kind && a->port == b->port &&
        a->port_explicit == b->port_explicit);
  CHECK(a->href_len == b->href_len && memcmp(a->href, b->href, a->href_len) == 0);
  CHECK(a->host_len == b->host_len && memcmp(a->host, b->host, a->host_len) == 0);
  CHECK(a->path_len == b->path_len && memcmp(a->path, b->path, a->path_len) == 0);
  CHECK(a->host_kind == SBX_HOST_NAME || memcmp(a->ip, b->ip, 16) == 0);
  CHECK(sbx_url_same_origin(a, b));
}

static void check_code(int rc, const char *err) {
  CHECK(rc == SBX_URL_OK || rc == SBX_URL_E_INVALID || rc == SBX_URL_E_CREDENTIALS ||
        rc == SBX_URL_E_PORT0 || rc == SBX_URL_E_LOCATION);
  if (rc != SBX_URL_OK) CHECK(err != NULL && strcmp(err, sbx_url_strerror(rc)) == 0);
}

static void admitted(const sbx_url_t *u) {
  static sbx_url_t again, ref;
  const char *err;
  check_url(u);
  CHECK(sbx_url_admit(u->href, u->href_len, &again, &err) == SBX_URL_OK);
  check_same(u, &again);
  CHECK(sbx_url_resolve_ref(u, "", 0, &ref, &err) == SBX_URL_OK);
  check_same(u, &ref);
  CHECK(sbx_url_resolve_ref(u, "#x", 2, &ref, &err) == SBX_URL_OK);
  check_same(u, &ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static sbx_url_t u, base, r;
  const char *err = NULL;
  int rc = sbx_url_admit((const char *)data, size, &u, &err);
  check_code(rc, err);
  CHECK(rc != SBX_URL_E_LOCATION);
  if (rc == SBX_URL_OK) admitted(&u);
  if (size > SBX_URL_MAX) CHECK(rc == SBX_URL_E_INVALID);

  static const char b[] = "https://base.example:8443/dir/page?q=1";
  CHECK(sbx_url_admit(b, sizeof b - 1, &base, &err) == SBX_URL_OK);
  err = NULL;
  rc = sbx_url_resolve_ref(&base, (const char *)data, size, &r, &err);
  check_code(rc, err);
  CHECK(rc != SBX_URL_E_INVALID);
  if (rc == SBX_URL_OK) admitted(&r);
  return 0;
}
