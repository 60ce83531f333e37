/*
 * sbx_fetch.h: safe fetch, the C API (shared/spec/fetch-and-delegation.md
 * 1.2). One credential-free HTTP(S) GET on behalf of host code, vetting and
 * pinning every hop so that a URL chosen by a guest or a model cannot reach
 * private, local or metadata addresses. Everything is non-blocking on the
 * caller's libuv loop; the hop loop (admission, one lookup per hop, vetting,
 * attempts with fallback, redirects, deadlines) lives in fetch_call.c.
 *
 * Threading: one loop, one thread. Every function here is called on the
 * loop's thread; every callback runs there, from a libuv callback.
 *
 * Lifetimes
 * - sbx_fetch_start / sbx_assert_public_url_start return a handle that is
 *   valid until done_cb has returned. done_cb runs exactly once: from a loop
 *   callback, or from inside sbx_fetch_cancel (SBX_FETCH_E_ABORTED), never
 *   from inside a start function.
 * - A result handed to done_cb belongs to the callee: sbx_fetch_result_free.
 *   An error (sbx_fetch_error) is valid during the callback only.
 * - Before closing the loop, cancel every live handle and run the loop until
 *   it is not alive: the call's handles close there. A pending system lookup
 *   is abandoned; its thread-pool result is discarded when it arrives.
 *
 * Test seams (resolve, transport, local_addresses) are trusted host code:
 * never build them, the headers or the bounds from guest input. A seam gets
 * a reply handle and answers it exactly once, now or later (after the loop
 * turned), or releases it; an answer after the call ended (cancel, deadline)
 * is discarded safely. Seams are called from loop callbacks only.
 */
#ifndef SBX_FETCH_H
#define SBX_FETCH_H

#include <stddef.h>
#include <stdint.h>

/* The caller's libuv loop. Declared, not included: <uv.h> needs POSIX
 * types that a strict -std=c11 build does not declare, and this header must
 * compile there (a redeclaration of the same typedef is valid C11). */
typedef struct uv_loop_s uv_loop_t;

/* ---- bounds and defaults (1.3, 1.9, 1.14) ------------------------------ */

#define SBX_FETCH_DEFAULT_MAX_BYTES       5242880
#define SBX_FETCH_MAX_BYTES               33554432
#define SBX_FETCH_DEFAULT_TIMEOUT_MS      60000
#define SBX_FETCH_DEFAULT_IDLE_TIMEOUT_MS 30000
#define SBX_FETCH_MAX_TIMEOUT_MS          120000     /* timeouts: 1 ... this */
#define SBX_FETCH_DEFAULT_MAX_REDIRECTS   5
#define SBX_FETCH_MAX_REDIRECTS           10
#define SBX_FETCH_DEFAULT_CHECK_TIMEOUT_MS 10000     /* sbx_assert_public_url_start */
#define SBX_FETCH_CONNECT_TIMEOUT_MS      3000       /* per address (1.10) */
#define SBX_FETCH_MAX_HEADERS             32         /* caller headers (1.9) */
#define SBX_FETCH_MAX_HEADER_NAME         256
#define SBX_FETCH_MAX_HEADER_VALUE        8192
#define SBX_FETCH_MAX_ANSWERS             256        /* a longer answer is refused as non-public */

/* ---- error catalogue (1.15): one code per row -------------------------- */

#define SBX_FETCH_OK                 0
#define SBX_FETCH_E_BOUNDS           (-2001)  /* UnsafeUrlError "Invalid fetch bounds" */
#define SBX_FETCH_E_HEADERS          (-2002)  /* UnsafeUrlError "Invalid fetch headers" */
#define SBX_FETCH_E_URL              (-2003)  /* UnsafeUrlError "Invalid URL" */
#define SBX_FETCH_E_CREDENTIALS      (-2004)  /* UnsafeUrlError "Only credential-free HTTP(S) URLs are allowed" */
#define SBX_FETCH_E_PORT0            (-2005)  /* UnsafeUrlError "Port 0 is not allowed" */
#define SBX_FETCH_E_NON_PUBLIC       (-2006)  /* UnsafeUrlError "URL resolves to a non-public address" */
#define SBX_FETCH_E_UNREACHABLE      (-2007)  /* UnsafeUrlError "No vetted address could be reached" */
#define SBX_FETCH_E_CONNECT_TIMEOUT  (-2008)  /* TransportError "Connection deadline exceeded" (ETIMEDOUT) */
#define SBX_FETCH_E_IDLE             (-2009)  /* UnsafeUrlError "Response idle timeout exceeded" */
#define SBX_FETCH_E_HEADER_BLOCK     (-2010)  /* UnsafeUrlError "Response header block too large" */
#define SBX_FETCH_E_DECLARED         (-2011)  /* ResponseTooLargeError "Response exceeds bounds" */
#define SBX_FETCH_E_ENCODING         (-2012)  /* UnsafeUrlError "Response exceeds bounds or uses unsupported encoding" */
#define SBX_FETCH_E_WIRE             (-2013)  /* UnsafeUrlError "Wire body too large" */
#define SBX_FETCH_E_BODY             (-2014)  /* UnsafeUrlError "Response body too large" */
#define SBX_FETCH_E_REDIRECTS        (-2015)  /* UnsafeUrlError "Too many redirects" */
#define SBX_FETCH_E_NO_LOCATION      (-2016)  /* UnsafeUrlError "Redirect without location" */
#define SBX_FETCH_E_LOCATION         (-2017)  /* UnsafeUrlError "Invalid redirect location" */
#define SBX_FETCH_E_DOWNGRADE        (-2018)  /* UnsafeUrlError "Redirect from HTTPS to HTTP refused" */
#define SBX_FETCH_E_TIMEOUT          (-2019)  /* TimeoutError "Fetch deadline exceeded" */
#define SBX_FETCH_E_CHECK_TIMEOUT    (-2020)  /* TimeoutError "URL check deadline exceeded" */
#define SBX_FETCH_E_DECODE           (-2021)  /* DecodeError "Response body could not be decoded" */
#define SBX_FETCH_E_ABORTED          (-2022)  /* the caller cancelled (Lua raises the signal's reason) */
#define SBX_FETCH_E_RESOLVE          (-2023)  /* ResolveError: message is the resolver's text */
#define SBX_FETCH_E_TRANSPORT        (-2024)  /* TransportError: message is libcurl's (or the seam's) text */

/* The exact catalogue message of a code ("Aborted", "Name resolution
 * failed", "Transport failure" for the rows whose text comes from elsewhere;
 * "" for SBX_FETCH_OK; "Unknown fetch error" otherwise). Static. */
const char *sbx_fetch_strerror(int code);

/* The 1.15 `name` of a code ("UnsafeUrlError", "ResponseTooLargeError",
 * "TransportError", "TimeoutError", "DecodeError", "ResolveError",
 * "AbortError"). Static. */
const char *sbx_fetch_error_name(int code);

/* ---- values ------------------------------------------------------------ */

/* A header field; strings need not be NUL-terminated. In results, names are
 * lower-case and the strings are NUL-terminated and owned by the result. */
typedef struct sbx_fetch_header {
  const char *name;
  size_t name_len;
  const char *value;
  size_t value_len;
} sbx_fetch_header_t;

/* 1.4. Free with sbx_fetch_result_free. */
typedef struct sbx_fetch_result {
  const char *url;              /* canonical URL of the hop, no fragment */
  size_t url_len;
  int status;                   /* 0 for sbx_assert_public_url_start */
  const char *status_text;      /* reason phrase, NULL when none */
  size_t status_text_len;
  const sbx_fetch_header_t *headers;   /* ordered; repeats joined with ", " */
  size_t nheaders;
  char *body;                   /* decoded bytes (malloc'd); see seam_token */
  size_t body_len;
  unsigned location_count;      /* Location fields the response carried */
  uintptr_t seam_token;         /* opaque: set by a transport seam, handed back unchanged.
                                   Only with seam_token != 0 may body be NULL while
                                   body_len > 0 (the seam keeps the bytes: the Lua layer) */
} sbx_fetch_result_t;

void sbx_fetch_result_free(sbx_fetch_result_t *res);

/* A copy of everything given (body too, when non-NULL); NULL on out of
 * memory. What a C transport seam replies with. */
sbx_fetch_result_t *sbx_fetch_result_new(const char *url, size_t url_len, int status,
                                         const char *status_text, size_t status_text_len,
                                         const sbx_fetch_header_t *headers, size_t nheaders,
                                         const char *body, size_t body_len);

/* What done_cb gets instead of a result. */
typedef struct sbx_fetch_error {
  int code;                     /* SBX_FETCH_E_* */
  const char *name;             /* sbx_fetch_error_name(code) */
  const char *message;          /* catalogue message, or the resolver's / transport's / seam's text */
  const char *errno_name;       /* TransportError: "ECONNRESET", ... when known; else NULL */
  int after_response;           /* TransportError from the real transport: not a fallback case */
  int status;                   /* SBX_FETCH_E_DECLARED: the declared status */
  const sbx_fetch_header_t *headers;   /* SBX_FETCH_E_DECLARED: its headers */
  size_t nheaders;
  int from_seam;                /* a seam's failure reply ended the call, passed on as it came */
} sbx_fetch_error_t;

typedef struct sbx_fetch sbx_fetch_t;

/* Exactly one of res / err is non-NULL. */
typedef void (*sbx_fetch_done_cb)(sbx_fetch_t *f, sbx_fetch_result_t *res,
                                  const sbx_fetch_error_t *err, void *ud);

/* ---- test seams -------------------------------------------------------- */

typedef struct sbx_fetch_reply sbx_fetch_reply_t;

/* One resolver answer or local address. text NULL, or family not 4/6 (for
 * answers), marks a malformed entry: the hop is refused as non-public. */
typedef struct sbx_fetch_address {
  const char *text;
  size_t len;
  int family;                   /* 4 or 6; ignored for local addresses */
} sbx_fetch_address_t;

/* What a transport seam is asked to do: one attempt against one vetted
 * address. The strings are valid during the seam call only. */
typedef struct sbx_fetch_attempt_info {
  const char *url;              /* canonical href of the hop */
  size_t url_len;
  const char *address;          /* the vetted address as the resolver gave it */
  size_t address_len;
  int family;                   /* 4 or 6 */
  uint16_t port;                /* the URL's effective port */
  size_t max_bytes;
  const sbx_fetch_header_t *headers;   /* the request headers of 1.9, lower-case names */
  size_t nheaders;
  uint64_t time_left_ms;        /* on the whole-call deadline */
  uint64_t idle_timeout_ms;
  const char *cainfo;
} sbx_fetch_attempt_info;

/* Answer with sbx_fetch_reply_addresses or sbx_fetch_reply_fail. */
typedef void (*sbx_fetch_resolve_fn)(void *seam_ud, const char *host, size_t host_len,
                                     sbx_fetch_reply_t *reply);
/* Answer with sbx_fetch_reply_result or sbx_fetch_reply_fail. */
typedef void (*sbx_fetch_transport_fn)(void *seam_ud, const sbx_fetch_attempt_info *info,
                                       sbx_fetch_reply_t *reply);
/* Answer with sbx_fetch_reply_addresses (family ignored) or sbx_fetch_reply_fail. */
typedef void (*sbx_fetch_local_fn)(void *seam_ud, sbx_fetch_reply_t *reply);

/* Each consumes the reply. 0 when taken, 1 when discarded (the call is
 * over, or the reply is of the wrong kind: it then fails the call). */
int sbx_fetch_reply_addresses(sbx_fetch_reply_t *r, const sbx_fetch_address_t *list, size_t n);
/* Takes ownership of res (also when discarded). */
int sbx_fetch_reply_result(sbx_fetch_reply_t *r, sbx_fetch_result_t *res);
/* A failure. For the transport, errno_name (e.g. "ECONNREFUSED") before any
 * response byte (after_response 0) lets the call fall back to the next
 * address (1.10); otherwise the call ends with this failure (from_seam).
 * For the resolver the message becomes the ResolveError text. */
int sbx_fetch_reply_fail(sbx_fetch_reply_t *r, const char *errno_name, int after_response,
                         const char *message);
/* Gives the reply up without answering (a seam that will never answer). */
void sbx_fetch_reply_release(sbx_fetch_reply_t *r);

/* ---- options (1.3) ----------------------------------------------------- */

/* Numeric bounds are doubles so that every caller (Lua, JavaScript, C) gets
 * the same rule: an integral value inside the range, else
 * SBX_FETCH_E_BOUNDS (0, negatives, fractions, NaN, infinities). */
typedef struct sbx_fetch_opts {
  double max_bytes;             /* 1 ... 33554432 */
  double timeout_ms;            /* 1 ... 120000: whole call */
  double idle_timeout_ms;       /* 1 ... 120000 */
  double max_redirects;         /* 0 ... 10 */
  double check_timeout_ms;      /* 1 ... 120000: sbx_assert_public_url_start only */
  int follow_redirects;         /* 1 or 0; anything else is SBX_FETCH_E_BOUNDS */
  const sbx_fetch_header_t *headers;   /* trusted request headers (1.9) */
  size_t nheaders;              /* a NULL name marks an invalid entry */
  const char *cainfo;           /* trusted CA bundle path; NULL: the system store */
  sbx_fetch_resolve_fn resolve;         /* NULL: getaddrinfo on the thread pool */
  sbx_fetch_transport_fn transport;     /* NULL: the pinned libcurl transport */
  sbx_fetch_local_fn local_addresses;   /* NULL: getifaddrs at every vetting */
  void *seam_ud;
  /* Trusted test seam (specs, the C test, benchmarks): when non-NULL, every
   * attempt of the default transport connects to this IP literal and port
   * instead of the vetted address. Vetting still judges the real answers,
   * and the URL, Host header, SNI and certificate check keep the hostname.
   * An address that is not an IP literal, or port 0, is SBX_FETCH_E_BOUNDS. */
  const char *test_connect_address;
  uint16_t test_connect_port;
} sbx_fetch_opts;

/* Every default of 1.3; no headers, no seams. */
void sbx_fetch_opts_init(sbx_fetch_opts *o);

/* The bound and header checks of 1.3 / 1.9 alone: 0, SBX_FETCH_E_BOUNDS or
 * SBX_FETCH_E_HEADERS. check: 1 judges only check_timeout_ms (1.14). */
int sbx_fetch_opts_check(const sbx_fetch_opts *o, int check);

/* ---- calls --------------------------------------------------------------- */

/* Starts a safe fetch of url[0..len). Bounds, headers and URL admission are
 * checked at once: on failure it returns NULL with *err set (a bound:
 * SBX_FETCH_E_BOUNDS, a header: SBX_FETCH_E_HEADERS, the URL: _URL,
 * _CREDENTIALS or _PORT0; SBX_FETCH_E_TRANSPORT on out of memory) and
 * nothing runs. url NULL is SBX_FETCH_E_URL. opts is copied. */
sbx_fetch_t *sbx_fetch_start(uv_loop_t *loop, const char *url, size_t len,
                             const sbx_fetch_opts *opts, sbx_fetch_done_cb done_cb,
                             void *ud, int *err);

/* Aborts at once: done_cb runs before this returns, with
 * SBX_FETCH_E_ABORTED. No-op on a handle whose done_cb is running. */
void sbx_fetch_cancel(sbx_fetch_t *f);

/* 1.14: admits and vets url (lookup and host interfaces included) under
 * opts->check_timeout_ms, pins nothing. The result carries only url (the
 * canonical form). Uses resolve / local_addresses seams; returns NULL with
 * *err as sbx_fetch_start. Cancel with sbx_fetch_cancel. */
sbx_fetch_t *sbx_assert_public_url_start(uv_loop_t *loop, const char *url, size_t len,
                                         const sbx_fetch_opts *opts,
                                         sbx_fetch_done_cb done_cb, void *ud, int *err);

#endif
