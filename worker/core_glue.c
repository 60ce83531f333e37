/*
 * core_glue.c: the one core symbol that core/json.c and core/reflect.c need
 * beyond Lua and libc: sbx_strerror (defined in core/core.c, which the worker
 * does not compile because it pulls in libuv, curl and the listener). Only
 * reflect.c's reflect_filter constructor calls it, and the worker never
 * exposes that; the messages match core/core.c's.
 */
#include <errno.h>
#include <string.h>

#include "sbx.h"

const char *sbx_strerror(int code) {
  switch (code) {
  case 0: return "ok";
  case SBX_EINVAL: return "invalid input";
  case SBX_EDEPTH: return "nesting too deep";
  case SBX_ETOOBIG: return "too large";
  case SBX_EREFLECT: return "credential reflection";
  case SBX_EUTF8: return "invalid UTF-8";
  case -ENOMEM: return "out of memory";
  case -ETIMEDOUT: return "timed out";
  default: return code < 0 && code > -4096 ? strerror(-code) : "error";
  }
}
