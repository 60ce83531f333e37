/*
 * sbx_scrub.h: scrub_diagnostic, a failure reason that is safe to deliver into
 * a guest channel (shared/spec/fetch-and-delegation.md section 2). Plain C,
 * no Lua: the Lua binding (core.scrub_diagnostic) and the libFuzzer harness
 * (fuzz/scrub_fuzz.c) both call this.
 */
#ifndef SBX_SCRUB_H
#define SBX_SCRUB_H

#include <stddef.h>

#define SBX_SCRUB_DEFAULT_MAX 600
#define SBX_SCRUB_E_LIMIT (-1)   /* "Invalid diagnostic limit" */

/*
 * text: len bytes (any bytes; invalid UTF-8 becomes U+FFFD, one per byte).
 * max: an integral value >= 1, or +INFINITY for no bound; anything else (NaN,
 * fractions, < 1, -inf) -> SBX_SCRUB_E_LIMIT. An integral max above 2^53 is
 * treated as +INFINITY: the result is the same for every max that is at least
 * the text's code point count, and no text is that long.
 * On 0: *out = malloc'ed NUL-terminated UTF-8 (free with free() or sbx_free),
 * *out_len its length; it holds no NUL. Other failures: -ENOMEM (*out NULL).
 * Linear time: a fixed number of forward scans, no backtracking.
 */
int sbx_scrub_diagnostic(const char *text, size_t len, double max, char **out, size_t *out_len);

/* "Invalid diagnostic limit" for SBX_SCRUB_E_LIMIT, "Out of memory" for -ENOMEM. */
const char *sbx_scrub_strerror(int code);

#endif
