/*
 * http_head.c: steps 0-8 of the broker pipeline (spec/broker.md section 5)
 * for one complete request head, as a pure function of the bytes, the route
 * table and two bits of turn state. It owns nothing and allocates nothing;
 * the listener (listener.c) owns sockets, budget and Lua. The framing scan
 * (sbx__head_scan: step 0 and the facts later steps read) is shared with the
 * precheck broker's own order of checks (precheck_head.c).
 *
 * Framing is shared between our own checks and http_parser 2.9.4 (Debian's
 * libhttp-parser, built non-strict):
 *
 *  - The request line is checked here, byte by byte: `method SP target SP
 *    version CRLF`, with exactly one SP on each side of the target, the method
 *    a token and the version exactly `HTTP/1.0` or `HTTP/1.1`. http_parser is
 *    then fed the head with the request line replaced by `POST / <version>`,
 *    because its URL grammar would refuse targets the spec wants routed to a
 *    404 (`\model`), would turn bytes >= 0x80 into a framing error in some
 *    positions but not others, and because it refuses method names it does
 *    not know where the spec wants `not POST` (404). Target bytes: controls
 *    other than HT and FF, and DEL, are malformed (400 `bad request`); HT, FF
 *    (which http_parser's non-strict URL table lets through) and bytes >= 0x80
 *    are step 1 (400 `invalid URL`), decided only once framing is valid.
 *  - Header lines are framed by http_parser (tokens, value characters,
 *    Content-Length digits and overflow, repeated Content-Length, Content-Length
 *    with Transfer-Encoding). We add what it lets through but the spec
 *    forbids: bare CR or LF line endings, obsolete line folding (a line that
 *    starts with SP or HT), whitespace or other non-token bytes in a header
 *    name (it accepts `Host : x`), and a Content-Length that is not plain
 *    digits after trimming. Header values are trimmed of SP/HT on both sides
 *    (http_parser trims only the left).
 *
 * Header names are matched case-insensitively against the permitted list of
 * section 7.1; a name outside it (the forbidden list is a subset) or a
 * permitted name seen twice is step 3.
 */
#include <string.h>

#include <http_parser.h>

#include "http_head.h"
#include "bounds.h"

/* Permitted header names (section 7.1), lower case. Index = bit in seen. */
static const char *const permitted[] = {
  "host", "content-type", "content-length", "accept", "accept-encoding",
  "authorization", "user-agent"};
enum { H_HOST, H_CONTENT_TYPE, H_CONTENT_LENGTH, H_ACCEPT, H_ACCEPT_ENCODING,
       H_AUTHORIZATION, H_USER_AGENT, H_NPERMITTED };

typedef struct {
  const char *in_base;      /* where the original bytes at orig_base were copied */
  const char *orig_base;
  const char *name;         /* header being collected (points into the original) */
  size_t nlen;
  const char *val;
  size_t vlen;
  int have_name;
  int in_value;
  int bad;                  /* step 0: framing error */
  int refused;              /* step 3: forbidden, unknown or repeated name */
  const char *refused_name; /* the first such name (in the original bytes) */
  size_t refused_len;
  unsigned seen;            /* bit per permitted name seen */
  int te;                   /* a Transfer-Encoding header was present */
  int has_cl;
  uint64_t cl;
  const char *auth;         /* first Authorization value */
  int auth_bad;             /* some Authorization value is not the dummy */
  const char *host;
  size_t host_len;
  int complete;             /* on_headers_complete ran */
} scan_t;

int sbx__http_is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
    return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

const char *sbx__http_reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 410: return "Gone";
  case 413: return "Payload Too Large";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  default: return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

static int is_token(const char *s, size_t n) {
  size_t i;
  if (n == 0) return 0;
  for (i = 0; i < n; i++)
    if (!sbx__http_is_tchar((unsigned char)s[i])) return 0;
  return 1;
}

/* ASCII case-insensitive equality of s[0..n) with the lower-case word w. */
static int name_is(const char *s, size_t n, const char *w) {
  size_t i;
  if (strlen(w) != n) return 0;
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 'A' && c <= 'Z') c = (unsigned char)(c - 'A' + 'a');
    if (c != (unsigned char)w[i]) return 0;
  }
  return 1;
}

static int eq(const char *s, size_t n, const char *w) {
  return strlen(w) == n && memcmp(s, w, n) == 0;
}

/* Step 3 for the header being collected; the first refused name is kept
   for the audit line. */
static void refuse_name(scan_t *sc) {
  if (!sc->refused) {
    sc->refused_name = sc->name;
    sc->refused_len = sc->nlen;
  }
  sc->refused = 1;
}

static void finish_header(scan_t *sc) {
  const char *v = sc->val ? sc->val : "";
  size_t vn = sc->val ? sc->vlen : 0;
  int idx = -1, i;

  sc->have_name = 0;
  sc->in_value = 0;
  while (vn > 0 && (v[0] == ' ' || v[0] == '\t')) { v++; vn--; }
  while (vn > 0 && (v[vn - 1] == ' ' || v[vn - 1] == '\t')) vn--;
  if (!is_token(sc->name, sc->nlen)) { sc->bad = 1; return; }

  for (i = 0; i < H_NPERMITTED; i++)
    if (name_is(sc->name, sc->nlen, permitted[i])) { idx = i; break; }
  if (name_is(sc->name, sc->nlen, "transfer-encoding")) sc->te = 1;
  if (idx < 0) { refuse_name(sc); return; }

  if (idx == H_CONTENT_LENGTH) {
    size_t k;
    uint64_t n = 0;
    if (sc->has_cl || vn == 0) { sc->bad = 1; return; }   /* repeated or empty */
    for (k = 0; k < vn; k++) {
      unsigned d = (unsigned char)v[k] - '0';
      if (d > 9) { sc->bad = 1; return; }
      n = n > (UINT64_MAX - d) / 10 ? UINT64_MAX : n * 10 + d;
    }
    sc->has_cl = 1;
    sc->cl = n;
  }
  if (idx == H_AUTHORIZATION) {
    if (!eq(v, vn, SBX_DUMMY_AUTHORIZATION)) sc->auth_bad = 1;
    if (sc->auth == NULL) sc->auth = v;
  }
  if (sc->seen & (1u << idx)) { refuse_name(sc); return; }
  sc->seen |= 1u << idx;
  if (idx == H_HOST) { sc->host = v; sc->host_len = vn; }
}

/* The parser runs over a copy; names and values are read in the original. */
static const char *orig(const scan_t *sc, const char *at) {
  return sc->orig_base + (at - sc->in_base);
}

static int on_field(http_parser *p, const char *at, size_t n) {
  scan_t *sc = p->data;
  at = orig(sc, at);
  if (sc->in_value) finish_header(sc);
  if (sc->have_name) {
    /* One execute over one buffer: a name arrives in one piece. */
    if (at != sc->name + sc->nlen) sc->bad = 1;
    sc->nlen += n;
    return 0;
  }
  sc->have_name = 1;
  sc->name = at;
  sc->nlen = n;
  sc->val = NULL;
  sc->vlen = 0;
  return 0;
}

static int on_value(http_parser *p, const char *at, size_t n) {
  scan_t *sc = p->data;
  at = orig(sc, at);
  if (!sc->have_name) { sc->bad = 1; return 0; }
  sc->in_value = 1;
  if (sc->val == NULL) { sc->val = at; sc->vlen = n; return 0; }
  if (at != sc->val + sc->vlen) sc->bad = 1;   /* folded continuation */
  sc->vlen += n;
  return 0;
}

static int on_headers_complete(http_parser *p) {
  scan_t *sc = p->data;
  if (sc->have_name) finish_header(sc);
  sc->complete = 1;
  return 0;
}

size_t sbx__head_end(const char *buf, size_t len, size_t from) {
  const char *p = buf + from, *end = buf + len;
  if (from >= len) return 0;
  while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
    size_t i = (size_t)(p - buf);
    if (i == 0 || buf[i - 1] == '\n') return i + 1;                 /* LF LF */
    if (buf[i - 1] == '\r' && (i == 1 || buf[i - 2] == '\n')) return i + 1;
    p++;
  }
  return 0;
}

void sbx__head_refuse(sbx__head_result_t *out, int step, int status, const char *body) {
  out->status = status;
  out->step = step;
  out->body = body;
}

void sbx__head_accept(sbx__head_result_t *out, int step, size_t route, const sbx__head_facts_t *f) {
  out->status = 0;
  out->step = step;
  out->body = NULL;
  out->reason = NULL;
  out->route = route;
  out->routed = 1;
  out->has_length = f->has_length;
  out->length = f->length;
}

int sbx__head_host_ok(const sbx__head_facts_t *f) {
  return f->host != NULL && eq(f->host, f->host_len, SBX_BROKER_HOST);
}


/* Line endings are CRLF only, and no line after the first starts with SP/HT. */
static int lines_ok(const char *h, size_t len) {
  size_t i;
  for (i = 0; i < len; i++) {
    if (h[i] == '\r' && (i + 1 == len || h[i + 1] != '\n')) return 0;
    if (h[i] == '\n') {
      if (i == 0 || h[i - 1] != '\r') return 0;
      if (i + 1 < len && (h[i + 1] == ' ' || h[i + 1] == '\t')) return 0;
    }
  }
  return 1;
}

/*
 * In the parser's copy, zeroes the digits of a Content-Length made of more
 * digits than a uint64 holds: http_parser refuses those as invalid, where the
 * spec wants any plain decimal over SBX_MAX_BODY_BYTES refused at step 10
 * (502). Our own scan reads the original digits and saturates.
 */
static void defuse_long_lengths(char *in, size_t len) {
  char *line = memchr(in, '\n', len), *end = in + len;
  while (line != NULL && ++line < end) {
    char *eol = memchr(line, '\n', (size_t)(end - line)), *colon, *v, *d;
    if (eol == NULL) break;
    colon = memchr(line, ':', (size_t)(eol - line));
    if (colon != NULL && name_is(line, (size_t)(colon - line), "content-length")) {
      for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++) {}
      for (d = v; d < eol && *d >= '0' && *d <= '9'; d++) {}
      if (d - v >= 19) memset(v, '0', (size_t)(d - v));
    }
    line = eol;
  }
}

int sbx__head_scan(const char *head, size_t len, sbx__head_facts_t *f) {
  static const char prefix[] = "POST / ";
  char in[SBX_MAX_HEAD_BYTES + 16];
  http_parser parser;
  http_parser_settings settings;
  scan_t sc;
  const char *eol, *sp1, *sp2, *target, *ver;
  size_t line_len, tlen, vlen, inlen, nparsed, i;
  int bad_url = 0;

  memset(f, 0, sizeof *f);
  if (head == NULL || len == 0 || len > SBX_MAX_HEAD_BYTES) return -1;
  if (sbx__head_end(head, len, 0) != len) return -1;

  /* Request line: method SP target SP version CRLF (its own line ending
     first, so a framing error is known to be the request line's or the
     header lines': the audit line says which). */
  eol = memchr(head, '\n', len);
  if (eol == NULL || eol == head || eol[-1] != '\r' ||
      memchr(head, '\r', (size_t)(eol - head) - 1) != NULL) return -1;
  line_len = (size_t)(eol - head) - 1;          /* without CRLF; lines_ok: CR */
  sp1 = memchr(head, ' ', line_len);
  if (sp1 == NULL || !is_token(head, (size_t)(sp1 - head))) return -1;
  target = sp1 + 1;
  sp2 = memchr(target, ' ', line_len - (size_t)(target - head));
  if (sp2 == NULL || sp2 == target) return -1;
  tlen = (size_t)(sp2 - target);
  ver = sp2 + 1;
  vlen = line_len - (size_t)(ver - head);
  if (!eq(ver, vlen, "HTTP/1.1") && !eq(ver, vlen, "HTTP/1.0")) return -1;
  for (i = 0; i < tlen; i++) {
    unsigned char c = (unsigned char)target[i];
    if (c >= 0x80 || c == '\t' || c == '\f') bad_url = 1;
    else if (c < 0x21 || c == 0x7f) return -1;
  }
  f->line_ok = 1;
  if (!lines_ok(head, len)) return -1;

  /* Headers: http_parser over `POST / <version>` + the rest of the head. */
  inlen = sizeof prefix - 1 + (len - (size_t)(ver - head));
  if (inlen > sizeof in) return -1;
  memcpy(in, prefix, sizeof prefix - 1);
  memcpy(in + sizeof prefix - 1, ver, len - (size_t)(ver - head));

  defuse_long_lengths(in, inlen);

  memset(&sc, 0, sizeof sc);
  sc.in_base = in + sizeof prefix - 1;
  sc.orig_base = ver;
  memset(&settings, 0, sizeof settings);
  settings.on_header_field = on_field;
  settings.on_header_value = on_value;
  settings.on_headers_complete = on_headers_complete;
  http_parser_init(&parser, HTTP_REQUEST);
  parser.data = &sc;
  nparsed = http_parser_execute(&parser, &settings, in, inlen);
  if (HTTP_PARSER_ERRNO(&parser) != HPE_OK || !sc.complete || sc.bad) return -1;
  if (nparsed != inlen && !parser.upgrade) return -1;
  if (sc.te && sc.has_cl) return -1;

  f->target = target;
  f->target_len = tlen;
  f->bad_url = bad_url;
  f->is_post = eq(head, (size_t)(sp1 - head), "POST");
  f->header_refused = sc.refused;
  f->refused_name = sc.refused_name;
  f->refused_len = sc.refused_len;
  f->auth_present = sc.auth != NULL;
  f->auth_bad = sc.auth_bad;
  f->host = sc.host;
  f->host_len = sc.host_len;
  f->has_length = sc.has_cl;
  f->length = sc.cl;
  return 0;
}

size_t sbx__route_find(const sbx__route_t *routes, size_t nroutes, const char *target,
                       size_t len) {
  size_t i;
  for (i = 0; routes != NULL && i < nroutes; i++)
    if (routes[i].len == len && memcmp(routes[i].s, target, len) == 0) return i;
  return nroutes;
}

void sbx__head_refuse_why(sbx__head_result_t *out, int step, int status, const char *body,
                          const char *reason) {
  sbx__head_refuse(out, step, status, body);
  out->reason = reason;
}

const char *sbx__head_frame_reason(const sbx__head_facts_t *f, const char *head, size_t len) {
  return f->line_ok || head == NULL || len > SBX_MAX_HEAD_BYTES ? "header" : "method";
}

void sbx__head_decide(const char *head, size_t len, const sbx__head_ctx_t *ctx,
                      sbx__head_result_t *out) {
  sbx__head_facts_t f;
  size_t i;

  memset(out, 0, sizeof *out);
  if (sbx__head_scan(head, len, &f) != 0) {
    /* step 0's audit reason: "method" while the request line is at fault,
       "header" from the header lines on (the head as a whole included) */
    sbx__head_refuse_why(out, 0, 400, SBX_BODY_BAD_REQUEST, sbx__head_frame_reason(&f, head, len));
    return;
  }
  if (f.bad_url) { sbx__head_refuse_why(out, 1, 400, SBX_BODY_INVALID_URL, "unknown_route"); return; }
  if (!f.is_post) { sbx__head_refuse_why(out, 2, 404, SBX_BODY_NOT_FOUND, "method"); return; }
  if (memchr(f.target, '?', f.target_len) != NULL || memchr(f.target, '#', f.target_len) != NULL) {
    sbx__head_refuse_why(out, 2, 404, SBX_BODY_NOT_FOUND, "query");
    return;
  }
  if (f.header_refused) {
    sbx__head_refuse_why(out, 3, 403, SBX_BODY_FORBIDDEN_HDR, "header");
    out->header = f.refused_name;
    out->header_len = f.refused_len;
    return;
  }
  if (f.auth_bad) { sbx__head_refuse_why(out, 4, 403, SBX_BODY_FORBIDDEN_CRED, "credential_header"); return; }
  if (!sbx__head_host_ok(&f)) {
    sbx__head_refuse_why(out, 5, 403, SBX_BODY_FORBIDDEN_HOST, "header");
    out->header = "host";
    out->header_len = 4;
    return;
  }
  i = ctx != NULL ? sbx__route_find(ctx->routes, ctx->nroutes, f.target, f.target_len) : 0;
  if (ctx == NULL || i == ctx->nroutes) {
    sbx__head_refuse_why(out, 6, 404, SBX_BODY_NOT_FOUND, "unknown_route");
    return;
  }
  out->route = i;            /* steps 7 and 8 refuse a known route */
  out->routed = 1;
  if (ctx->turn_ended) { sbx__head_refuse_why(out, 7, 410, SBX_BODY_TURN_ENDED, "after_turn"); return; }
  if (ctx->busy) { sbx__head_refuse_why(out, 8, 429, SBX_BODY_BUSY, ctx->no_budget ? "budget" : "busy"); return; }

  sbx__head_accept(out, 9, i, &f);
}
