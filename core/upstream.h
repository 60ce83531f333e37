/*
 * upstream.h: the broker's upstream client as its two callers share it:
 * core.http_post (upstream.c: one bounded body, delivered whole) and
 * core.http_stream (upstream_stream.c: status, headers and body chunks as
 * they arrive, with backpressure). One curl multi per Lua state, the
 * broker's own (never safe fetch's), driven by curl_loop.c; the one curl
 * policy is sbx__curl_harden. Internal.
 *
 * A transfer of either kind embeds an sbx__up_xfer_t first; the easy
 * handle's CURLOPT_PRIVATE points at it, so the multi hands a finished
 * transfer to its own `done` (from a libuv callback, never inside curl),
 * and the state's close drops every transfer still linked through `drop`
 * (no Lua callback runs then).
 */
#ifndef SBX_UPSTREAM_H
#define SBX_UPSTREAM_H

#include <time.h>
#include <curl/curl.h>

#include "curl_loop.h"
#include "loop.h"

typedef struct sbx__up_multi sbx__up_multi_t;
typedef struct sbx__up_xfer sbx__up_xfer_t;

struct sbx__up_xfer {
  sbx__up_xfer_t *prev, *next;
  sbx__up_multi_t *m;
  void (*done)(sbx__up_xfer_t *x, CURLcode rc);
  void (*drop)(lua_State *L, sbx__up_xfer_t *x);
};

struct sbx__up_multi {
  sbx__curl_loop_t *cl;    /* the multi on the loop; NULL once torn down */
  sbx__loop_t *lp;
  sbx__up_xfer_t *xfers;   /* linked transfers */
};

/* The state's multi, created on first use; NULL when curl is unavailable
 * or out of memory. May raise (a Lua allocation) before owning anything. */
sbx__up_multi_t *sbx__up_multi(lua_State *L);

/* Links x to m (the multi's list; nothing is added to curl). */
void sbx__up_link(sbx__up_multi_t *m, sbx__up_xfer_t *x);
/* Unlinks x and removes easy from curl (when the multi is still up; an easy
 * handle already removed is fine). */
void sbx__up_unlink(sbx__up_xfer_t *x, CURL *easy);

/* opts (index 1) .headers and .connect_to: raise on anything malformed
 * ("<who>: ..."); run before anything is allocated. */
void sbx__up_check_lists(lua_State *L, const char *who);
/* Builds the header list (the caller's lines, then "Name:" removals for
 * what libcurl would add: Accept, the form Content-Type, Expect) and the
 * connect_to list from the checked opts. 0, or -1 when out of memory. */
int sbx__up_build_lists(lua_State *L, struct curl_slist **headers, struct curl_slist **connect_to);

/* "HTTP/x[.y] NNN ..." -> NNN, or -1. */
long sbx__up_parse_status(const char *p, size_t n);
/* Is the header line a Content-Encoding other than "identity"? *is_ce is
 * set when the name is Content-Encoding at all. */
int sbx__up_bad_encoding(const char *p, size_t n, int *is_ce);

/* The provider's request id of a response, for the operator's support
 * ticket (never the guest's): the header names below, best first; a value
 * is kept only when it is 1-SBX_UP_MAX_REQUEST_ID bytes of [A-Za-z0-9_.:-].
 * Given a header line, returns the name's rank (1 = best) and sets *vs and *vn
 * to the trimmed value, or returns 0 (not one of them, or a value refused). */
#define SBX_UP_MAX_REQUEST_ID 128
#define SBX_UP_REQUEST_ID_NAMES \
  "x-request-id", "request-id", "apim-request-id", "x-ms-request-id", \
  "mistral-correlation-id", "x-ds-trace-id", "cf-ray"
int sbx__up_request_id(const char *p, size_t n, size_t *vs, size_t *vn);

/* A Retry-After header line's wait in milliseconds: delta-seconds, or an
 * HTTP-date less now (0 when it is past); capped at SBX_UP_MAX_RETRY_AFTER_MS.
 * -1 when the line is not Retry-After or its value is neither. */
#define SBX_UP_MAX_RETRY_AFTER_MS 3600000L
long sbx__up_retry_after(const char *p, size_t n, time_t now);

#endif
