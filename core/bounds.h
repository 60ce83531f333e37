/*
 * bounds.h: every bound of the broker in one place (spec/broker.md section 1).
 * Change a number here and nowhere else: Lua reads the same numbers as
 * core.limits (constants.c) and the worker's broker client includes this
 * header too.
 */
#ifndef SBX_BOUNDS_H
#define SBX_BOUNDS_H

#define SBX_MAX_CONNECTIONS        16
#define SBX_HEADER_DEADLINE_MS     10000
#define SBX_REQUEST_DEADLINE_MS    60000
#define SBX_CALL_DEADLINE_MS       60000
#define SBX_MAX_HEAD_BYTES         16384
#define SBX_MAX_BODY_BYTES         262144
/* The Lua memory a buffered body (sealed, precheck) may take once decoded,
 * as core/json_shape.c estimates it before building anything: FACTOR times
 * the body, at least FLOOR_FACTOR times the listener's body limit (4 MiB
 * for the sealed 256 KiB, 1 MiB for precheck's 64 KiB). A body of nested
 * empty containers at the limit would take ~80x; it is refused after the
 * scan. The heaviest real sealed requests (many tool schemas and short
 * messages) estimate at ~11x of ~200 KB, under the floor (bench/results.md,
 * request bodies). */
#define SBX_BODY_MEMORY_FACTOR       4
#define SBX_BODY_MEMORY_FLOOR_FACTOR 16
#define SBX_MAX_UPSTREAM_BYTES     1048576
#define SBX_MAX_REPLY_BYTES        1048576
#define SBX_MAX_ERROR_BODY_BYTES   4096    /* a non-2xx body read for the log (providers.md 4) */
#define SBX_MAX_JSON_DEPTH         64
#define SBX_MAX_SOCKET_PATH        100
#define SBX_DEFAULT_MAX_CALLS      48
#define SBX_MAX_CALLS_LIMIT        1000
#define SBX_MAX_CREDENTIAL_BYTES   4096
#define SBX_MAX_ROUTES             1024

/* Rich mode (spec/rich-mode.md 8, 9, 11.5, 5.4, 20): the stream listener
 * (listener_stream.c), streaming upstream calls (upstream_stream.c), the
 * bounded reflection stream (reflect_stream.c), the SSE error watch
 * (sse_watch.c) and the Engine API driver's per-call deadline. */
#define SBX_STREAM_MAX_CONNECTIONS     16
#define SBX_STREAM_HEADER_DEADLINE_MS  10000
#define SBX_STREAM_IDLE_MS             120000
#define SBX_STREAM_MAX_BODY_BYTES      (96 * 1024 * 1024)
#define SBX_STREAM_HIGH_WATER          16384      /* queued unsent: pause the producer */
#define SBX_STREAM_MAX_RESPONSE_BYTES  (50 * 1024 * 1024)
#define SBX_SSE_MAX_EVENT_BYTES        65536      /* an unfinished event beyond it is dropped */
#define SBX_DOCKER_CALL_MS             15000

/* The host's descriptors as a budget (shared/spec/hardening.md 2; fdbudget.c).
 * A running turn costs TURN_COST descriptors of the host's own (its listener,
 * the docker child's three pipes, one upstream socket, one for the workspace
 * walk and the run directory's removal) plus GUARANTEED_CONNS broker
 * connections; HOST_RESERVE more stay free for the host's own work (its
 * spawns' transient pipes, log and state files, host tools); TURN_HEADROOM
 * turns' worth stays free of the shared pool, so a new turn starts at once. */
#define SBX_FD_HOST_RESERVE        24
#define SBX_FD_TURN_COST           6
#define SBX_FD_GUARANTEED_CONNS    2
#define SBX_FD_TURN_HEADROOM       1

/* Connection engine internals (conn.c, listener.c), not spec numbers. */
#define SBX_LISTEN_BACKLOG         128     /* pending connects queued by the kernel */
#define SBX_LINGER_MS              2000    /* after a reply: drain client bytes, then close */
#define SBX_MAX_LINGER_BYTES       (SBX_MAX_HEAD_BYTES + SBX_MAX_BODY_BYTES)
#define SBX_MAX_DISCARD_BYTES      (SBX_MAX_HEAD_BYTES + SBX_MAX_BODY_BYTES)
#define SBX_HUP_POLL_MS            200     /* peer half-closed mid-call: check for hang-up */
#define SBX_MAX_CONTENT_TYPE_BYTES 128
#define SBX_MAX_HEAD_FIELDS        128     /* header lines framed per head (http_head.c) */

#endif
