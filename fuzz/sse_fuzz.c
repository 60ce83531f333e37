/*
 * sse_fuzz.c: libFuzzer harness for the SSE event cutter (core/sse_watch.c,
 * spec/rich-mode.md 11.5).
 *
 * Input: byte 0 seeds the chunking (chunk lengths 0..63, or, for odd seeds,
 * up to 4 KiB so events near the 64 KiB bound are reached quickly), byte 1
 * picks a padding run that, when non-zero, grows the first data line past
 * the bound; the rest is the stream. The events the cutter yields for the
 * chunked stream must equal, one for one, those of a reference written here
 * that reads the whole stream at once: events between blank lines (empty or
 * a lone CR, between LFs), an event whose bytes before its blank line pass
 * the bound dropped, the unfinished tail never reported; names and data as
 * the header says. Memory stays bounded (ASan) whatever the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sse_watch.h"
#include "bounds.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)
#define MAXEV 4096

typedef struct {
  int has_name, has_data;
  size_t nlen, dlen;
  char *name, *data;
} ref_event_t;

static ref_event_t want[MAXEV];
static size_t nwant;

static const char *ref_field(const char *l, size_t n, const char *name, size_t *vl) {
  size_t k = strlen(name);
  if (n < k || memcmp(l, name, k) != 0) return NULL;
  if (n == k) { *vl = 0; return l + n; }
  if (l[k] != ':') return NULL;
  l += k + 1; n -= k + 1;
  if (n && l[0] == ' ') { l++; n--; }
  *vl = n;
  return l;
}

static void ref_event(const char *c, size_t n) {
  ref_event_t *e;
  size_t i = 0;
  if (nwant == MAXEV) return;
  e = &want[nwant++];
  memset(e, 0, sizeof *e);
  e->data = malloc(n + 1);
  CHECK(e->data != NULL);
  while (i < n) {
    size_t j = i, ll, vl;
    const char *v;
    while (j < n && c[j] != '\n') j++;
    ll = j - i;
    if (ll && c[i + ll - 1] == '\r') ll--;
    if ((v = ref_field(c + i, ll, "event", &vl)) != NULL) {
      e->has_name = 1;
      e->name = (char *)v;
      e->nlen = vl;
    } else if ((v = ref_field(c + i, ll, "data", &vl)) != NULL) {
      if (e->has_data) e->data[e->dlen++] = '\n';
      memcpy(e->data + e->dlen, v, vl);
      e->dlen += vl;
      e->has_data = 1;
    }
    i = j + 1;
  }
}

/* The whole stream at once. */
static void reference(const char *s, size_t n) {
  size_t start = 0, i = 0;
  nwant = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && s[j] != '\n') j++;
    if (j == n) break;                           /* unfinished line */
    if (j == i || (j == i + 1 && s[i] == '\r')) {
      size_t content = i - start;
      if (content > 0 && content <= SBX_SSE_MAX_EVENT_BYTES) ref_event(s + start, content);
      start = j + 1;
    }
    i = j + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sbx__sse_t w;
  size_t pos = 0, got = 0, n, pad;
  unsigned seed;
  char *stream;
  if (size < 2) return 0;
  seed = data[0] * 2654435761u + 7;
  pad = data[1] ? (size_t)SBX_SSE_MAX_EVENT_BYTES - 64 + data[1] : 0;
  /* stream = "data: " + pad x 'p' + the rest */
  n = (pad ? 6 + pad : 0) + size - 2;
  stream = malloc(n + 1);
  CHECK(stream != NULL);
  if (pad) {
    memcpy(stream, "data: ", 6);
    memset(stream + 6, 'p', pad);
  }
  memcpy(stream + (pad ? 6 + pad : 0), data + 2, size - 2);
  reference(stream, n);
  sbx__sse_init(&w);
  while (pos < n) {
    size_t len, used;
    sbx__sse_event_t ev;
    int rc;
    seed = seed * 1103515245u + 12345u;
    len = (data[0] & 1) ? (seed >> 12) % 4097 : (seed >> 16) % 64;
    if (len > n - pos) len = n - pos;
    {
      char *chunk = malloc(len ? len : 1);     /* exactly the chunk: ASan sees overreads */
      size_t off = 0;
      CHECK(chunk != NULL);
      memcpy(chunk, stream + pos, len);
      for (;;) {
        rc = sbx__sse_feed(&w, chunk + off, len - off, &used, &ev);
        CHECK(rc >= 0);
        CHECK(used <= len - off);
        off += used;
        if (rc == 0) { CHECK(off == len); break; }
        CHECK(got < nwant);
        CHECK(ev.raw_len > 0 && ev.raw_len <= SBX_SSE_MAX_EVENT_BYTES);
        CHECK(sbx__sse_parse(&w, &ev) == 0);
        CHECK((ev.name != NULL) == want[got].has_name);
        if (ev.name) CHECK(ev.name_len == want[got].nlen && memcmp(ev.name, want[got].name, ev.name_len) == 0);
        CHECK(ev.has_data == want[got].has_data);
        CHECK(ev.data_len == want[got].dlen && memcmp(ev.data, want[got].data, ev.data_len) == 0);
        CHECK(ev.data_len <= SBX_SSE_MAX_EVENT_BYTES);
        got++;
      }
      free(chunk);
    }
    pos += len;
  }
  CHECK(got == nwant || nwant == MAXEV);
  sbx__sse_free(&w);
  for (size_t i = 0; i < nwant; i++) free(want[i].data);
  free(stream);
  return 0;
}
