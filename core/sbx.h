/*
 * sbx.h: the public C interface of libsbx (pi-roundtable-sandbox engine).
 *
 * Error convention: functions return 0 or a negative code, either -errno
 * (-ENOMEM, -ETIMEDOUT, ...) or one of the SBX_E* codes below.
 */
#ifndef SBX_H
#define SBX_H

#include <stddef.h>

#define SBX_EINVAL     (-1001)  /* malformed input */
#define SBX_EDEPTH     (-1002)  /* nesting over SBX_MAX_JSON_DEPTH */
#define SBX_ETOOBIG    (-1003)  /* a size bound was passed */
#define SBX_EREFLECT   (-1004)  /* the credential reflection filter hit */
#define SBX_EUTF8      (-1005)  /* invalid UTF-8 */

/* The engine's release, "MAJOR.MINOR.PATCH" (the project's VERSION file). */
const char *sbx_version(void);

/* Short, payload-free name of an SBX_E* or -errno code. */
const char *sbx_strerror(int code);

/*
 * Credential reflection filter (reflect.c): the six encodings of one
 * credential (raw, URI component, base64, base64url, lower hex, upper hex).
 * A filter owns copies of its needles; sbx_reflect_free releases them.
 */
typedef struct sbx_reflect sbx_reflect_t;
int sbx_reflect_new(const char *key, size_t len, sbx_reflect_t **out);
/* 1 when any needle occurs in buf[0..len), else 0. */
int sbx_reflect_hit(const sbx_reflect_t *f, const char *buf, size_t len);
void sbx_reflect_free(sbx_reflect_t *f);

#endif
