/*
 * pipe_server.h: what the connection engine under both Unix-socket
 * listeners (conn.c; the sealed broker's listener.c and rich mode's
 * listener_stream.c) uses below HTTP: the private socket (bound with umask 077, chmod 0600
 * right after bind, a failure closes everything), the refusal of a
 * connection over the cap, and the hang-up probe.
 */
#ifndef SBX_PIPE_SERVER_H
#define SBX_PIPE_SERVER_H

#include <uv.h>

/*
 * Binds `server` (uv_pipe_init'ed by the caller) at path with umask 077,
 * chmods the socket 0600 right after the bind and listens. Returns 0, or a
 * negative uv error code after closing the handle with close_cb (libuv
 * unlinks a bound path when it closes the handle; an existing file that made
 * the bind fail is left alone). The umask is restored either way.
 */
int sbx__pipe_listen_private(uv_pipe_t *server, const char *path, int backlog,
                             uv_connection_cb on_connection, uv_close_cb close_cb);

/* Accepts one pending connection and closes it at once, writing nothing
 * (the connection over the cap). */
void sbx__pipe_refuse(uv_stream_t *server);

/* 1 when the peer closed both directions (POLLHUP or POLLERR), not only its
 * write side (a half-close); 1 too when the descriptor is gone. */
int sbx__pipe_hung_up(uv_pipe_t *pipe);

#endif
