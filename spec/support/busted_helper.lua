-- busted_helper.lua: busted's helper (.busted). The specs run under the
-- collector every host state of the product runs with (core/state.c sets it
-- in C for the sbx CLI, the embedding engine and the fuzzers:
-- lua_gc(L, LUA_GCGEN)), so what they exercise is what runs. busted's own
-- interpreter is not such a state, hence this line.
collectgarbage("generational")
