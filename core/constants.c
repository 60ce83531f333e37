/*
 * constants.c: core.limits, the bounds of bounds.h by name (luv exports its
 * constants the same way), so Lua never restates a number C enforces:
 *
 *   core.limits.CALL_DEADLINE_MS, MAX_REPLY_BYTES, MAX_SOCKET_PATH,
 *   MAX_UPSTREAM_BYTES, MAX_BODY_BYTES, ... (the SBX_ name without SBX_)
 *
 * The table is read-only in spirit: it is a fresh copy per state, and
 * changing it changes nothing in C.
 */
#include "aux.h"
#include "parts.h"

#define LIMIT(name) {#name, SBX_##name}

void sbx__open_constants(lua_State *L) {
  static const struct { const char *name; lua_Integer value; } limits[] = {
    LIMIT(MAX_CONNECTIONS), LIMIT(HEADER_DEADLINE_MS), LIMIT(REQUEST_DEADLINE_MS),
    LIMIT(CALL_DEADLINE_MS), LIMIT(MAX_HEAD_BYTES), LIMIT(MAX_BODY_BYTES),
    LIMIT(MAX_UPSTREAM_BYTES), LIMIT(MAX_REPLY_BYTES), LIMIT(MAX_JSON_DEPTH),
    LIMIT(MAX_SOCKET_PATH), LIMIT(DEFAULT_MAX_CALLS), LIMIT(MAX_CALLS_LIMIT),
    LIMIT(MAX_CREDENTIAL_BYTES), LIMIT(MAX_ROUTES), LIMIT(LINGER_MS),
    LIMIT(MAX_LINGER_BYTES), LIMIT(HUP_POLL_MS), LIMIT(MAX_CONTENT_TYPE_BYTES),
  };
  size_t i;
  lua_createtable(L, 0, (int)(sizeof limits / sizeof limits[0]));
  for (i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    lua_pushinteger(L, limits[i].value);
    lua_setfield(L, -2, limits[i].name);
  }
  lua_setfield(L, -2, "limits");
}
