/*
 * reflect_bench.c: throughput of the credential reflection filter
 * (core/reflect.c) against a single glibc memmem() scan.
 *
 * Builds a realistic ~1 MiB chat-completion-like JSON response (choices
 * with long and short content, tool calls with JSON-in-string arguments,
 * logprobs with many short token strings; some strings hold "\n" escapes)
 * and records where every string, member names included, lies. Then, for
 * several keys:
 *   (a) the filter as json.c applies it while decoding a reply: one
 *       sbx_reflect_hit over the whole JSON text (a prefilter: with no match
 *       there, no string without escapes can hold a needle, since its
 *       decoded bytes are the bytes between its quotes) plus one over the
 *       decoded bytes of each escaped string. When the text does match
 *       somewhere, json.c scans every string: column (c) is that cost;
 *   (b) one memmem() of the raw key over the whole JSON text;
 *   (c) for reference, sbx_reflect_hit called on every decoded string;
 * each repeated ITERATIONS times; prints best and median MB/s (all over the
 * size of the JSON text) and the ratio (a)/(b). The target is a ratio of at
 * least 1/3. Usage: reflect_bench [iterations]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/*
 * The three calls of sbx.h this program needs. sbx.h pulls in <lua.h>,
 * whose <limits.h> resolves to core/limits.h under the Makefile's -Icore;
 * declaring them here keeps the bench independent of that.
 */
typedef struct sbx_reflect sbx_reflect_t;
int sbx_reflect_new(const char *key, size_t len, sbx_reflect_t **out);
int sbx_reflect_hit(const sbx_reflect_t *f, const char *buf, size_t len);
void sbx_reflect_free(sbx_reflect_t *f);

#define DOC_TARGET   (1024 * 1024)
#define DOC_CAP      (DOC_TARGET + 256 * 1024)
#define MAX_STRINGS  200000
#define DEFAULT_ITERATIONS 200

typedef struct {
  char *buf;
  size_t len;
  size_t (*str)[2];        /* offset, length of each string (raw bytes) */
  unsigned char *escaped;  /* 1 when that string holds an escape */
  size_t (*dec)[2];        /* escaped strings: offset, length in decoded */
  char *decoded;           /* decoded bytes of the escaped strings */
  size_t nstr;
  uint64_t rng;
} doc_t;

static uint32_t rnd(doc_t *d) {
  d->rng ^= d->rng << 13;
  d->rng ^= d->rng >> 7;
  d->rng ^= d->rng << 17;
  return (uint32_t)(d->rng >> 11);
}

static void put(doc_t *d, const char *s) {
  size_t n = strlen(s);
  if (d->len + n >= DOC_CAP) {
    fprintf(stderr, "reflect_bench: document overflow\n");
    exit(1);
  }
  memcpy(d->buf + d->len, s, n);
  d->len += n;
}

static const char *const words[] = {
  "the", "model", "returns", "a", "response", "with", "tool", "calls", "and", "content",
  "function", "arguments", "query", "search", "result", "file", "path", "line", "error",
  "value", "config", "token", "request", "server", "client", "reply", "JSON", "string",
  "number", "array", "object", "Lua", "C", "buffer", "memory", "filter", "credential",
  "upstream", "broker", "socket", "deadline", "budget", "schema", "message", "assistant",
  "user", "system", "0", "1", "42", "2024", "3.14", "x", "y", "i", "is", "of", "to", "in",
  "for", "on", "that", "this", "it", "be", "are", "was", "not", "or", "by", "from", "at",
  "as", "an", "but", "if", "then", "else", "return", "local", "end", "print", "table",
};

/* A string value of about n bytes of words and punctuation; some hold the
 * escape "\\n" (the only escape the document uses). */
static void put_text(doc_t *d, size_t n) {
  size_t start;
  unsigned char esc = 0;
  if (d->nstr >= MAX_STRINGS) n = 0;
  put(d, "\"");
  start = d->len;
  while (d->len - start < n) {
    const char *w = words[rnd(d) % (sizeof words / sizeof words[0])];
    put(d, w);
    switch (rnd(d) % 16) {
    case 0: put(d, ". "); break;
    case 1: put(d, ", "); break;
    case 2: put(d, ": "); break;
    case 3: put(d, " - "); break;
    case 4: if (rnd(d) % 4 == 0) { put(d, "\\n"); esc = 1; break; } /* fall through */
    default: put(d, " ");
    }
  }
  if (d->nstr < MAX_STRINGS) {
    d->str[d->nstr][0] = start;
    d->str[d->nstr][1] = d->len - start;
    d->escaped[d->nstr] = esc;
    d->nstr++;
  }
  put(d, "\"");
}

/* A member name (recorded as a string) followed by ':'. */
static void put_key(doc_t *d, const char *k) {
  put(d, "\"");
  if (d->nstr < MAX_STRINGS) {
    d->str[d->nstr][0] = d->len;
    d->str[d->nstr][1] = strlen(k);
    d->escaped[d->nstr] = 0;
    d->nstr++;
  }
  put(d, k);
  put(d, "\":");
}

static void put_num(doc_t *d, unsigned v) {
  char tmp[16];
  snprintf(tmp, sizeof tmp, "%u", v);
  put(d, tmp);
}

/* One choice; with logprobs, a list of short token strings per choice. */
static void put_choice(doc_t *d, unsigned idx, int logprobs) {
  unsigned ntools = rnd(d) % 4, ntok = logprobs ? 20 + rnd(d) % 200 : 0;
  put(d, "{");
  put_key(d, "index"); put_num(d, idx); put(d, ",");
  put_key(d, "message"); put(d, "{");
  put_key(d, "role"); put_text(d, 9); put(d, ",");
  put_key(d, "content");
  put_text(d, (rnd(d) % 4 == 0) ? 2000 + rnd(d) % 12000 : 20 + rnd(d) % 600);
  put(d, ",");
  put_key(d, "tool_calls"); put(d, "[");
  for (unsigned t = 0; t < ntools; t++) {
    if (t) put(d, ",");
    put(d, "{");
    put_key(d, "id"); put_text(d, 24); put(d, ",");
    put_key(d, "type"); put_text(d, 8); put(d, ",");
    put_key(d, "function"); put(d, "{");
    put_key(d, "name"); put_text(d, 6 + rnd(d) % 20); put(d, ",");
    put_key(d, "arguments");
    put_text(d, logprobs ? 30 + rnd(d) % 400 : 30 + rnd(d) % 3000);
    put(d, "}}");
  }
  put(d, "]},");
  put_key(d, "logprobs");
  if (!logprobs) {
    put(d, "null,");
  } else {
    put(d, "{");
    put_key(d, "content"); put(d, "[");
    for (unsigned t = 0; t < ntok; t++) {
      if (t) put(d, ",");
      put(d, "{");
      put_key(d, "token"); put_text(d, 1 + rnd(d) % 8); put(d, ",");
      put_key(d, "logprob"); put(d, "-0.");
      put_num(d, rnd(d) % 100000);
      put(d, "}");
    }
    put(d, "]},");
  }
  put_key(d, "finish_reason"); put_text(d, 4);
  put(d, "}");
}

static void build_doc(doc_t *d, int logprobs) {
  unsigned idx = 0;
  d->buf = malloc(DOC_CAP);
  d->str = malloc(MAX_STRINGS * sizeof *d->str);
  d->escaped = malloc(MAX_STRINGS);
  if (d->buf == NULL || d->str == NULL || d->escaped == NULL) {
    fprintf(stderr, "reflect_bench: out of memory\n");
    exit(1);
  }
  d->len = d->nstr = 0;
  d->rng = 0x9E3779B97F4A7C15ULL;
  put(d, "{");
  put_key(d, "id"); put_text(d, 28); put(d, ",");
  put_key(d, "object"); put_text(d, 15); put(d, ",");
  put_key(d, "created"); put_num(d, 1733000000); put(d, ",");
  put_key(d, "model"); put_text(d, 20); put(d, ",");
  put_key(d, "choices"); put(d, "[");
  while (d->len < DOC_TARGET - 20 * 1024) {
    if (idx) put(d, ",");
    put_choice(d, idx++, logprobs);
  }
  put(d, "],");
  put_key(d, "usage"); put(d, "{");
  put_key(d, "prompt_tokens"); put_num(d, 1234); put(d, ",");
  put_key(d, "completion_tokens"); put_num(d, 5678);
  put(d, "}}");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void print_machine(void) {
  char line[512];
  FILE *fp = fopen("/proc/cpuinfo", "r");
  const char *model = "unknown";
  static char model_buf[256];
  if (fp != NULL) {
    while (fgets(line, sizeof line, fp) != NULL) {
      if (strncmp(line, "model name", 10) == 0) {
        char *c = strchr(line, ':');
        if (c != NULL) {
          snprintf(model_buf, sizeof model_buf, "%s", c + 2);
          model_buf[strcspn(model_buf, "\n")] = '\0';
          model = model_buf;
        }
        break;
      }
    }
    fclose(fp);
  }
  printf("machine: nproc=%ld cpu=\"%s\"\n", sysconf(_SC_NPROCESSORS_ONLN), model);
}

static volatile size_t sink;

/* Times fn ITERATIONS times; fills best and median seconds. */
typedef size_t (*run_fn)(const doc_t *d, const sbx_reflect_t *f, const char *key, size_t klen);

/* Decodes the string at i into out (the document's only escape is \\n). */
static size_t unescape(const doc_t *d, size_t i, char *out) {
  const char *s = d->buf + d->str[i][0];
  size_t n = 0, len = d->str[i][1];
  for (size_t j = 0; j < len; j++) {
    if (s[j] == '\\' && j + 1 < len && s[j + 1] == 'n') {
      out[n++] = '\n';
      j++;
    } else {
      out[n++] = s[j];
    }
  }
  return n;
}

/* Decodes every escaped string once, outside the timed runs: unescaping is
 * the decoder's work, paid with or without a filter. */
static void decode_escaped(doc_t *d) {
  size_t off = 0;
  d->decoded = malloc(d->len);
  d->dec = malloc(d->nstr * sizeof *d->dec);
  if (d->decoded == NULL || d->dec == NULL) exit(1);
  for (size_t i = 0; i < d->nstr; i++) {
    d->dec[i][0] = off;
    d->dec[i][1] = d->escaped[i] ? unescape(d, i, d->decoded + off) : 0;
    off += d->dec[i][1];
  }
}

/* (a) As json.c does while decoding: the whole text, then the decoded bytes
 * of each escaped string. */
static size_t run_filter(const doc_t *d, const sbx_reflect_t *f, const char *key, size_t klen) {
  size_t hits = (size_t)sbx_reflect_hit(f, d->buf, d->len);
  (void)key;
  (void)klen;
  for (size_t i = 0; i < d->nstr; i++) {
    if (d->escaped[i]) hits += (size_t)sbx_reflect_hit(f, d->decoded + d->dec[i][0], d->dec[i][1]);
  }
  return hits;
}

/* (c) Every decoded string on its own. */
static size_t run_each(const doc_t *d, const sbx_reflect_t *f, const char *key, size_t klen) {
  size_t hits = 0;
  (void)key;
  (void)klen;
  for (size_t i = 0; i < d->nstr; i++) {
    if (d->escaped[i])
      hits += (size_t)sbx_reflect_hit(f, d->decoded + d->dec[i][0], d->dec[i][1]);
    else
      hits += (size_t)sbx_reflect_hit(f, d->buf + d->str[i][0], d->str[i][1]);
  }
  return hits;
}

/* The same walk calling an empty out-of-line function: the per-string floor. */
__attribute__((noinline)) static int empty_hit(const sbx_reflect_t *f, const char *buf, size_t len) {
  __asm__ volatile("" : : "r"(f), "r"(buf), "r"(len));
  return 0;
}

static size_t run_empty(const doc_t *d, const sbx_reflect_t *f, const char *key, size_t klen) {
  size_t hits = 0;
  (void)key;
  (void)klen;
  for (size_t i = 0; i < d->nstr; i++)
    hits += (size_t)empty_hit(f, d->buf + d->str[i][0], d->str[i][1]);
  return hits;
}

static size_t run_memmem(const doc_t *d, const sbx_reflect_t *f, const char *key, size_t klen) {
  (void)f;
  return memmem(d->buf, d->len, key, klen) != NULL;
}

static void measure(run_fn fn, const doc_t *d, const sbx_reflect_t *f, const char *key,
                    size_t klen, int iters, double *best, double *median) {
  double *t = malloc((size_t)iters * sizeof *t);
  if (t == NULL) exit(1);
  for (int i = 0; i < 3; i++) sink += fn(d, f, key, klen);     /* warm up */
  for (int i = 0; i < iters; i++) {
    double t0 = now_s();
    sink += fn(d, f, key, klen);
    t[i] = now_s() - t0;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp_double);
  *best = t[0];
  *median = t[iters / 2];
  free(t);
}

/* Runs every key over one document and prints a row per key. */
static int bench_doc(doc_t *d, const char *name, const char *const *keys, size_t nkeys, int iters) {
  size_t strbytes = 0, nesc = 0;
  for (size_t i = 0; i < d->nstr; i++) {
    strbytes += d->str[i][1];
    nesc += d->escaped[i];
  }
  printf("\n%s: %zu bytes JSON, %zu strings holding %zu bytes, %zu with escapes; %d iterations\n",
         name, d->len, d->nstr, strbytes, nesc, iters);
  printf("  %-34s %9s %9s %9s %9s %6s %9s\n", "key (length)", "filter", "filter", "memmem", "memmem", "ratio", "each str");
  printf("  %-34s %9s %9s %9s %9s %6s %9s\n", "", "best MB/s", "med MB/s", "best MB/s", "med MB/s", "(med)", "med MB/s");
  {
    double eb, em;
    measure(run_empty, d, NULL, "", 0, iters, &eb, &em);
    printf("  %-34s %9.0f %9.0f   (%.0f us: the walk over the strings alone)\n", "floor: empty call per string",
           (double)d->len / 1e6 / eb, (double)d->len / 1e6 / em, em * 1e6);
  }
  for (size_t k = 0; k < nkeys; k++) {
    sbx_reflect_t *f;
    double fb, fm, mb, mm, eb, em, mbytes = (double)d->len / 1e6;
    size_t klen = strlen(keys[k]);
    char label[64];
    if (sbx_reflect_new(keys[k], klen, &f) != 0) {
      fprintf(stderr, "reflect_bench: sbx_reflect_new failed\n");
      return 1;
    }
    if (run_filter(d, f, keys[k], klen) != 0 || run_each(d, f, keys[k], klen) != 0 ||
        run_memmem(d, f, keys[k], klen) != 0) {
      fprintf(stderr, "reflect_bench: the document must not hold the key\n");
      return 1;
    }
    measure(run_filter, d, f, keys[k], klen, iters, &fb, &fm);
    measure(run_memmem, d, f, keys[k], klen, iters, &mb, &mm);
    measure(run_each, d, f, keys[k], klen, iters, &eb, &em);
    snprintf(label, sizeof label, "%.24s%s (%zu)", keys[k], klen > 24 ? "..." : "", klen);
    printf("  %-34s %9.0f %9.0f %9.0f %9.0f %6.2f %9.0f\n", label, mbytes / fb, mbytes / fm,
           mbytes / mb, mbytes / mm, mm / fm, mbytes / em);
    sbx_reflect_free(f);
  }
  return 0;
}

int main(int argc, char **argv) {
  static const char *const keys[] = {
    "real-model-key-0123456789abcdef",
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6lMn9",
    "k/+=y?>tok",
    "0123456789abcdef",
  };
  const size_t nkeys = sizeof keys / sizeof keys[0];
  int iters = argc > 1 ? atoi(argv[1]) : DEFAULT_ITERATIONS;
  doc_t d;
  if (iters < 1) iters = DEFAULT_ITERATIONS;
  print_machine();
  printf("filter: as json.c applies it (whole text once + each escaped string decoded), all needles;\n"
         "memmem: one glibc memmem() of the raw key over the whole JSON text;\n"
         "each str: reference, sbx_reflect_hit on every decoded string;\n"
         "MB/s over the JSON text size; ratio = filter / memmem throughput (target >= 0.33)\n");
  build_doc(&d, 0);
  decode_escaped(&d);
  if (bench_doc(&d, "completion (content and tool calls)", keys, nkeys, iters) != 0) return 1;
  free(d.buf);
  free(d.str);
  free(d.escaped);
  free(d.decoded);
  free(d.dec);
  build_doc(&d, 1);
  decode_escaped(&d);
  if (bench_doc(&d, "completion with logprobs (many short strings)", keys, nkeys, iters) != 0) return 1;
  free(d.buf);
  free(d.str);
  free(d.escaped);
  free(d.decoded);
  free(d.dec);
  return 0;
}
