/*
 * http_head.h: the broker's decision on one request head (spec/broker.md
 * sections 3, 5 steps 0-8, 6 and 7.1), as a pure function: no libuv, no Lua,
 * no allocation. The listener calls it once a head is complete; the fuzzer
 * (fuzz/request_fuzz.c) calls it with arbitrary bytes. Also the HTTP token
 * grammar and reason phrases every HTTP speaker in the core shares.
 */
#ifndef SBX_HTTP_HEAD_H
#define SBX_HTTP_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "bounds.h"

/* One configured request-target, compared byte for byte. */
typedef struct sbx__route {
  const char *s;
  size_t len;
} sbx__route_t;

/* What the decision needs besides the bytes. */
typedef struct sbx__head_ctx {
  const sbx__route_t *routes;
  size_t nroutes;
  int turn_ended;     /* step 7: the turn signal has aborted */
  int busy;           /* step 8: a call is in flight or no budget remains */
  int no_budget;      /* step 8's audit reason: set when the budget is spent
                         (then "budget"), else a busy refusal is "busy" */
} sbx__head_ctx_t;

typedef struct sbx__head_result {
  int status;         /* 0: accepted (step 9 may run); else 400/403/404/410/429 */
  int step;           /* the step that decided: 0..8, or 9 when accepted */
  const char *body;   /* the fixed refusal body (NUL-terminated), NULL if accepted */
  const char *reason; /* the audit reason of a refusal (spec/operations.md 3):
                         "header", "method", "query", "credential_header",
                         "unknown_route", "after_turn", "budget", "busy";
                         NULL if accepted. A static string. */
  const char *header; /* step 3 and 5: the refused header's name as sent
                         (points into the head), or NULL; header_len bytes */
  size_t header_len;
  int routed;         /* the target matched a route: accepted, or refused at
                         step 7 or 8 (route is then its index) */
  size_t route;       /* accepted: index into ctx->routes */
  int has_length;     /* accepted: a Content-Length header was present */
  uint64_t length;    /* accepted: its value, saturated at UINT64_MAX */
} sbx__head_result_t;

/* One header line of a framed head: the name as sent, the value trimmed of
 * SP/HT on both sides. Both point into the head. */
typedef struct sbx__head_field {
  const char *name;
  size_t nlen;
  const char *value;
  size_t vlen;
} sbx__head_field_t;

/*
 * A request head framed but not judged (sbx__head_frame): what both the
 * sealed decision (sbx__head_decide) and the stream listener
 * (listener_stream.c, spec/rich-mode.md 8) read. Pointers go into the head.
 */
typedef struct sbx__head_req {
  const char *method;
  size_t mlen;
  const char *target;
  size_t tlen;
  int minor;                 /* HTTP/1.<minor>: 0 or 1 */
  int bad_url;               /* the target holds HT, FF or a byte >= 0x80 */
  size_t nfields;            /* header lines stored in fields[] */
  size_t total;              /* header lines in the head (> nfields: overflow) */
  sbx__head_field_t fields[SBX_MAX_HEAD_FIELDS];
  int repeated;              /* a stored name appears twice (ASCII case-insensitive) */
  int has_length;            /* a Content-Length header (plain digits) */
  uint64_t length;           /* its value, saturated at UINT64_MAX */
  int te;                    /* a Transfer-Encoding header is present */
} sbx__head_req_t;

/*
 * Frames head[0..len), exactly one complete head (as delimited by
 * sbx__head_end) of at most SBX_MAX_HEAD_BYTES: the request line checked by
 * hand, the header lines by http_parser plus the rules it lets through (see
 * http_head.c). Returns 0 and fills *out, or -1 when the head is malformed
 * (400 `bad request` in both listeners). Content-Length together with
 * Transfer-Encoding, a repeated or non-digit Content-Length are malformed.
 */
int sbx__head_frame(const char *head, size_t len, sbx__head_req_t *out);

/* ASCII case-insensitive equality of s[0..n) with the lower-case word w. */
int sbx__head_name_is(const char *s, size_t n, const char *w);

/*
 * Where the head ends: the offset just past the first empty line (the line
 * terminator is LF, optionally preceded by CR), or 0 when buf[0..len) holds
 * no complete head yet. Only LFs at offsets >= from are examined, so a
 * caller that appends bytes can resume the scan at its previous length.
 */
size_t sbx__head_end(const char *buf, size_t len, size_t from);

/*
 * What one head says, once its framing is valid (sbx__head_scan): the facts
 * both pipelines' orders of checks are decided from (the sealed broker's in
 * sbx__head_decide, the precheck broker's in precheck_head.c). Pointers point
 * into the head; values are trimmed of SP/HT.
 */
typedef struct sbx__head_facts {
  const char *target;   /* request-target bytes */
  size_t target_len;
  int bad_url;          /* a target byte >= 0x80, HT or FF (step 1) */
  int is_post;          /* method exactly POST */
  int header_refused;   /* a name outside the permitted list, or one twice */
  const char *refused_name; /* the first such name (for the audit line) */
  size_t refused_len;
  int line_ok;          /* scan: the request line passed (a framing error
                           after it is in the header lines) */
  int auth_present;     /* an Authorization header was seen */
  int auth_bad;         /* some Authorization value is not exactly the dummy */
  const char *host;     /* first Host value, or NULL */
  size_t host_len;
  int has_length;
  uint64_t length;      /* Content-Length, saturated at UINT64_MAX */
} sbx__head_facts_t;

/*
 * Step 0 for head[0..len), which must be exactly one complete head (as
 * delimited by sbx__head_end) of at most SBX_MAX_HEAD_BYTES: returns 0 and
 * fills *f when framing is valid, -1 otherwise (400 bad request).
 */
int sbx__head_scan(const char *head, size_t len, sbx__head_facts_t *f);

/* What both orders of checks write: a refusal at `step`, or an acceptance
 * (status 0) at `step` of `route` with the head's Content-Length. */
void sbx__head_refuse(sbx__head_result_t *out, int step, int status, const char *body);
/* The same with its audit reason (spec/operations.md 3; a static string). */
void sbx__head_refuse_why(sbx__head_result_t *out, int step, int status, const char *body,
                          const char *reason);
/* Step 0's audit reason for a head sbx__head_scan refused: "method" while
   the request line is at fault, "header" from the header lines on (the head
   as a whole included). */
const char *sbx__head_frame_reason(const sbx__head_facts_t *f, const char *head, size_t len);
void sbx__head_accept(sbx__head_result_t *out, int step, size_t route, const sbx__head_facts_t *f);

/* Host present and exactly `broker`. */
int sbx__head_host_ok(const sbx__head_facts_t *f);

/* The index of the route equal to target[0..len) byte for byte, or nroutes. */
size_t sbx__route_find(const sbx__route_t *routes, size_t nroutes, const char *target,
                       size_t len);

/*
 * Decides steps 0-8 for head[0..len), which must be exactly one complete head
 * (as delimited by sbx__head_end) of at most SBX_MAX_HEAD_BYTES; anything else
 * is a framing error (400). Always fills *out.
 */
void sbx__head_decide(const char *head, size_t len, const sbx__head_ctx_t *ctx,
                      sbx__head_result_t *out);

/* One response header line kept in a caller's store (offsets into it). */
typedef struct sbx__hfield {
  uint32_t name_off, name_len, val_off, val_len;
} sbx__hfield_t;

/*
 * The response header line p[0..n) as libcurl hands it over (CRLF or LF at
 * its end): its name, lower-cased, and its value, trimmed of SP/HT, are
 * appended to store[*used..cap) and recorded in *f. Returns 0; -1 for a
 * malformed line (obs-fold, no colon, an empty name); -2 when the store
 * would pass cap. The upstream clients (fetch_attempt.c, upstream_stream.c)
 * keep their response heads with it.
 */
int sbx__http_field(const char *p, size_t n, char *store, size_t *used, size_t cap,
                    sbx__hfield_t *f);

/* RFC 9110 tchar: the bytes of a token (a method or a header name). */
int sbx__http_is_tchar(unsigned char c);

/* The reason phrase of a status line the project's servers write (the
 * listener, http_server.c): the usual phrase, else "OK", "Client Error" or
 * "Server Error" by class. */
const char *sbx__http_reason(int status);

/* The fixed refusal bodies of spec/broker.md section 5. */
#define SBX_BODY_BAD_REQUEST   "bad request"
#define SBX_BODY_INVALID_URL   "invalid URL"
#define SBX_BODY_NOT_FOUND     "not found"
#define SBX_BODY_FORBIDDEN_HDR "forbidden header"
#define SBX_BODY_FORBIDDEN_CRED "forbidden credential"
#define SBX_BODY_FORBIDDEN_HOST "forbidden host"
#define SBX_BODY_TURN_ENDED    "turn ended"
#define SBX_BODY_NOT_READY     "broker not ready"
#define SBX_BODY_BUSY          "call budget exhausted or busy"
#define SBX_BODY_CALL_FAILED   "broker call failed"
#define SBX_BODY_INVALID_INPUT "invalid input"

/* The only credential and Host value a guest may present (section 1). */
#define SBX_DUMMY_AUTHORIZATION "Bearer sandbox-dummy-key"
#define SBX_BROKER_HOST         "broker"

#endif
