/*
 * fetch_internal.h: what the safe-fetch family shares: fetch_attempt.c (one
 * pinned attempt, its body in fetch_decode.c), fetch_call.c (the hop loop,
 * sbx_fetch.h) and fetch_lua.c (the Lua binding).
 */
#ifndef SBX_FETCH_INTERNAL_H
#define SBX_FETCH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "curl_loop.h"
#include "sbx_fetch.h"

/* Outcome kinds of one attempt. */
enum {
  SBX__ATT_OK = 1, SBX__ATT_REDIRECT, SBX__ATT_IDLE, SBX__ATT_HEAD_TOO_LARGE,
  SBX__ATT_DECLARED_TOO_LARGE, SBX__ATT_ENCODING, SBX__ATT_WIRE_TOO_LARGE,
  SBX__ATT_BODY_TOO_LARGE, SBX__ATT_DECODE, SBX__ATT_PIN, SBX__ATT_BAD_STATUS,
  SBX__ATT_CONNECT_TIMEOUT, SBX__ATT_TRANSPORT, SBX__ATT_NOMEM
};

#define SBX__ATT_MAX_LINES 40        /* 32 caller headers + defaults + forced */
#define SBX__ATT_MAX_LINE  8800      /* "name: value" */
#define SBX__ATT_MAX_FIELDS 100      /* fields of a response (1.12) */

typedef struct sbx__attempt sbx__attempt_t;

typedef struct sbx__attempt_params {
  const char *url;                   /* canonical href, NUL-terminated */
  int family;                        /* AF_INET / AF_INET6 (a mapped v6 is connected as v4) */
  unsigned char addr[16];            /* network order */
  int port;                          /* connect port */
  const char *const *lines;          /* "name: value", NUL-terminated, already validated */
  size_t nlines;
  size_t max_bytes;
  long timeout_ms, connect_ms;
  uint64_t idle_ms;
  const char *cainfo;                /* NULL: the system store */
} sbx__attempt_params_t;

typedef struct sbx__attempt_out {
  int kind;                          /* SBX__ATT_* */
  int has_status;                    /* a final status line was read */
  long status;
  const char *reason;                /* NULL when none */
  size_t reason_len;
  int has_headers;                   /* the final header block ended */
  int location_count;
  char *body;                        /* malloc'd, may be NULL; set to NULL to keep it */
  size_t len;
  int err;                           /* the connection's errno, 0 when none */
  int fallback;                      /* may try the next address */
  const char *message;               /* curl's text for SBX__ATT_TRANSPORT */
  const sbx__attempt_t *a;           /* for sbx__attempt_fields */
} sbx__attempt_out_t;

/* Runs once, from a libuv callback, never after sbx__attempt_cancel. The
 * attempt is freed when it returns. */
typedef void (*sbx__attempt_done_fn)(void *ud, sbx__attempt_out_t *o);

/* The curl loop's done function for loops that carry attempts. */
void sbx__attempt_curl_done(void *priv, CURL *easy, CURLcode rc);

/* Starts one pinned GET on cl. NULL with *err (a static text) on failure. */
sbx__attempt_t *sbx__attempt_start(sbx__curl_loop_t *cl, uv_loop_t *loop,
                                   const sbx__attempt_params_t *p,
                                   sbx__attempt_done_fn done, void *ud, const char **err);

/* Stops and frees it; done never runs. */
void sbx__attempt_cancel(sbx__attempt_t *a);

/* The final block's fields, repeats joined with ", " in arrival order,
 * content-encoding dropped, content-length dropped when a decoder ran and
 * the outcome is OK. Fills out[0..max) and returns the count; the strings
 * live in *mem (malloc'd, caller frees; NULL when there are none). -1 on
 * out of memory. */
int sbx__attempt_fields(const sbx__attempt_out_t *o, sbx_fetch_header_t *out, size_t max,
                        char **mem);

/* The address an attempt is pinned to (1.8), and the two checks libcurl's
 * callbacks make with it. Pure functions, so spec/c/fetch checks them with
 * mismatches a real attempt cannot produce. */
typedef struct sbx__pin {
  int family;                        /* AF_INET / AF_INET6 */
  unsigned char addr[16];            /* network order */
  int port;
} sbx__pin_t;

struct sockaddr;
/* CURLOPT_OPENSOCKETFUNCTION: 1 only for an IP-connection socket (purpose
 * is_ipcxn non-zero) of the pinned family, address and port (no IPv6 scope
 * id); anything else, AF_UNIX included, is 0. */
int sbx__pin_socket_ok(const sbx__pin_t *pin, int is_ipcxn, int family, const struct sockaddr *sa,
                       size_t len);
/* CURLOPT_PREREQFUNCTION: 1 when curl's primary IP text and port are the pin. */
int sbx__pin_peer_ok(const sbx__pin_t *pin, const char *primary_ip, int primary_port);

/* A strict "Name: value" line (token name, no control byte but tab). */
int sbx__header_line_ok(const char *s, size_t n);

/* Builds a result in one allocation (struct, header array, strings); the
 * body is adopted (may be NULL). Headers are copied as given. NULL on out
 * of memory (the body is then freed). */
sbx_fetch_result_t *sbx__result_new(const char *url, size_t url_len, int status,
                                    const char *text, size_t text_len,
                                    const sbx_fetch_header_t *h, size_t nh,
                                    char *body, size_t body_len);

/* 1.10: 1 when a connection failure with this errno (before any response
 * byte) lets the call try the next vetted address (fetch_attempt.c; the hop
 * loop applies the same rule to a transport seam's answer). */
int sbx__errno_is_fallback(int err);

#endif
