/*
 * json_shape_fuzz.c: libFuzzer harness for the bounded, shape-first decoder
 * (core/json_shape.c) against the full decoder (core/json.c). Per input:
 *  - with no shape and no budget to speak of, it accepts exactly what the
 *    full decoder accepts (same refusal reason) and builds the same value;
 *  - its cost estimate is never below what the full decoder really
 *    allocates (Lua's own count, the collector stopped), give or take the
 *    string table's and the stack's own growth (16 KiB);
 *  - with the budget at the estimate it accepts, one byte below it refuses
 *    ("too large") without building anything;
 *  - with a dropping shape (one that refers to itself through an array,
 *    and a keeping object in between) it builds the full value minus the
 *    members the shape drops, in their order, and its estimate of what it
 *    builds stays above what it allocates; with a refusing shape it accepts
 *    exactly the values whose shaped objects hold listed members only and
 *    whose shaped array is within its max (a value a repeated member
 *    replaced is judged too: exactness is checked on bodies without).
 * The checks are a Lua function (below) run in protected mode; any
 * disagreement raises, and the harness aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <lua.h>
#include <lualib.h>
#include <lauxlib.h>

#include "parts.h"

static lua_State *fuzz_L;

static const char check_src[] =
  "local core = ...\n"
  "local enc, omt, order = core.json_encode, core.json_object_mt, core.json_order\n"
  "local BIG = 1 << 40\n"
  "local SLACK = 16384   -- the string table's and the stack's own growth, per call, not per value\n"
  "local DROP = { unknown = 'drop', members = { a = true, b = { unknown = 'drop', members = { c = true } },\n"
  "  k = { members = { d = { unknown = 'drop', members = { e = true } } }, unknown = 'keep' } } }\n"
  "DROP.members.l = { items = DROP }   -- refers to itself, like content blocks in content blocks\n"
  "local REFUSE = { members = { a = true, b = { members = { c = true } }, l = { max = 2, items = { members = { a = true } } } } }\n"
  "local filtered\n"
  "local function filtered_value(val, shape)\n"
  "  if type(shape) ~= 'table' then return val end\n"
  "  local mt = getmetatable(val)\n"
  "  if mt == omt and shape.unknown == 'drop' and shape.members then return filtered(val, shape.members) end\n"
  "  if mt == core.json_array_mt and type(shape.items) == 'table' then\n"
  "    local out = setmetatable({}, core.json_array_mt)\n"
  "    for i = 1, #val do out[i] = filtered_value(val[i], shape.items) end\n"
  "    return out\n"
  "  end\n"
  "  return val\n"
  "end\n"
  "function filtered(o, keep)\n"
  "  local out, names = setmetatable({}, omt), {}\n"
  "  for _, k in ipairs(order[o] or {}) do\n"
  "    local sub, val = keep[k], o[k]\n"
  "    if sub ~= nil and val ~= nil then\n"
  "      out[k] = filtered_value(val, sub); names[#names + 1] = k\n"
  "    end\n"
  "  end\n"
  "  order[out] = names\n"
  "  return out\n"
  "end\n"
  "local function only(o, set)\n"
  "  if getmetatable(o) ~= omt then return true end\n"
  "  for k in pairs(o) do if not set[k] then return false end end\n"
  "  return true\n"
  "end\n"
  "local function refuse_ok(v)\n"
  "  if getmetatable(v) ~= omt then return true end\n"
  "  if not only(v, { a = true, b = true, l = true }) then return false end\n"
  "  if not only(v.b, { c = true }) then return false end\n"
  "  local l = v.l\n"
  "  if type(l) == 'table' and getmetatable(l) == core.json_array_mt then\n"
  "    if #l > 2 then return false end\n"
  "    for i = 1, #l do if not only(l[i], { a = true }) then return false end end\n"
  "  end\n"
  "  return true\n"
  "end\n"
  "return function(s)\n"
  "  local full, ferr = core.json_decode(s, nil, { duplicates = 'last' })\n"
  "  local v, why = core.json_decode_bounded(s, { budget = BIG, duplicates = 'last' })\n"
  "  if (full == nil) ~= (v == nil) then error('accepts differently: ' .. tostring(ferr) .. ' / ' .. tostring(why)) end\n"
  "  if full == nil then\n"
  "    if ferr ~= why then error('refuses differently: ' .. tostring(ferr) .. ' / ' .. tostring(why)) end\n"
  "    return\n"
  "  end\n"
  "  if enc(full) ~= enc(v) then error('builds another value') end\n"
  "  local cost = core.json_cost(s)\n"
  "  collectgarbage(); collectgarbage('stop')\n"
  "  local before = collectgarbage('count')\n"
  "  local again = core.json_decode(s, nil, { duplicates = 'last' })\n"
  "  local used = (collectgarbage('count') - before) * 1024\n"
  "  collectgarbage('restart')\n"
  "  if again == nil or used > cost + SLACK then error(('estimate %d below the allocation %d'):format(cost, used)) end\n"
  "  if core.json_decode_bounded(s, { budget = cost, duplicates = 'last' }) == nil then error('refused at its estimate') end\n"
  "  if cost > 0 then\n"
  "    local r, w = core.json_decode_bounded(s, { budget = cost - 1, duplicates = 'last' })\n"
  "    if r ~= nil or w ~= 'too large' then error('accepted below its estimate') end\n"
  "  end\n"
  "  local d = core.json_decode_bounded(s, { budget = BIG, duplicates = 'last', shape = DROP })\n"
  "  if d == nil then error('the dropping shape refused') end\n"
  "  if enc(d) ~= enc(filtered_value(full, DROP)) then error('the dropping shape built another value') end\n"
  "  local dcost = core.json_cost(s, DROP)\n"
  "  collectgarbage(); collectgarbage('stop')\n"
  "  before = collectgarbage('count')\n"
  "  d = core.json_decode_bounded(s, { budget = BIG, duplicates = 'last', shape = DROP })\n"
  "  used = (collectgarbage('count') - before) * 1024\n"
  "  collectgarbage('restart')\n"
  "  if used > dcost + SLACK then error(('dropping estimate %d below the allocation %d'):format(dcost, used)) end\n"
  "  local r = core.json_decode_bounded(s, { budget = BIG, duplicates = 'last', shape = REFUSE })\n"
  "  -- a value a repeated member replaced was judged too (refused while scanning): the\n"
  "  -- acceptance is exact only for a body without repeated members\n"
  "  local unique = core.json_decode(s) ~= nil\n"
  "  if r ~= nil and not refuse_ok(full) then error('the refusing shape accepted an unknown member') end\n"
  "  if unique and r == nil and refuse_ok(full) then error('the refusing shape refused a shaped body') end\n"
  "  if r ~= nil and enc(r) ~= enc(full) then error('the refusing shape built another value') end\n"
  "end\n";

static void die(const char *what) {
  fprintf(stderr, "json_shape_fuzz: %s\n", what);
  abort();
}

static void setup(void) {
  lua_State *L = luaL_newstate();
  if (L == NULL) die("no lua state");
  luaL_openlibs(L);
  luaL_requiref(L, "sandbox.core", luaopen_sandbox_core, 0);    /* 1 */
  if (luaL_loadbuffer(L, check_src, sizeof check_src - 1, "=json_shape_check") != LUA_OK) die(lua_tostring(L, -1));
  lua_pushvalue(L, 1);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) die(lua_tostring(L, -1));   /* 2: check */
  fuzz_L = L;
}

static int traceback(lua_State *L) {
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L;
  if (fuzz_L == NULL) setup();
  L = fuzz_L;
  lua_settop(L, 2);
  lua_pushcfunction(L, traceback);                               /* 3 */
  lua_pushvalue(L, 2);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 0, 3) != LUA_OK) {
    fprintf(stderr, "json_shape_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 2);
  return 0;
}
