/*
 * aux.h: the helpers every part of `sandbox.core` shares (Lua's lauxlib to
 * core.c's linit): registry references, userdata classes and boxes, readers
 * for fields of an opts table, the path check, the one C -> Lua failure edge
 * and the operator log. Parts depend on these helpers, never the reverse,
 * and nothing here needs libuv: the worker compiles core/json.c and
 * core/reflect.c with aux.c and nothing else of the core. The loop and
 * protected callbacks are loop.h; the list of parts is parts.h.
 *
 * Conventions (luv's, CONVENTIONS.md): a wrong argument is a programming
 * error and raises (luaL_check*, the readers below); a runtime failure
 * returns nil, "ENAME: message", "ENAME" through sbx__push_error, with the
 * errno an integer until that edge.
 */
#ifndef SBX_AUX_H
#define SBX_AUX_H

#include <stddef.h>
#include <lua.h>
#include <lauxlib.h>

#include "bounds.h"
#include "sbx.h"

/* ---- registry references ------------------------------------------------ */

/* A reference to the value at idx (functions, userdata). */
int sbx__ref(lua_State *L, int idx);
/* Drops *ref (no-op for LUA_NOREF / LUA_REFNIL) and sets it to LUA_NOREF. */
void sbx__unref(lua_State *L, int *ref);

/* ---- userdata classes and boxes ------------------------------------------- */

/* Registers metatable `name` once: __index = a table of `methods`, __gc =
 * gc. Leaves the stack as it was. */
void sbx__class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc);

/*
 * A box is the Lua face of a C object whose memory libuv (or curl) owns: a
 * full userdata holding one pointer to the object, while the object holds a
 * pointer back to the box. Whichever side goes first unlinks the other, so
 * a collected userdata never frees memory a handle still uses, and a freed
 * object is never reached from Lua (its box reads NULL).
 *
 *   box = sbx__box_new(L, MT);       pushes an empty box (may raise: call it
 *                                    before owning C memory)
 *   sbx__box_bind(box, obj, &obj->box);   (back NULL: an object that never
 *                                    goes first, e.g. one the box owns)
 *   obj = sbx__box_check(L, 1, MT);  the object, or NULL once it is gone
 *   obj = sbx__box_detach(box);      both sides forget each other (a __gc)
 *   sbx__box_unbind(obj->box);       the object is being freed
 *
 * sbx__box_gc is the __gc of a box whose object goes on when Lua lets go.
 */
typedef struct sbx__box {
  void *obj;                  /* NULL once unlinked */
  struct sbx__box **back;     /* the object's pointer to this box */
} sbx__box_t;

sbx__box_t *sbx__box_new(lua_State *L, const char *mt);
void sbx__box_bind(sbx__box_t *box, void *obj, sbx__box_t **back);
void *sbx__box_check(lua_State *L, int idx, const char *mt);
void *sbx__box_detach(sbx__box_t *box);
void sbx__box_unbind(sbx__box_t *box);
int sbx__box_gc(lua_State *L);

/* ---- fields of an opts table (luaL_opt* for tables) ------------------------
 * The table is at index t; `who` names the function in messages
 * ("broker_listen: opts.max_calls must be an integer in 1..1000"). A field
 * that is nil takes the default; anything else must have the type and lie
 * in range, or the reader raises. */

lua_Integer sbx__opt_integer_field(lua_State *L, int t, const char *who, const char *field,
                                   lua_Integer dflt, lua_Integer lo, lua_Integer hi);
/* The same, but a nil field raises "<who>: opts.<field> is required". */
lua_Integer sbx__check_integer_field(lua_State *L, int t, const char *who, const char *field,
                                     lua_Integer lo, lua_Integer hi);
/* A string of at most max bytes (NUL bytes refused unless allow_nul), or
 * NULL when nil. It stays alive in the opts table. */
const char *sbx__opt_string_field(lua_State *L, int t, const char *who, const char *field,
                                  size_t max, size_t *len, int allow_nul);
/* A boolean, or dflt when nil. */
int sbx__opt_boolean_field(lua_State *L, int t, const char *who, const char *field, int dflt);

/* A non-empty path without NUL bytes at idx (raises otherwise); *len may be
 * NULL. */
const char *sbx__check_path(lua_State *L, int idx, size_t *len);

/* ---- the failure edge -------------------------------------------------------- */

/*
 * luv's luv_error: pushes nil, "ENAME: text", "ENAME" and returns 3, where
 * err is a positive errno, ENAME its name (strerrorname_np: "ENOENT", and
 * "EAGAIN" for EWOULDBLOCK) and text is msg, or strerror(err) when msg is
 * NULL. sbx__push_failure pushes nil, msg, "ENAME" for the few failures
 * whose message is a product string a spec page fixes word for word (the
 * listener's "broker socket path too long"), which an operator and the
 * CLI's fix table read as they are.
 */
int sbx__push_error(lua_State *L, int err, const char *msg);
int sbx__push_failure(lua_State *L, int err, const char *msg);

/* The name of a positive errno ("ECONNRESET"), "EUNKNOWN" when it has none. */
const char *sbx__errno_name(int err);
/* The errno of a name, 0 when it names none (a seam's text at the edge). */
int sbx__errno_from_name(const char *name);

/* ---- process ---------------------------------------------------------------- */

/* Operator log line on stderr in the operator log's format (spec/operations.md
 * 2): "<time> <level> <msg>", or one JSON object when sbx__log_set_json(1),
 * and with a syslog priority prefix instead of the time when stderr is the
 * journal (JOURNAL_STREAM). Never pass payloads. */
void sbx__log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbx__log_set_json(int json);
/* 1 when JOURNAL_STREAM names the device and inode of stderr. */
int sbx__log_journal(void);
/* The current UTC time as 2026-12-01T19:43:22.104Z into buf; its length. */
size_t sbx__log_time(char *buf, size_t n);

/* A write to a peer that left must fail with EPIPE, not kill the process:
 * SIGPIPE is ignored process-wide (when it was at its default) as soon as
 * sandbox.core is opened. */
void sbx__ignore_sigpipe(void);

#endif
