/*
 * model_fuzz.c: libFuzzer harness for the /model validator
 * (lua/sandbox/providers/openai_chat.lua, spec/broker.md 9.1-9.5), run in a real Lua
 * state with the strict JSON decoder in front of it, as the broker does.
 *
 * Invariants checked on every input that decodes to an object:
 *  - rebuild never raises (a refusal is nil, "text/function model payload
 *    required", nothing else);
 *  - an accepted body encodes to JSON whose members are exactly model,
 *    messages, [tools,] stream, max_tokens in that order, with the forced
 *    model and max_tokens, and stream false;
 *  - rebuilding the forwarded body again accepts it and gives the same bytes
 *    (the rebuild is idempotent: nothing the guest sent survives that a
 *    second pass would drop).
 * Any violation aborts. The harness runs from the repository root (scripts/
 * fuzz.sh does), where lua/ holds the host Lua tree.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>

#include "state.h"

static const char *const CHECK =
  "local json = require 'sandbox.json'\n"
  "local mp = require 'sandbox.providers.openai_chat'\n"
  "return function(text)\n"
  "  local body = json.decode(text)\n"
  "  if json.kind(body) ~= 'object' then return true end\n"
  "  local ok, forced, err = pcall(mp.rebuild, body, 'fuzz-model', 4096)\n"
  "  if not ok then return false, 'rebuild raised: ' .. tostring(forced) end\n"
  "  if forced == nil then\n"
  "    return err == mp.REFUSED, 'unexpected refusal text'\n"
  "  end\n"
  "  local out = json.encode(forced)\n"
  "  if not out then return false, 'accepted body does not encode' end\n"
  "  local keys = table.concat(json.keys(forced), ',')\n"
  "  if keys ~= 'model,messages,stream,max_tokens' and keys ~= 'model,messages,tools,stream,max_tokens' then\n"
  "    return false, 'forced members: ' .. keys\n"
  "  end\n"
  "  if forced.model ~= 'fuzz-model' or forced.max_tokens ~= 4096 or forced.stream ~= false then\n"
  "    return false, 'forced values changed'\n"
  "  end\n"
  "  local again = mp.rebuild(json.decode(out), 'fuzz-model', 4096)\n"
  "  if again == nil then return false, 'forwarded body refused on a second pass' end\n"
  "  if json.encode(again) ~= out then return false, 'rebuild is not idempotent' end\n"
  "  return true\n"
  "end\n";

static lua_State *L;
static int check_ref;

static void setup(void) {
  L = luaL_newstate();
  if (L == NULL) abort();
  sbx__state_open(L, "lua");                      /* the host state, GC mode included */
  if (luaL_loadstring(L, CHECK) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
    fprintf(stderr, "model_fuzz: setup failed (run from the repository root): %s\n", lua_tostring(L, -1));
    abort();
  }
  check_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (L == NULL) setup();
  if (size > 262144) return 0;                     /* the broker's body cap */
  lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
    fprintf(stderr, "model_fuzz: check raised: %s\n", lua_tostring(L, -1));
    abort();
  }
  if (!lua_toboolean(L, -2)) {
    fprintf(stderr, "model_fuzz: invariant broken: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
