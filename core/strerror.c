/*
 * strerror.c: sbx_strerror, the short payload-free name of an SBX_E* or
 * -errno code. Its own file because the worker compiles it too, with
 * core/json.c and core/reflect.c, and nothing else of the core.
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
