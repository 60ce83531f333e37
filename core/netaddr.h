/*
 * netaddr.h: the pure half of the safe-fetch SSRF guard
 * (shared/spec/fetch-and-delegation.md 1.5, 1.6, 1.7 and 1.15).
 *
 * Two jobs, no I/O except getifaddrs:
 *
 *   - URL admission (1.5): bytes in, a canonical http(s) URL out, or one of
 *     three catalogue refusals. The parser works on bytes, never calls
 *     inet_aton/getaddrinfo on host text, and the canonical `href` it writes
 *     is the only text a transport may hand to libcurl.
 *   - Address policy (1.6): is this IP literal / socket address public? An
 *     IPv4 deny-list, an IPv6 allow-list (2000::/3 minus its listed holes),
 *     IPv4-mapped addresses judged by their IPv4, every other transition form
 *     (NAT64, 6to4, Teredo, IPv4-compatible) refused whatever it embeds. Plus
 *     the host's own interface addresses (1.7), read with getifaddrs into a
 *     snapshot that a test can build from texts instead.
 *
 * Everything here is synchronous, allocation-free and reentrant (resolve_ref
 * uses a 33 KiB stack buffer), except the
 * cached interface snapshot of sbx_local_addrs_cached (loop thread only).
 * Return convention: 0 / 1 for predicates; 0 or a negative SBX_URL_E_* code
 * for admission; 0 or a negative -errno / SBX_E* code elsewhere.
 */
#ifndef SBX_NETADDR_H
#define SBX_NETADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* ---- bounds (1.5) ---------------------------------------------------- */

#define SBX_URL_MAX        8192   /* input bytes, after nothing is trimmed */
#define SBX_URL_HOST_MAX   253    /* decoded host bytes (names); v6 text is shorter */
/* Path+query may triple (every byte percent-encoded); "https://" + "[" host "]"
 * + ":65535" + path. The canonical form always fits. */
#define SBX_URL_PATH_MAX   (3 * SBX_URL_MAX + 1)
#define SBX_URL_HREF_MAX   (8 + SBX_URL_HOST_MAX + 2 + 6 + SBX_URL_PATH_MAX)
#define SBX_ADDR_TEXT_MAX  46     /* INET6_ADDRSTRLEN: longest canonical literal + NUL */

/* ---- URL admission ---------------------------------------------------- */

/* Admission results. Each has one exact catalogue message (1.15), from
 * sbx_url_strerror. The transport maps them onto its SBX_FETCH_E_* codes. */
#define SBX_URL_OK             0
#define SBX_URL_E_INVALID      (-1)  /* "Invalid URL" */
#define SBX_URL_E_CREDENTIALS  (-2)  /* "Only credential-free HTTP(S) URLs are allowed" */
#define SBX_URL_E_PORT0        (-3)  /* "Port 0 is not allowed" */
#define SBX_URL_E_LOCATION     (-4)  /* "Invalid redirect location" (sbx_url_resolve_ref only) */

/* Kinds of host (1.5 item 8). */
#define SBX_HOST_NAME  0   /* a domain name: resolve it, vet every answer */
#define SBX_HOST_IPV4  1   /* a (possibly encoded) IPv4 literal, now a dotted quad */
#define SBX_HOST_IPV6  2   /* a bracketed IPv6 literal */

/*
 * An admitted URL. Every string is NUL-terminated and its length is stored.
 * The struct is large (about 50 KiB, all bounded buffers, nothing to free):
 * keep it on the heap inside a request, or on the stack for a one-off check.
 */
typedef struct sbx_url {
  int https;                          /* 1 for https, 0 for http */
  const char *scheme;                 /* static "http" or "https" */
  int host_kind;                      /* SBX_HOST_* */
  char host[SBX_URL_HOST_MAX + 1];    /* canonical host, IPv6 WITHOUT brackets (1.7) */
  size_t host_len;
  unsigned char ip[16];               /* network order: 4 bytes (IPV4) or 16 (IPV6) */
  uint16_t port;                      /* effective port: explicit, or 80 / 443 */
  int port_explicit;                  /* 1 when the canonical form carries ":port" */
  char path[SBX_URL_PATH_MAX + 1];    /* path and query, starts with '/', no fragment */
  size_t path_len;
  char href[SBX_URL_HREF_MAX + 1];    /* canonical URL, fragment removed: give THIS to libcurl */
  size_t href_len;
  size_t authority_off, authority_len;/* href[off..off+len): "host", "[v6]" or with ":port" */
} sbx_url_t;

/*
 * Parses and admits raw[0..len) per 1.5 (UTF-8, at most SBX_URL_MAX bytes,
 * http/https, no userinfo, port 1..65535, ASCII host, encoded IPv4 normalised
 * or refused, IPv6 literals without zone id). Returns SBX_URL_OK and fills
 * *out, or a negative SBX_URL_E_* code with *err (when err is non-NULL) set
 * to the static catalogue message; *out is then unspecified.
 * Admission does not judge the address: http://127.0.0.1/ is admitted with
 * host_kind SBX_HOST_IPV4; vetting (sbx_addr_classify) refuses it.
 * Re-admitting out->href yields the same sbx_url_t (fuzz/url_fuzz.c checks).
 */
int sbx_url_admit(const char *raw, size_t len, sbx_url_t *out, const char **err);

/*
 * Resolves a redirect `Location` value ref[0..len) against the admitted base
 * (absolute, scheme-relative "//host/...", absolute path, relative path,
 * query-only, fragment-only), then admits the result (1.11 item 5).
 * A value that cannot be resolved or parsed gives SBX_URL_E_LOCATION
 * ("Invalid redirect location"); an admission refusal keeps its own code
 * (SBX_URL_E_CREDENTIALS for file:..., SBX_URL_E_PORT0), except that
 * SBX_URL_E_INVALID becomes SBX_URL_E_LOCATION.
 */
int sbx_url_resolve_ref(const sbx_url_t *base, const char *ref, size_t len,
                        sbx_url_t *out, const char **err);

/* The exact catalogue message of an SBX_URL_E_* code ("Invalid URL" for an
 * unknown code; "" for SBX_URL_OK). */
const char *sbx_url_strerror(int code);

/* Same origin (scheme, host, effective port): 1 or 0 (1.9, 1.11 item 7). */
int sbx_url_same_origin(const sbx_url_t *a, const sbx_url_t *b);

/* ---- address policy (1.6) ---------------------------------------------- */

/*
 * Strict literal parse (1.6): lower-cases, strips one leading '[' and one
 * trailing ']', refuses any '%' (zone id), accepts only a dotted quad without
 * leading zeros or an IPv6 text (optionally ending in such a quad). Writes a
 * sockaddr_in / sockaddr_in6 with the given port (host order) into *ss and
 * its length into *sslen. Returns 0, or SBX_EINVAL (from sbx.h, -1001).
 */
struct sockaddr_storage;
int sbx_addr_parse(const char *text, size_t len, uint16_t port,
                   struct sockaddr_storage *ss, socklen_t *sslen);

/* Canonical text of sa (dotted quad; IPv6 per 1.5: lower-case, longest zero
 * run compressed, no dotted tail, no brackets) into buf (>= SBX_ADDR_TEXT_MAX).
 * Returns the length, or SBX_EINVAL for an unknown family / wrong length. */
int sbx_addr_format(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap);

/*
 * The 1.6 policy for a socket address AND its port. Returns 1 when public,
 * 0 when not; *why (when non-NULL) is then a static reason such as
 * "loopback 127.0.0.0/8", "port 0", "scope id", "NAT64 64:ff9b::/96";
 * on 1 it is "public". Non-public also: unknown family, len too small for
 * the family, a non-zero sin6_scope_id, port 0. An IPv4-mapped IPv6
 * address (::ffff:a.b.c.d) is judged by its IPv4; every other IPv6 form
 * outside 2000::/3 is refused (NAT64, IPv4-compatible, ...), and so are 6to4
 * and Teredo inside it, whatever IPv4 they embed.
 * A getaddrinfo answer carries port 0: set sin_port/sin6_port to the URL's
 * port first (or use sbx_addr_is_public_sa, which ignores the port).
 * This does NOT include the host's own addresses: see sbx_local_addrs_*.
 */
int sbx_addr_classify(const struct sockaddr *sa, socklen_t len, const char **why);

/* Spec 1.2 names. _sa judges the address only (port ignored); text goes
 * through sbx_addr_parse first (a non-strict literal gives 0). */
int sbx_addr_is_public_sa(const struct sockaddr *sa, socklen_t len);
int sbx_addr_is_public(const char *text);
/* Same with explicit length (text need not be NUL-terminated). */
int sbx_addr_is_public_n(const char *text, size_t len, const char **why);

/* ---- the host's own addresses (1.6 last paragraph, 1.7) -------------------- */

#define SBX_LOCAL_ADDRS_MAX 1024   /* more interface addresses: load fails closed */

/* A snapshot of addresses, each stored as 16 bytes (IPv4 as ::ffff:a.b.c.d,
 * so a mapped candidate matches its IPv4). No pointers: copy freely. */
typedef struct sbx_local_addrs {
  size_t n;
  unsigned char a[SBX_LOCAL_ADDRS_MAX][16];
} sbx_local_addrs_t;

/* Reads every interface (up or down), AF_INET and AF_INET6, with
 * getifaddrs. Returns 0, -errno when getifaddrs fails, or SBX_ETOOBIG over
 * SBX_LOCAL_ADDRS_MAX: the caller then refuses the hop (1.6). */
int sbx_local_addrs_load(sbx_local_addrs_t *out);

/* The test seam (localAddresses): builds a snapshot from address texts.
 * Each text must be a strict literal (sbx_addr_parse); returns 0 or
 * SBX_EINVAL (a malformed entry: the caller refuses the hop) / SBX_ETOOBIG. */
int sbx_local_addrs_from_texts(const char *const *texts, const size_t *lens,
                               size_t n, sbx_local_addrs_t *out);

/* A process-wide snapshot re-read when older than max_age_ms (0: re-read
 * now, what vetting does by default per 1.6). Loop thread only. Returns a
 * pointer to the snapshot or NULL (with *rc set) when it cannot be read. */
#define SBX_LOCAL_ADDRS_MAX_AGE_MS 0
const sbx_local_addrs_t *sbx_local_addrs_cached(uint64_t max_age_ms, int *rc);

/* 1 when sa's address (port ignored; IPv4-mapped compared as its IPv4)
 * equals an address of the snapshot, else 0. A NULL snapshot gives 1
 * (fail closed). Unknown family / short len gives 1. */
int sbx_addr_is_local(const sbx_local_addrs_t *local, const struct sockaddr *sa,
                      socklen_t len);

/*
 * The whole per-candidate check of 1.7: sbx_addr_classify, then not one of
 * `local` (NULL: fail closed). Returns 1 when the candidate may be used,
 * 0 with *why (e.g. "host's own address") otherwise.
 */
int sbx_addr_vet(const struct sockaddr *sa, socklen_t len,
                 const sbx_local_addrs_t *local, const char **why);

#endif
