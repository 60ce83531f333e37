/*
 * curl_loop.h: one libcurl multi handle driven by a libuv loop (internal).
 *
 * Used by fetch_attempt.c (safe fetch) and upstream.c (the
 * broker's upstream client). Each user creates its OWN curl loop: the
 * safe-fetch multi is never shared with the broker's upstream calls
 * (shared/spec/fetch-and-delegation.md 1.8).
 *
 * curl tells us which sockets to watch (CURLMOPT_SOCKETFUNCTION -> one
 * uv_poll_t per socket) and when to call back (CURLMOPT_TIMERFUNCTION -> one
 * uv_timer_t); libuv events are fed back with curl_multi_socket_action and
 * finished transfers are handed to `done` (CURLMSG_DONE), always from a libuv
 * callback after curl returned, never from inside a curl callback. `done`
 * may remove and clean up the easy handle, add others, or close the curl
 * loop: a close from inside a callback is completed when the callback
 * returns. Memory is freed in the uv close callbacks only.
 */
#ifndef SBX_CURL_LOOP_H
#define SBX_CURL_LOOP_H

#include <curl/curl.h>
#include <uv.h>

typedef struct sbx__curl_loop sbx__curl_loop_t;

/* priv is the easy handle's CURLOPT_PRIVATE (NULL: the message is ignored). */
typedef void (*sbx__curl_done_fn)(void *priv, CURL *easy, CURLcode rc);

/*
 * The one transfer policy of both multis (the broker's upstream client,
 * upstream.c, which carries the real credential, and safe fetch's pinned
 * attempts, fetch_attempt.c): the URL path as given, no user name in it, only
 * `protocols` ("https", or "http,https"), no redirects followed, no proxy
 * (the environment ignored), no netrc, TLS 1.2 or later with the peer and
 * host verified against `cainfo` (NULL: the system store), HTTP/1.1 and
 * never HTTP/0.9, no content decoding by curl, a fresh connection that is
 * never reused, no DNS cache entry kept, no signals. What differs between
 * the two callers is an argument here or an option of their own (a
 * transfer's body, callbacks, timeouts, the pin). Returns 0, or -1 when curl
 * refused an option: every one is policy, so none may be skipped.
 */
int sbx__curl_harden(CURL *easy, const char *protocols, const char *cainfo);

/* curl_global_init once per process; 0 or -1. */
int sbx__curl_global(void);

/* A new multi on loop, or NULL (out of memory, curl unavailable). */
/* Why a transfer that got no HTTP answer failed, in the operator's words: a
 * static string naming the cause (name resolution, connection refused, TLS
 * verification, ...) from rc and the socket's errno. Never holds payload. */
const char *sbx__curl_cause(CURL *easy, CURLcode rc);

sbx__curl_loop_t *sbx__curl_loop_new(uv_loop_t *loop, sbx__curl_done_fn done);

CURLM *sbx__curl_loop_multi(sbx__curl_loop_t *cl);

/* curl_multi_add_handle: 0 or -1. */
int sbx__curl_loop_add(sbx__curl_loop_t *cl, CURL *easy);

/* curl_multi_remove_handle (no-op once the loop is closed). */
void sbx__curl_loop_remove(sbx__curl_loop_t *cl, CURL *easy);

/* Tears the multi down: every easy handle must have been removed (or be
 * cleaned up by the caller right after: curl forgets them). Watched sockets
 * and the timer are closed; the memory goes in their close callbacks. */
void sbx__curl_loop_close(sbx__curl_loop_t *cl);

#endif
