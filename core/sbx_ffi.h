/*
 * sbx_ffi.h: the flat C ABI that embeds the whole sandbox engine (libsbx.so)
 * in another process: the chat bot's Bun plugin through bun:ffi, or any C
 * host. Only plain C types cross it: opaque pointers, int32/int64, size_t,
 * NUL-terminated UTF-8 strings holding JSON. Nothing here needs lua.h.
 *
 * Which file to load
 * ------------------
 * C hosts link libsbx.so. A JavaScript runtime loads libsbx_ffi.so (built
 * next to it by `make`): the same functions, forwarded to libsbx.so opened
 * with RTLD_DEEPBIND. Bun's executable exports its own uv_* functions
 * (Node-API stubs, some of which abort: "unsupported uv function:
 * uv_cond_init"), and a plain dlopen of libsbx.so from Bun binds the
 * engine's libuv calls to them. $SBX_LIBSBX overrides the path the shim
 * loads. (Equivalent: dlopen libsbx.so with RTLD_NOW | RTLD_DEEPBIND through
 * libc yourself and bind the symbols, as bun/src/ffi.ts does.)
 *
 * Model
 * -----
 * An engine owns one Lua state and one libuv loop, both living on the
 * engine's own thread (started by sbx_engine_new, joined by
 * sbx_engine_stop/sbx_engine_free). The caller's thread never runs Lua.
 * Requests cross to the engine thread through a mutex-protected queue and a
 * uv_async wake-up; sbx_engine_submit only copies and enqueues, so it never
 * waits for a turn. Every request gets exactly one final result (below);
 * turns run concurrently on the loop, so results may arrive in any order.
 *
 * Threads
 * -------
 * Every function may be called from any thread, except sbx_engine_free
 * (never concurrently with another call on the same engine) and the
 * blocking calls sbx_engine_call/sbx_engine_status/sbx_engine_metrics/
 * sbx_engine_stop/sbx_engine_free, which refuse (or, for free, must not be
 * made) from inside the result callback, i.e. on the engine thread.
 *
 * Memory
 * ------
 * Memory is freed only by the side that allocated it. Every `char *` this
 * ABI returns (error_out, sbx_engine_poll, sbx_engine_call,
 * sbx_engine_status, sbx_engine_metrics) was allocated by libsbx and must be
 * released with sbx_free, never with the host's free(). Buffers the caller passes in are
 * copied before the call returns; the library keeps no pointer to them.
 * The `json` pointer handed to a result callback belongs to the library and
 * is valid only during that call (copy it if needed; do not free it).
 *
 * Results: a callback, or polling
 * -------------------------------
 * If sbx_engine_new gets a callback, every output (results and events) is
 * passed to it ON THE ENGINE THREAD, one at a time, in emission order, and
 * nothing is queued for polling. With bun:ffi that means a JSCallback created
 * with `threadsafe: true`. The callback must return quickly and must not
 * call sbx_engine_call/status/stop/free (sbx_engine_submit and
 * sbx_engine_poll are fine).
 * If the callback is NULL, outputs are queued (at most SBX_FFI_MAX_QUEUED
 * entries and SBX_FFI_MAX_QUEUED_BYTES bytes; beyond that an output is
 * dropped and counted in status as `engine.dropped`) and the caller takes
 * them with sbx_engine_poll. sbx_engine_fd returns an eventfd that is
 * readable while the queue is non-empty (level-triggered from the caller's
 * point of view: poll drains the counter when it empties the queue), so a
 * JS host can watch it or simply poll on a timer.
 *
 * Output JSON (one object per output, compact, UTF-8)
 * ---------------------------------------------------
 *   final result of request R (exactly one per accepted submit):
 *     {"type":"result","request":R,"ok":true,"value":<any JSON>}
 *     {"type":"result","request":R,"ok":false,"error":"<message>"}
 *     {"type":"result","request":R,"ok":false,"error":"<message>",
 *      "errorInfo":{"name":"UnsafeUrlError","message":"...","code":"ECONNREFUSED"?,
 *                   "status":413?,"headers":{...}?}}
 *        (errorInfo: when the Lua error was a structured error object: safe
 *        fetch's errors (spec fetch-and-delegation.md 1.15), DelegationError)
 *   events (not final; "request" = the request they belong to, 0 when none):
 *     {"type":"apiKey.request","request":0,"id":K,"provider":"openai"?,
 *      "scope":{"channel":"...","speaker":{"id":"...","name":"...","principalId":"..."}}|null}
 *        the engine needs a model key from the host (options "apiKey":"host":
 *        scope set, before every model call; options "hostLogin":true: the
 *        host login of "provider", scope null). Answer with a submitted
 *        {"type":"apiKey.result","id":K,"key":"..."}; "key":null, absent,
 *        "" or a non-string fails closed (that model call gets the broker's
 *        502, never a fallback). Unanswered after SBX_FFI_APIKEY_TIMEOUT_MS,
 *        or when the engine stops: fails closed.
 *     {"type":"callback.request","request":0,"id":K,"owner":O,"fn":F,"args":[...]}
 *        the engine calls a host function registered under owner O (a safe
 *        fetch's test seam: fn resolve|localAddresses|transport; a scoped
 *        delegator's run|deliver; a research worker's findModel|complete|
 *        search|...). Answer with a submitted
 *        {"type":"callback.result","id":K,"ok":true,"value":V} or
 *        {"type":"callback.result","id":K,"ok":false,"error":{"name":..,"message":..,"code":..}}.
 *        id 0: one-way (fn "logger.error"), no answer. When the engine
 *        stops, waiting calls fail with "engine stopped".
 *     {"type":"callback.abort","request":0,"id":K,"owner":O,"reason":"..."}
 *        the signal of host call K aborted (a delegated job's deadline or
 *        disposal, a fetch deadline); K still expects its answer
 *     {"type":"event","request":R,"name":"claim","claim":{...}}
 *        a message request's claim decision, before its turn runs
 *     {"type":"event","request":R,"name":"typing","on":true|false}
 *        start / stop the typing indicator for message request R (9.3)
 *   The callback's request_id argument equals the "request" member.
 *   Lua values are encoded as JSON; an empty Lua table encodes as {}.
 *
 * Request JSON (sbx_engine_submit / sbx_engine_call), an object with "type".
 * EVENT and ADMISSION are the shapes documented in lua/sandbox/app.lua
 * (event: type, id, surface, channelId, guildId, author{id,name,bot,
 * integration}, webhookId, mentionsBot, replyToBot, text, quoted,
 * attachments; admission: {tier, principalId} or null). JSON null members
 * reach Lua as absent (nil).
 *   {"type":"ping"}                       value: true (the no-op round trip)
 *   {"type":"status"}                     value: app:status() members plus
 *       "engine":{"abi":1,"pending":n,"submitted":n,"queued":n,"dropped":n,"stopping":b}
 *   {"type":"metrics"}                    value: the Prometheus text exposition
 *       (a string; app:metrics(), spec/operations.md 4; sbx_engine_metrics
 *       returns the same text without the JSON)
 *   {"type":"image"}                      value: {"image":NAME,"checked":b,"present":b?,
 *       "error":"<message>; fix: <fix>"?}: whether the daemon has the app's
 *       image, asked through its driver's inspect_image (checked false for a
 *       driver without one); the Bun bridge's sandbox() refuses to start
 *       when present is false, with that error
 *   {"type":"claim","event":EVENT,"admission":ADMISSION}
 *       value: app:claim(...) = {"claim":b,"priority":200,"action":"answer"|"drop"|"command"}
 *       (pure decision, no side effect)
 *   {"type":"message","event":EVENT,"admission":ADMISSION}
 *       app:claim, a "claim" event, then (when claimed) app:handle as a task
 *       on the loop (runs the turn; typing events). value:
 *       {"claim":{...},"result":{"replies":["...",...],
 *        "allowedMentions":{"parse":[]}}|null}
 *       (result null: not claimed, dropped, or switched off meanwhile).
 *       The reply text is the worker's, delivered unchanged (control
 *       characters included) but for the mention neutralising of
 *       mentions = "neutral" (then allowedMentions is present): the host's
 *       chat adapter renders it, and passes allowedMentions on.
 *   {"type":"command","event":EVENT,"admission":ADMISSION}
 *       app:command (`/<root> sandbox on|off|status`, event.subcommand);
 *       value: {"replies":["..."],"ephemeral":true}
 *   {"type":"stop","channel":KEY}         value: boolean (app:stop, 9.4)
 *   {"type":"startFresh","channel":KEY}   value: "sandbox"
 *   {"type":"background","channel":KEY}   value: {"skipped":true,"reason":...}|null
 *   {"type":"owns","channel":KEY}         value: boolean
 *   {"type":"service","op":OP,"args":[...]}
 *       app.services.SANDBOX (section 10): OP has|list|enable|disable
 *       (channels, args [key]) or runTurn|startFresh|stop|busy|dispose|sweep
 *       (runtime; runTurn args [channel,{"id","name","principalId"},text]);
 *       value: the method's return. runTurn's is the turn result of
 *       spec/operations.md 1: {"ok":true,"text":..,"reason":"ok","turn":ID}
 *       or {"ok":false,"reason":REASON,"text":..,"guest":..,"turn":ID,
 *       "fix":..?,"error":..?,"route":..?,"status":N?,"code":..?,"type":..?,
 *       "param":..?} (reason: the closed set of lua/sandbox/errors.lua;
 *       never shown to guests)
 *   {"type":"apiKey.result","id":K,"key":"..."|null}
 *       value: true if K was waiting
 *   {"type":"callback.result","id":K,...}   value: true if K was waiting
 *   {"type":"cancel","target":R,"reason":"..."}
 *       aborts the signal of request R (fetch, assertPublicUrl,
 *       pinnedTransport); value: true if R was running
 *   Host facilities (lua/sandbox/embed/_utilities.lua; also served by an
 *   engine made without a config, see sbx_engine_new); bytes travel as
 *   base64 in "dataBase64", non-finite numbers as "Infinity"/"-Infinity"/"NaN":
 *   {"type":"fetch","url":U,"options":{maxBytes,timeoutMs,idleTimeoutMs,
 *    maxRedirects,followRedirects,headers},"owner":O,"seams":{"resolve":true,..}}
 *       value: {"url","status","statusText","headers","dataBase64"}
 *   {"type":"assertPublicUrl","url":U,"options":{"timeoutMs":N},"owner":O,"seams":{..}}
 *       value: the canonical URL
 *   {"type":"pinnedTransport","url":U,"address":{"address":A,"family":4|6,"port":P?},
 *    "maxBytes":N,"headers":{..}}     one attempt (a test seam's real transport)
 *   {"type":"isPublicAddress","text":T}   value: boolean
 *   {"type":"scrubDiagnostic","text":T,"max":N}  value: the scrubbed text
 *   {"type":"delegator.new","owner":O,"options":{target,maxRunning,timeoutMs,
 *    maxTitleChars,maxReportChars,diagnosticChars},"callbacks":{"run":b,"deliver":b,"logger":b}}
 *   {"type":"delegator.start","owner":O,"request":{..},"keys":[member names]}
 *       value: the job record (or errorInfo name DelegationError)
 *   {"type":"delegator.runningChannels"|"delegator.idle"|"delegator.dispose","owner":O}
 *   {"type":"research.check"|"research.run",...}  the research worker, its model
 *       runtime, search, fetch and extensions as host calls
 *       (lua/sandbox/embed/_research.lua documents the shapes)
 *   {"type":"precheck.new"|"precheck.describe"|"precheck.run"|"precheck.toolName"|
 *    "precheck.dispose","owner":O,...}  the precheck script runner a trusted Lua
 *       config builds (lua/sandbox/embed/_precheck.lua documents the shapes)
 *   {"type":"rich.new"|"rich.runTurn"|"rich.start"|"rich.stop"|"rich.startFresh"|
 *    "rich.status"|"rich.sessionsDir"|"rich.attachmentDir"|"rich.stopBrokers"|
 *    "rich.dispose","owner":O,...}  rich mode's runtime (PiSandboxRuntime), its
 *       callbacks host calls of O or a trusted Lua config's functions
 *       (lua/sandbox/embed/_rich.lua documents the shapes)
 * An unknown type, malformed JSON, a missing member or a Lua error gives an
 * ok=false result, never a crash. Requests are at most
 * SBX_FFI_MAX_REQUEST_BYTES.
 *
 * options_json (may be NULL or "{}"): an object; every member optional
 *   "luaDir":    directory of the Lua tree (the one holding sandbox/init.lua);
 *                default $SBX_LUA_DIR, else the first of <dir of libsbx.so>/../lua
 *                (a checkout's build/, a Bun package's native/),
 *                <dir>/../share/lua/5.4 (`make install`) and <dir>/lua that
 *                holds sandbox/init.lua; none: construction fails naming
 *                SBX_LUA_DIR
 *   "apiKey":    "host": the apiKey option becomes the host-side function
 *                reached through apiKey.request events (it overrides the
 *                config's); "config" (default): the config's own
 *   "hostLogin": true: with no apiKey option, the app's host login reader
 *                asks the host (apiKey.request with "provider", scope null)
 *   "logger":    true: the engine's operator log lines (spec/operations.md 2)
 *                go to the host instead of stderr, as one-way
 *                {"type":"callback.request","id":0,"owner":"logger",
 *                 "fn":"debug"|"info"|"warn"|"error","args":[message,{fields}]}
 *   "host":      the app:start(host) fields expressible in JSON:
 *                "timeZone", "rootCommand", "slashCommands" (lua/sandbox/app.lua)
 *   "sandbox":   sandbox{} option overrides (JSON values, e.g.
 *                "initialChannels", "turnTimeoutMs", "allowHttp"), merged over
 *                the config's options and checked again; an unknown name
 *                fails construction with "unknown sandbox option: <name>"
 * The config script runs like `sbx` runs it (it returns `sandbox{...}`); it
 * receives the decoded options object as its chunk argument (`...`), so
 * embedder-specific members (paths, ...) may be added freely. It may return,
 * after the app, a function the engine calls once after disposing the app
 * (to close what the script itself opened on the loop).
 *
 * Process-wide effects: SIGPIPE is ignored (when it was at its default);
 * libuv installs its SIGCHLD handler when the engine first spawns a child
 * (docker), reaping only its own children. Several engines may coexist
 * (each has its own thread, state and loop) but not on the same runRoot.
 */
#ifndef SBX_FFI_H
#define SBX_FFI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SBX_FFI_ABI_VERSION         1
#define SBX_FFI_MAX_REQUEST_BYTES   (4u * 1024u * 1024u)  /* one submitted request */
#define SBX_FFI_MAX_PENDING         4096                  /* submitted, not yet taken by the loop */
#define SBX_FFI_MAX_QUEUED          4096                  /* outputs waiting for sbx_engine_poll */
#define SBX_FFI_MAX_QUEUED_BYTES    (64u * 1024u * 1024u)
#define SBX_FFI_APIKEY_TIMEOUT_MS   30000
#define SBX_FFI_STATUS_TIMEOUT_MS   5000                  /* sbx_engine_status */

/* Negative results of sbx_engine_submit / sbx_engine_call. Besides these:
 * SBX_EINVAL (-1001: NULL engine/json, or not valid UTF-8 JSON text start),
 * SBX_ETOOBIG (-1003: over SBX_FFI_MAX_REQUEST_BYTES), -ENOMEM. */
#define SBX_ESTOPPED  (-1010)  /* the engine is stopping or stopped */
#define SBX_EBUSY     (-1011)  /* SBX_FFI_MAX_PENDING requests already queued */
#define SBX_ETHREAD   (-1012)  /* a blocking call made on the engine thread */
#define SBX_ETIMEOUT  (-1013)  /* sbx_engine_call: no result within timeout_ms */

typedef struct sbx_engine sbx_engine;

/* Called on the engine thread for every output; json[len] == '\0'. */
typedef void (*sbx_result_fn)(void *user, int64_t request_id,
                              const char *json, size_t len);

/* SBX_FFI_ABI_VERSION of the loaded library (check it before anything). */
int32_t sbx_ffi_abi_version(void);

/*
 * Creates an engine: starts its thread, makes the Lua state (standard
 * libraries, sandbox.core preloaded, package.path from the Lua dir), runs the
 * config script at config_path and builds the app there. A NULL or empty
 * config_path makes a utility engine without an app: it serves ping, status,
 * callback.result, cancel and the host facilities (fetch, delegator.*);
 * app requests fail with "this engine has no app: ...". Returns only once
 * that succeeded (the engine, ready for submits) or failed: NULL, and when
 * error_out is non-NULL *error_out = an allocated message (the Lua error,
 * e.g. "unknown sandbox option: bogus"; free it with sbx_free).
 * cb may be NULL (then use sbx_engine_poll); user is passed back to cb.
 */
sbx_engine *sbx_engine_new(const char *config_path, const char *options_json,
                           sbx_result_fn cb, void *user, char **error_out);

/*
 * Queues one request (JSON text, len bytes, need not be NUL-terminated;
 * copied). Returns its request id (> 0, increasing) or a negative code.
 * Never blocks longer than a mutex hand-off.
 */
int64_t sbx_engine_submit(sbx_engine *e, const char *json, size_t len);

/* Next queued output (polling mode), or NULL when none. Free with sbx_free. */
char *sbx_engine_poll(sbx_engine *e);

/* The eventfd that is readable while outputs are queued (polling mode);
 * owned by the engine (do not close it), valid until sbx_engine_free. */
int32_t sbx_engine_fd(sbx_engine *e);

/*
 * Submits a request and waits (at most timeout_ms) for its final result,
 * which is returned (free with sbx_free) instead of being delivered to the
 * callback/queue. Events of that request still go to the callback/queue.
 * NULL on failure with *code_out (if non-NULL) set to the negative code.
 * Not from the engine thread. Do not use it for message requests whose
 * apiKey.request events must be answered by the same thread.
 */
char *sbx_engine_call(sbx_engine *e, const char *json, size_t len,
                      int32_t timeout_ms, int32_t *code_out);

/* Synchronous {"type":"status"} (SBX_FFI_STATUS_TIMEOUT_MS): the result
 * object's JSON, or NULL (stopped, timeout, engine thread). sbx_free it. */
char *sbx_engine_status(sbx_engine *e);

/* Synchronous {"type":"metrics"} (SBX_FFI_STATUS_TIMEOUT_MS): the engine's
 * Prometheus text exposition (format 0.0.4, spec/operations.md 4) itself,
 * NUL-terminated, not JSON; or NULL (stopped, timeout, engine thread, an
 * engine without an app, or an app not started). sbx_free it. */
char *sbx_engine_metrics(sbx_engine *e);

/*
 * Stops the engine: new submits get SBX_ESTOPPED; the app is disposed
 * (running turns end, their containers are removed, pending apiKey requests
 * fail closed); every request still without a result gets
 * {"ok":false,"error":"engine stopped"}; then the loop thread ends. Blocks
 * until that thread has finished. Idempotent. Queued outputs stay pollable.
 */
void sbx_engine_stop(sbx_engine *e);

/* sbx_engine_stop if needed, then releases everything (the Lua state, the
 * fd, queued outputs). e is invalid afterwards. NULL is a no-op. */
void sbx_engine_free(sbx_engine *e);

/* Releases memory returned by this ABI. NULL is a no-op. */
void sbx_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
