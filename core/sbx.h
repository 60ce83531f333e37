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
/* The longest of the six forms minus one: what a stream must carry over
 * between chunks so that a form split across them is still seen. */
size_t sbx_reflect_carry(const sbx_reflect_t *f);

/*
 * The bounded reflection stream (reflect_stream.c, spec/rich-mode.md 11.5):
 * chunks of an upstream body pass through the filter; a form split across
 * chunks is caught because the last sbx_reflect_carry(f) bytes of each
 * chunk are held back and scanned again with the next one.
 *
 * push: data = kept .. chunk; a form in data is SBX_EREFLECT; then, when the
 * total of chunk lengths passes max_total, SBX_ETOOBIG; else *out, *out_len
 * is data minus its last carry bytes (valid until the next call) and 0. A
 * failure is sticky. finish: the kept bytes, or the sticky failure. The
 * filter is not owned and must outlive the stream.
 */
typedef struct sbx_reflect_stream sbx_reflect_stream_t;
int sbx_reflect_stream_new(const sbx_reflect_t *f, size_t max_total, sbx_reflect_stream_t **out);
int sbx_reflect_stream_push(sbx_reflect_stream_t *s, const char *chunk, size_t len,
                            const char **out, size_t *out_len);
int sbx_reflect_stream_finish(sbx_reflect_stream_t *s, const char **out, size_t *out_len);
/* Bytes pushed so far (chunk lengths). */
size_t sbx_reflect_stream_total(const sbx_reflect_stream_t *s);
void sbx_reflect_stream_free(sbx_reflect_stream_t *s);

#endif
