/* listener.c: placeholder until its owner lands it. */
#include "sbx_internal.h"
void sbx__open_listener(lua_State *L) { (void)L; }
