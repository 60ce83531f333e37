/*
 * test_peer.c: `sbxw-test-peer`, a spec-only stand-in for the broker that
 * lets spec/worker_prim_spec.lua check the worker's HTTP client byte for
 * byte (never part of the image).
 *
 *   sbxw-test-peer SOCKET REQUEST_OUT RESPONSE_FILE [SLICE [DELAY_MS]]
 *
 * Listens on SOCKET (bound as SOCKET.tmp and renamed once it listens, so a
 * client that sees SOCKET never meets a socket that refuses it), accepts one
 * connection, reads one request (head up to the blank line, then
 * content-length bytes), writes those bytes to
 * REQUEST_OUT, then sends RESPONSE_FILE's bytes (in SLICE-byte writes with
 * DELAY_MS between them when given) and closes. An empty RESPONSE_FILE means
 * close without answering; RESPONSE_FILE "-" means never answer (hold the
 * connection until killed). Exits 0 after the exchange, 1 on any error.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUEST (4 * 1024 * 1024)
#define MAX_RESPONSE (8 * 1024 * 1024)

static char req[MAX_REQUEST];
static char resp[MAX_RESPONSE];

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads the request: head, then content-length bytes; returns its length. */
static long read_request(int fd) {
  size_t len = 0, want = 0;
  char *end = NULL;
  for (;;) {
    if (len >= sizeof req) return -1;
    ssize_t n = read(fd, req + len, sizeof req - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    len += (size_t)n;
    if (end == NULL) {
      req[len < sizeof req ? len : sizeof req - 1] = '\0';
      end = memmem(req, len, "\r\n\r\n", 4);
      if (end != NULL) {
        const char *cl = memmem(req, (size_t)(end - req), "content-length: ", 16);
        want = (size_t)(end - req) + 4 + (cl ? strtoul(cl + 16, NULL, 10) : 0);
      }
    }
    if (end != NULL && len >= want) return (long)len;
  }
}

int main(int argc, char **argv) {
  struct sockaddr_un sa;
  char ready[sizeof sa.sun_path];
  size_t slice, rlen = 0;
  long delay_ms, qlen;
  int ls, fd, out, hold;
  FILE *f;
  if (argc < 4 || strlen(argv[1]) + 4 >= sizeof sa.sun_path) return 1;
  slice = argc > 4 ? strtoul(argv[4], NULL, 10) : 0;
  delay_ms = argc > 5 ? strtol(argv[5], NULL, 10) : 0;
  hold = strcmp(argv[3], "-") == 0;
  if (!hold) {
    if ((f = fopen(argv[3], "rb")) == NULL) return 1;
    rlen = fread(resp, 1, sizeof resp, f);
    fclose(f);
  }
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  strcpy(ready, argv[1]);
  strcat(ready, ".tmp");
  strcpy(sa.sun_path, ready);
  ls = socket(AF_UNIX, SOCK_STREAM, 0);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 4) != 0) return 1;
  if (rename(ready, argv[1]) != 0) return 1;
  fd = accept(ls, NULL, NULL);
  if (fd < 0 || (qlen = read_request(fd)) < 0) return 1;
  out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0 || write_all(out, req, (size_t)qlen) != 0) return 1;
  close(out);
  if (hold) {
    for (;;) pause();
  }
  if (slice == 0) slice = rlen ? rlen : 1;
  for (size_t off = 0; off < rlen; off += slice) {
    size_t n = rlen - off < slice ? rlen - off : slice;
    if (write_all(fd, resp + off, n) != 0) return 1;
    if (delay_ms > 0) {
      struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  close(fd);
  close(ls);
  unlink(argv[1]);
  return 0;
}
