/*
 * reflect.h: the pure reflection matcher (reflect.c) as the core's own files
 * see it. Its calls, sbx_reflect_new/hit/free/carry, are public (sbx.h);
 * this adds the name of the userdata its Lua binding (reflect_lua.c)
 * registers, so a function taking a filter argument (json.c's
 * core.json_decode, reflect_stream.c) reads it with sbx__box_check without
 * including the binding. No Lua here.
 */
#ifndef SBX_REFLECT_H
#define SBX_REFLECT_H

#include "sbx.h"

#define SBX_REFLECT_MT "sbx.reflect"

#endif
