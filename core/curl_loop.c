/*
 * curl_loop.c: a libcurl multi handle on a libuv loop (see curl_loop.h).
 *
 * Also the transfer policy both multis' easy handles get (sbx__curl_harden).
 *
 * Ownership: the sbx__curl_loop_t is freed in its timer's close callback;
 * each watched socket's uv_poll_t in its own close callback. `depth` counts
 * the callbacks in progress; a close requested inside one is finished when
 * the outermost returns, so curl never sees its multi vanish under it.
 */
#include <pthread.h>
#include <stdlib.h>

#include <errno.h>

#include "curl_loop.h"

typedef struct cl_sock cl_sock_t;

struct sbx__curl_loop {
  CURLM *multi;            /* NULL once closed */
  uv_loop_t *loop;
  uv_timer_t timer;        /* curl's timeout; cl is freed in its close callback */
  sbx__curl_done_fn done;
  cl_sock_t *socks;        /* watched sockets */
  int depth;               /* callbacks in progress */
  int closing;             /* close requested */
};

struct cl_sock {
  uv_poll_t poll;          /* freed in its close callback */
  curl_socket_t fd;
  sbx__curl_loop_t *cl;
  cl_sock_t *prev, *next;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;
static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int sbx__curl_global(void) {
  pthread_once(&global_once, global_init);
  return global_rc == CURLE_OK ? 0 : -1;
}

#define SET(opt, val) (bad |= curl_easy_setopt(easy, opt, val) != CURLE_OK)

int sbx__curl_harden(CURL *easy, const char *protocols, const char *cainfo) {
  int bad = 0;
  SET(CURLOPT_PATH_AS_IS, 1L);
  SET(CURLOPT_DISALLOW_USERNAME_IN_URL, 1L);
  SET(CURLOPT_PROTOCOLS_STR, protocols);
  SET(CURLOPT_REDIR_PROTOCOLS_STR, protocols);
  SET(CURLOPT_FOLLOWLOCATION, 0L);
  SET(CURLOPT_MAXREDIRS, 0L);
  SET(CURLOPT_PROXY, "");
  SET(CURLOPT_NOPROXY, "*");
  SET(CURLOPT_NETRC, (long)CURL_NETRC_IGNORED);
  SET(CURLOPT_SSL_VERIFYPEER, 1L);
  SET(CURLOPT_SSL_VERIFYHOST, 2L);
  SET(CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
  SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  SET(CURLOPT_HTTP09_ALLOWED, 0L);
  SET(CURLOPT_HTTP_CONTENT_DECODING, 0L);
  SET(CURLOPT_FRESH_CONNECT, 1L);
  SET(CURLOPT_FORBID_REUSE, 1L);
  SET(CURLOPT_DNS_CACHE_TIMEOUT, 0L);
  SET(CURLOPT_NOSIGNAL, 1L);
  if (cainfo != NULL) SET(CURLOPT_CAINFO, cainfo);
  return bad ? -1 : 0;
}

#undef SET

static void sock_closed(uv_handle_t *h) { free(h->data); }

static void sock_close(sbx__curl_loop_t *cl, cl_sock_t *s) {
  if (s->prev != NULL) s->prev->next = s->next; else cl->socks = s->next;
  if (s->next != NULL) s->next->prev = s->prev;
  s->prev = s->next = NULL;
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, sock_closed);
}

static void loop_freed(uv_handle_t *h) { free(h->data); }

static void really_close(sbx__curl_loop_t *cl) {
  if (cl->multi != NULL) curl_multi_cleanup(cl->multi);
  cl->multi = NULL;
  while (cl->socks != NULL) sock_close(cl, cl->socks);
  uv_timer_stop(&cl->timer);
  uv_close((uv_handle_t *)&cl->timer, loop_freed);
}

static void check_done(sbx__curl_loop_t *cl) {
  CURLMsg *msg;
  int left = 0;
  while (!cl->closing && cl->multi != NULL &&
         (msg = curl_multi_info_read(cl->multi, &left)) != NULL) {
    char *priv = NULL;
    if (msg->msg != CURLMSG_DONE) continue;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
    if (priv != NULL) cl->done(priv, msg->easy_handle, msg->data.result);
  }
}

/* Runs curl for (fd, flags), then hands finished transfers on. */
static void drive(sbx__curl_loop_t *cl, curl_socket_t fd, int flags) {
  int running = 0;
  if (cl->multi == NULL || cl->closing) return;
  cl->depth++;
  curl_multi_socket_action(cl->multi, fd, flags, &running);
  check_done(cl);
  cl->depth--;
  if (cl->depth == 0 && cl->closing) really_close(cl);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  cl_sock_t *s = h->data;
  int flags = 0;
  /* On a poll error (POLLERR: a reset, a refused connect) curl is told the
   * socket is readable and writable, so it does the I/O itself and gets the
   * real errno (ECONNRESET, ...) for CURLINFO_OS_ERRNO and the fallback
   * rule; CURL_CSELECT_ERR alone makes it fail with "select/poll returned
   * error" and no errno. */
  if (status < 0) flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  else {
    if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  }
  /* s may be closed by curl's socket callback in there; not used after. */
  drive(s->cl, s->fd, flags);
}

static void on_uv_timer(uv_timer_t *t) { drive(t->data, CURL_SOCKET_TIMEOUT, 0); }

/* CURLMOPT_SOCKETFUNCTION: watch, re-arm or forget one socket. */
static int on_curl_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
  sbx__curl_loop_t *cl = userp;
  cl_sock_t *s = socketp;
  int events = 0;
  (void)easy;
  if (what == CURL_POLL_REMOVE) {
    if (s != NULL) {
      sock_close(cl, s);
      curl_multi_assign(cl->multi, fd, NULL);
    }
    return 0;
  }
  if (s == NULL) {
    s = calloc(1, sizeof *s);
    if (s == NULL) return -1;
    if (uv_poll_init_socket(cl->loop, &s->poll, fd) != 0) { free(s); return -1; }
    s->poll.data = s;
    s->fd = fd;
    s->cl = cl;
    s->next = cl->socks;
    if (cl->socks != NULL) cl->socks->prev = s;
    cl->socks = s;
    curl_multi_assign(cl->multi, fd, s);
  }
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= UV_WRITABLE;
  return uv_poll_start(&s->poll, events, on_poll) != 0 ? -1 : 0;
}

/* CURLMOPT_TIMERFUNCTION: -1 stops the timer; 0 means "as soon as you can",
 * which a 0 ms uv timer gives without re-entering curl. */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
  sbx__curl_loop_t *cl = userp;
  (void)multi;
  if (cl->closing) return 0;
  if (timeout_ms < 0) uv_timer_stop(&cl->timer);
  else uv_timer_start(&cl->timer, on_uv_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

sbx__curl_loop_t *sbx__curl_loop_new(uv_loop_t *loop, sbx__curl_done_fn done) {
  sbx__curl_loop_t *cl;
  if (sbx__curl_global() != 0) return NULL;
  cl = calloc(1, sizeof *cl);
  if (cl == NULL) return NULL;
  cl->loop = loop;
  cl->done = done;
  cl->multi = curl_multi_init();
  if (cl->multi == NULL) { free(cl); return NULL; }
  curl_multi_setopt(cl->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
  curl_multi_setopt(cl->multi, CURLMOPT_SOCKETDATA, cl);
  curl_multi_setopt(cl->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
  curl_multi_setopt(cl->multi, CURLMOPT_TIMERDATA, cl);
  uv_timer_init(loop, &cl->timer);
  cl->timer.data = cl;
  return cl;
}

CURLM *sbx__curl_loop_multi(sbx__curl_loop_t *cl) { return cl->closing ? NULL : cl->multi; }

int sbx__curl_loop_add(sbx__curl_loop_t *cl, CURL *easy) {
  if (cl->closing || cl->multi == NULL) return -1;
  return curl_multi_add_handle(cl->multi, easy) == CURLM_OK ? 0 : -1;
}

void sbx__curl_loop_remove(sbx__curl_loop_t *cl, CURL *easy) {
  if (cl->multi != NULL) curl_multi_remove_handle(cl->multi, easy);
}

void sbx__curl_loop_close(sbx__curl_loop_t *cl) {
  if (cl == NULL || cl->closing) return;
  cl->closing = 1;
  if (cl->depth == 0) really_close(cl);
}

const char *sbx__curl_cause(CURL *easy, CURLcode rc) {
  long os_errno = 0;
  if (easy != NULL) curl_easy_getinfo(easy, CURLINFO_OS_ERRNO, &os_errno);
  switch (rc) {
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
    return "name resolution failed";
  case CURLE_COULDNT_CONNECT:
    if (os_errno == ECONNREFUSED) return "connection refused";
    if (os_errno == ENETUNREACH || os_errno == EHOSTUNREACH) return "network unreachable";
    if (os_errno == ETIMEDOUT) return "connect timed out";
    return "could not connect";
  case CURLE_OPERATION_TIMEDOUT:
    return "timed out";
  case CURLE_PEER_FAILED_VERIFICATION:
    return "TLS certificate verification failed";
  case CURLE_SSL_CONNECT_ERROR:
    return "TLS handshake failed";
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_CERTPROBLEM:
    return "TLS certificate file unusable";
  case CURLE_GOT_NOTHING:
    return "the server closed the connection without a reply";
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
    return os_errno == ECONNRESET ? "connection reset" : "connection failed while talking";
  case CURLE_WEIRD_SERVER_REPLY:
    return "not an HTTP/1.1 reply";
  case CURLE_UNSUPPORTED_PROTOCOL: {
    /* an HTTP/0.9 answer is refused with the same code, after a connect */
    char *ip = NULL;
    if (easy != NULL && curl_easy_getinfo(easy, CURLINFO_PRIMARY_IP, &ip) == CURLE_OK && ip != NULL && ip[0] != '\0')
      return "not an HTTP/1.1 reply";
    return "URL scheme refused (https only, http only where allowed)";
  }
  case CURLE_URL_MALFORMAT:
    return "URL malformed";
  case CURLE_PARTIAL_FILE:
    return "the reply ended early";
  case CURLE_OK:
    return "no final reply";
  default:
    return curl_easy_strerror(rc);   /* libcurl's static text: no payload */
  }
}
