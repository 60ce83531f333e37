/* upstream.c: placeholder until its owner lands it. */
#include "sbx_internal.h"
void sbx__open_upstream(lua_State *L) { (void)L; }
