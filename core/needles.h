/*
 * needles.h: the reflection filter's multi-needle scanner (reflect.c) over
 * any fixed set of at most six needles, for the core's own prefilters (the
 * SSE watch's "could this event spell error", sse_watch.c). Internal.
 */
#ifndef SBX_NEEDLES_H
#define SBX_NEEDLES_H

#include <stddef.h>

#include "sbx.h"

/* A scanner for needles[0..count) (1..6 needles, each 1..4096 bytes);
 * sbx_reflect_hit answers for it and sbx_reflect_free frees it. 0,
 * SBX_EINVAL or -ENOMEM. */
int sbx__needles_new(const char *const *needles, const size_t *lens, size_t count,
                     sbx_reflect_t **out);

#endif
