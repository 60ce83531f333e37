/*
 * constants.c: core.limits, the bounds of bounds.h by name (luv exports its
 * constants the same way), so Lua never restates a number C enforces:
 *
 *   core.limits.CALL_DEADLINE_MS, MAX_REPLY_BYTES, MAX_SOCKET_PATH,
 *   MAX_UPSTREAM_BYTES, MAX_BODY_BYTES, ... (the SBX_ name without SBX_)
 *
 * The table is read-only in spirit: it is a fresh copy per state, and
 * changing it changes nothing in C.
 *
 * core.version is sbx_version() (sbx.h): the release the Makefile passes
 * from the VERSION file as SBX_VERSION, one string for the C ABI, `sbx
 * --version`, sbx.pc, the rockspec and the Bun package.
 */
#include "aux.h"
#include "parts.h"

#ifndef SBX_VERSION
#define SBX_VERSION "0.0.0-unknown"   /* a build outside the Makefile (fuzzers) */
#endif

const char *sbx_version(void) { return SBX_VERSION; }

#define LIMIT(name) {#name, SBX_##name}

void sbx__open_constants(lua_State *L) {
  static const struct { const char *name; lua_Integer value; } limits[] = {
    LIMIT(MAX_CONNECTIONS), LIMIT(HEADER_DEADLINE_MS), LIMIT(REQUEST_DEADLINE_MS),
    LIMIT(CALL_DEADLINE_MS), LIMIT(MAX_HEAD_BYTES), LIMIT(MAX_BODY_BYTES),
    LIMIT(MAX_UPSTREAM_BYTES), LIMIT(MAX_REPLY_BYTES), LIMIT(MAX_ERROR_BODY_BYTES), LIMIT(MAX_JSON_DEPTH),
    LIMIT(MAX_SOCKET_PATH), LIMIT(DEFAULT_MAX_CALLS), LIMIT(MAX_CALLS_LIMIT),
    LIMIT(MAX_CREDENTIAL_BYTES), LIMIT(MAX_ROUTES), LIMIT(LINGER_MS),
    LIMIT(MAX_LINGER_BYTES), LIMIT(HUP_POLL_MS), LIMIT(MAX_CONTENT_TYPE_BYTES),
    LIMIT(STREAM_MAX_CONNECTIONS), LIMIT(STREAM_HEADER_DEADLINE_MS), LIMIT(STREAM_IDLE_MS),
    LIMIT(STREAM_MAX_BODY_BYTES), LIMIT(STREAM_HIGH_WATER), LIMIT(STREAM_MAX_RESPONSE_BYTES),
    LIMIT(SSE_MAX_EVENT_BYTES), LIMIT(DOCKER_CALL_MS), LIMIT(FD_TURN_COST), LIMIT(FD_GUARANTEED_CONNS),
  };
  size_t i;
  lua_createtable(L, 0, (int)(sizeof limits / sizeof limits[0]));
  for (i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    lua_pushinteger(L, limits[i].value);
    lua_setfield(L, -2, limits[i].name);
  }
  lua_setfield(L, -2, "limits");
  lua_pushstring(L, sbx_version());
  lua_setfield(L, -2, "version");
}
