/*
 * sbxw.c: the primitive module `sbxw` (worker/PRIMITIVES.md), and nothing
 * else: one table names every part, each opened in turn into one module
 * table (as core/core.c does for sandbox.core). The parts are the other
 * files of worker/ plus the core's strict JSON (core/json.c); what they
 * share is waux.c (and core/aux.c for json.c and reflect.c), never this.
 */
#include "parts.h"
#include "sbxw.h"

static const struct {
  const char *name;                 /* the file, for a reader */
  void (*open)(lua_State *L);
} parts[] = {
  {"stdio", sbxw__open_stdio},
  {"core/json", sbx__open_json},    /* json_decode, json_encode, utf8_valid, json_null, metatables */
  {"fs", sbxw__open_fs},
  {"utf8", sbxw__open_utf8},
  {"localtime", sbxw__open_localtime},
  {"broker_client", sbxw__open_broker},
};

int luaopen_sbxw(lua_State *L) {
  size_t i;
  lua_newtable(L);
  for (i = 0; i < sizeof parts / sizeof parts[0]; i++) parts[i].open(L);
  return 1;
}
