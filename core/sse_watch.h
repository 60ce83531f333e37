/*
 * sse_watch.h: the SSE event cutter behind core.sse_watch (sse_watch.c,
 * spec/rich-mode.md 11.5): a side parser of an upstream event stream that
 * yields complete events (the `event:` name and the `data:` lines joined)
 * with bounded memory. Pure: no I/O, no Lua; fuzzed by fuzz/sse_fuzz.c.
 *
 * Rules: events are cut at blank lines (`\r?\n\r?\n`: a line, between LFs,
 * that is empty or a lone CR); within an event, lines are split at LF and
 * lose one trailing CR; `event:` sets the name and `data:` adds a data line,
 * each without one leading space after the colon (a line that is exactly
 * `event` or `data` gives an empty value); other lines are ignored. An event
 * whose bytes before its blank line exceed SBX_SSE_MAX_EVENT_BYTES is thrown
 * away as soon as it does, up to its blank line.
 */
#ifndef SBX_SSE_WATCH_H
#define SBX_SSE_WATCH_H

#include <stddef.h>

typedef struct sbx__sse {
  char *buf;               /* an event that spans chunks: its bytes so far */
  size_t len;
  size_t elen;             /* bytes of the current event so far, wherever they are */
  char *data;              /* the last parsed event's joined data */
  size_t line_len;         /* bytes of the current line so far (LF excluded) */
  int line_cr;             /* the current line is exactly one CR so far */
  int discarding;          /* the event outgrew the bound: skip to its end */
  int consumed;            /* the last event was handed out: reset first */
} sbx__sse_t;

typedef struct sbx__sse_event {
  const char *raw;         /* the event's bytes before its blank line */
  size_t raw_len;
  const char *name;        /* sbx__sse_parse: NULL when there is no `event:` line */
  size_t name_len;
  const char *data;        /* sbx__sse_parse: the data lines joined with LF */
  size_t data_len;
  int has_data;            /* at least one `data:` line */
} sbx__sse_event_t;

void sbx__sse_init(sbx__sse_t *w);
void sbx__sse_free(sbx__sse_t *w);

/*
 * Feeds p[0..n). Returns 1 when an event completed: ev->raw points into p
 * (an event inside this chunk: no copy) or into w (one that spans chunks),
 * valid until the next call, and *used says how many bytes were consumed
 * (feed the rest again); 0 when all n bytes were consumed without a further
 * event; -ENOMEM when out of memory.
 */
int sbx__sse_feed(sbx__sse_t *w, const char *p, size_t n, size_t *used, sbx__sse_event_t *ev);

/* Fills ev->name and ev->data from ev->raw (data joined in w). 0 or -ENOMEM. */
int sbx__sse_parse(sbx__sse_t *w, sbx__sse_event_t *ev);

#endif
