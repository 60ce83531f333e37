/*
 * pipe_server.c: the socket-level pieces both Unix-socket listeners share
 * (see pipe_server.h). No Lua, no HTTP.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "pipe_server.h"

int sbx__pipe_listen_private(uv_pipe_t *server, const char *path, int backlog,
                             uv_connection_cb on_connection, uv_close_cb close_cb) {
  mode_t old = umask(077);
  int rc = uv_pipe_bind(server, path);
  umask(old);
  if (rc == 0 && chmod(path, 0600) != 0) rc = -errno;
  if (rc == 0) rc = uv_listen((uv_stream_t *)server, backlog, on_connection);
  if (rc != 0) uv_close((uv_handle_t *)server, close_cb);   /* unlinks if bound */
  return rc;
}

static void refused_closed(uv_handle_t *h) { free(h); }

void sbx__pipe_refuse(uv_stream_t *server) {
  uv_pipe_t *p = malloc(sizeof *p);
  if (p == NULL) return;
  uv_pipe_init(server->loop, p, 0);
  uv_accept(server, (uv_stream_t *)p);
  uv_close((uv_handle_t *)p, refused_closed);
}

int sbx__pipe_hung_up(uv_pipe_t *pipe) {
  uv_os_fd_t fd;
  struct pollfd p;
  if (uv_fileno((uv_handle_t *)pipe, &fd) != 0) return 1;
  p.fd = fd;
  p.events = 0;
  p.revents = 0;
  if (poll(&p, 1, 0) < 0) return 0;
  return (p.revents & (POLLHUP | POLLERR)) != 0;
}
