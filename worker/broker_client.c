/*
 * broker_client.c: sbxw.broker_request(route, body), the worker's only way
 * out (spec/worker.md section 4): one blocking HTTP/1.1 POST per connection
 * to the broker's Unix socket.
 *
 * Request: `POST <route> HTTP/1.1` and exactly four headers in this order:
 * host, content-type, content-length, authorization (the dummy bearer);
 * nothing else, never chunked, no half-close (the broker reads a peer
 * half-close as a hang-up).
 *
 * Response: a status line and headers of at most SBXW_MAX_HEAD_BYTES (CRLF
 * line ends), then a body framed by content-length, chunked transfer coding
 * or the end of the connection, of at most SBXW_MAX_BODY_BYTES; either
 * excess aborts with "broker response too large". Anything else that goes
 * wrong (connect, reset, malformed response, the one deadline that covers
 * connect, send and the whole response) is "transport". Every status comes
 * back with its body; the caller decides what non-200 means.
 *
 * The socket is non-blocking and every wait is a poll bounded by what is
 * left of the deadline. The descriptor lives in an fd box and the body in a
 * userdata buffer (sbxw.c), so a Lua error leaks neither.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "sbxw.h"
#include "waux.h"

#define ERR_TRANSPORT -1
#define ERR_TOOLARGE  -2
#define READ_BUF      16384
#define MAX_CHUNK_LINE 4096
#define CONNECT_RETRY_MS 10

#ifdef SBXW_MODULE
static char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)] = SBXW_BROKER_SOCKET;
static long long deadline_ms = SBXW_BROKER_DEADLINE_MS;
#else
static const char socket_path[] = SBXW_BROKER_SOCKET;
static const long long deadline_ms = SBXW_BROKER_DEADLINE_MS;
#endif

typedef struct {
  int fd;
  long long deadline;          /* CLOCK_MONOTONIC ms */
  char buf[READ_BUF];
  size_t pos, len;
  int eof;
} rd_t;

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on fd until the deadline; 0 when ready, -1 otherwise. */
static int wait_fd(int fd, short events, long long deadline) {
  for (;;) {
    long long left = deadline - mono_ms();
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    if (left <= 0) return -1;
    int n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n > 0) return 0;                       /* ready, or an error to read */
  }
}

static int do_connect(int fd, long long deadline) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, socket_path, strlen(socket_path));
  for (;;) {
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {                     /* backlog full: retry */
      struct timespec ts = {0, CONNECT_RETRY_MS * 1000000L};
      if (mono_ms() + CONNECT_RETRY_MS >= deadline) return -1;
      nanosleep(&ts, NULL);
      continue;
    }
    if (errno != EINPROGRESS) return -1;
    int err = 0;
    socklen_t elen = sizeof err;
    if (wait_fd(fd, POLLOUT, deadline) != 0) return -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) return -1;
    return 0;
  }
}

/* Sends head then body; 0 when all bytes left, -1 otherwise. */
static int send_all(int fd, const char *head, size_t hlen, const char *body, size_t blen,
                    long long deadline) {
  const char *parts[2] = {head, body};
  size_t lens[2] = {hlen, blen};
  for (int i = 0; i < 2; i++) {
    const char *p = parts[i];
    size_t left = lens[i];
    while (left > 0) {
      ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
      if (n > 0) {
        p += n;
        left -= (size_t)n;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (wait_fd(fd, POLLOUT, deadline) != 0) return -1;
        continue;
      }
      return -1;
    }
  }
  return 0;
}

/* Refills the read buffer; 1 with data, 0 at EOF, ERR_TRANSPORT. */
static int rd_fill(rd_t *r) {
  if (r->pos < r->len) return 1;
  if (r->eof) return 0;
  for (;;) {
    ssize_t n = recv(r->fd, r->buf, sizeof r->buf, 0);
    if (n > 0) {
      r->pos = 0;
      r->len = (size_t)n;
      return 1;
    }
    if (n == 0) {
      r->eof = 1;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ERR_TRANSPORT;
    if (wait_fd(r->fd, POLLIN, r->deadline) != 0) return ERR_TRANSPORT;
  }
}

/* Reads one CRLF-terminated line into out (without the CRLF), counting its
 * bytes against *budget; `toolarge` past it, ERR_TRANSPORT on EOF or a bare
 * CR/LF. Returns the line length. out must hold *budget + 1 bytes. */
static long rd_line(rd_t *r, char *out, size_t *budget, int toolarge) {
  size_t n = 0;
  for (;;) {
    int rc = rd_fill(r);
    if (rc <= 0) return ERR_TRANSPORT;
    char c = r->buf[r->pos++];
    if (*budget == 0) return toolarge;
    (*budget)--;
    if (c == '\r') {
      if ((rc = rd_fill(r)) <= 0) return ERR_TRANSPORT;
      if (*budget == 0) return toolarge;
      (*budget)--;
      if (r->buf[r->pos++] != '\n') return ERR_TRANSPORT;
      out[n] = '\0';
      return (long)n;
    }
    if (c == '\n') return ERR_TRANSPORT;
    out[n++] = c;
  }
}

/* Appends exactly n bytes from the connection to b; ERR_TRANSPORT at EOF. */
static int rd_exact(rd_t *r, sbxw__buf_t *b, size_t n) {
  char *dst = sbxw__buf_reserve(b, n);
  while (n > 0) {
    int rc = rd_fill(r);
    if (rc <= 0) return ERR_TRANSPORT;
    size_t take = r->len - r->pos < n ? r->len - r->pos : n;
    memcpy(dst, r->buf + r->pos, take);
    r->pos += take;
    dst += take;
    b->len += take;
    n -= take;
  }
  return 0;
}

static int ieq(const char *a, const char *b) {
  for (; *a && *b; a++, b++) {
    char x = *a, y = *b;
    if (x >= 'A' && x <= 'Z') x += 32;
    if (y >= 'A' && y <= 'Z') y += 32;
    if (x != y) return 0;
  }
  return *a == *b;
}

static int tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

typedef struct {
  int status;
  int chunked;
  long long length;            /* -1: read until close */
} head_t;

/* "HTTP/1.x DDD[ reason]" */
static int parse_status(const char *l, head_t *h) {
  if (strncmp(l, "HTTP/1.", 7) != 0 || l[7] < '0' || l[7] > '9' || l[8] != ' ') return -1;
  for (int i = 9; i < 12; i++)
    if (l[i] < '0' || l[i] > '9') return -1;
  if (l[12] != '\0' && l[12] != ' ') return -1;
  h->status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
  return h->status >= 200 ? 0 : -1;            /* no interim responses */
}

/* One header line into h; ERR_TRANSPORT or ERR_TOOLARGE on refusal. */
static int parse_header(char *l, head_t *h) {
  char *colon = strchr(l, ':'), *v, *end;
  if (colon == NULL || colon == l) return ERR_TRANSPORT;
  for (char *p = l; p < colon; p++)
    if (!tchar((unsigned char)*p)) return ERR_TRANSPORT;
  *colon = '\0';
  v = colon + 1;
  while (*v == ' ' || *v == '\t') v++;
  end = v + strlen(v);
  while (end > v && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
  if (ieq(l, "transfer-encoding")) {
    if (!ieq(v, "chunked")) return ERR_TRANSPORT;
    h->chunked = 1;
  } else if (ieq(l, "content-length")) {
    long long n = 0;
    if (*v == '\0') return ERR_TRANSPORT;
    for (char *p = v; *p; p++) {
      if (*p < '0' || *p > '9') return ERR_TRANSPORT;
      if (n <= SBXW_MAX_BODY_BYTES) n = n * 10 + (*p - '0');
    }
    if (h->length >= 0 && h->length != n) return ERR_TRANSPORT;
    h->length = n;
  }
  return 0;
}

static int read_head(rd_t *r, head_t *h) {
  char line[SBXW_MAX_HEAD_BYTES + 1];
  size_t budget = SBXW_MAX_HEAD_BYTES;
  long n = rd_line(r, line, &budget, ERR_TOOLARGE);
  if (n < 0) return (int)n;
  h->chunked = 0;
  h->length = -1;
  if (parse_status(line, h) != 0) return ERR_TRANSPORT;
  for (;;) {
    int rc;
    if ((n = rd_line(r, line, &budget, ERR_TOOLARGE)) < 0) return (int)n;
    if (n == 0) break;
    if ((size_t)n != strlen(line)) return ERR_TRANSPORT;   /* NUL byte */
    if ((rc = parse_header(line, h)) != 0) return rc;
  }
  if (h->chunked) h->length = -1;
  if (h->length > SBXW_MAX_BODY_BYTES) return ERR_TOOLARGE;
  return 0;
}

static int read_chunked(rd_t *r, sbxw__buf_t *b) {
  char line[MAX_CHUNK_LINE + 3];                       /* budget + 1 */
  for (;;) {
    size_t budget = MAX_CHUNK_LINE + 2, size = 0;
    long n = rd_line(r, line, &budget, ERR_TRANSPORT);
    int digits = 0, rc;
    if (n < 0) return (int)n;
    for (char *p = line; *p && *p != ';' && *p != ' ' && *p != '\t'; p++, digits++) {
      int d = (*p >= '0' && *p <= '9') ? *p - '0'
            : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
            : (*p >= 'A' && *p <= 'F') ? *p - 'A' + 10 : -1;
      if (d < 0) return ERR_TRANSPORT;
      if (size > SBXW_MAX_BODY_BYTES) return ERR_TOOLARGE;
      size = size * 16 + (size_t)d;
    }
    if (digits == 0) return ERR_TRANSPORT;
    if (size == 0) break;
    if (size > SBXW_MAX_BODY_BYTES - b->len) return ERR_TOOLARGE;
    if ((rc = rd_exact(r, b, size)) != 0) return rc;
    budget = 2;
    if (rd_line(r, line, &budget, ERR_TRANSPORT) != 0) return ERR_TRANSPORT;
  }
  /* Trailer section up to the empty line, bounded like a head. */
  size_t budget = SBXW_MAX_HEAD_BYTES;
  for (;;) {
    char tline[SBXW_MAX_HEAD_BYTES + 1];
    long n = rd_line(r, tline, &budget, ERR_TOOLARGE);
    if (n < 0) return (int)n;
    if (n == 0) return 0;
  }
}

static int read_to_close(rd_t *r, sbxw__buf_t *b) {
  for (;;) {
    int rc = rd_fill(r);
    if (rc < 0) return rc;
    if (rc == 0) return 0;
    size_t take = r->len - r->pos;
    if (take > SBXW_MAX_BODY_BYTES - b->len) return ERR_TOOLARGE;
    memcpy(sbxw__buf_reserve(b, take), r->buf + r->pos, take);
    b->len += take;
    r->pos = r->len;
  }
}

/* The whole exchange; returns the status or an ERR_* code. */
static int exchange(lua_State *L, int fd, const char *route, const char *body, size_t blen,
                    sbxw__buf_t *b) {
  char head[SBXW_MAX_ROUTE_BYTES + 256];
  long long deadline = mono_ms() + deadline_ms;
  head_t h;
  int hlen, rc, sent;
  rd_t *r = lua_newuserdatauv(L, sizeof *r, 0);         /* 16 KiB: not on the stack */
  hlen = snprintf(head, sizeof head,
                  "POST %s HTTP/1.1\r\nhost: broker\r\ncontent-type: application/json\r\n"
                  "content-length: %zu\r\nauthorization: " SBXW_DUMMY_AUTH "\r\n\r\n",
                  route, blen);
  if (hlen < 0 || (size_t)hlen >= sizeof head) return ERR_TRANSPORT;
  if (do_connect(fd, deadline) != 0) return ERR_TRANSPORT;
  /* A broker that refuses early may close while we send: read its answer. */
  sent = send_all(fd, head, (size_t)hlen, body, blen, deadline) == 0;
  r->fd = fd;
  r->deadline = deadline;
  r->pos = r->len = 0;
  r->eof = 0;
  if ((rc = read_head(r, &h)) != 0) return sent ? rc : ERR_TRANSPORT;
  if (h.chunked) rc = read_chunked(r, b);
  else if (h.length >= 0) rc = rd_exact(r, b, (size_t)h.length);
  else rc = read_to_close(r, b);
  return rc != 0 ? rc : h.status;
}

static int route_ok(const char *s, size_t n) {
  if (n < 2 || n > SBXW_MAX_ROUTE_BYTES || s[0] != '/') return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7F) return 0;
  return 1;
}

/* sbxw.broker_request(route, body) -> status, body | nil, message */
static int l_broker_request(lua_State *L) {
  size_t rlen, blen;
  const char *route = luaL_checklstring(L, 1, &rlen);
  const char *body = luaL_checklstring(L, 2, &blen);
  sbxw__buf_t b;
  int *fd, rc;
  luaL_argcheck(L, route_ok(route, rlen), 1, "route must be /<printable ASCII>");
  lua_settop(L, 2);
  fd = sbxw__fd_box(L);                                   /* slot 3 */
  sbxw__buf_init(L, &b);                                  /* slot 4 */
  *fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  rc = *fd < 0 ? ERR_TRANSPORT : exchange(L, *fd, route, body, blen, &b);
  sbxw__fd_close(fd);
  if (rc < 0) {
    lua_pushnil(L);
    if (rc == ERR_TOOLARGE) lua_pushliteral(L, "broker response too large");
    else lua_pushliteral(L, "transport");
    return 2;
  }
  lua_pushinteger(L, rc);
  lua_pushlstring(L, b.p, b.len);
  return 2;
}

#ifdef SBXW_MODULE
/* sbxw.set_socket(path [, deadline_ms]): specs only (not in the binary). */
static int l_set_socket(lua_State *L) {
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  lua_Integer ms = luaL_optinteger(L, 2, SBXW_BROKER_DEADLINE_MS);
  luaL_argcheck(L, n > 0 && n < sizeof socket_path && strlen(p) == n, 1, "bad socket path");
  luaL_argcheck(L, ms > 0 && ms <= SBXW_BROKER_DEADLINE_MS, 2, "bad deadline");
  memcpy(socket_path, p, n + 1);
  deadline_ms = ms;
  return 0;
}
#endif

void sbxw__open_broker(lua_State *L) {
  lua_pushcfunction(L, l_broker_request);
  lua_setfield(L, -2, "broker_request");
#ifdef SBXW_MODULE
  lua_pushcfunction(L, l_set_socket);
  lua_setfield(L, -2, "set_socket");
#endif
}
