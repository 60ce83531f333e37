/*
 * fs.c: the worker's file primitives (spec/worker.md sections 7.2, 7.7, 8.3):
 * read_file (never follows a symlink at the last component, regular files
 * only, byte cap), write_file_atomic (remove leftover tmp, exclusive
 * no-follow create at mode 0600, write, fsync, close, rename) and mkdir
 * (missing parents, mode 0700); and what self-healing stores need
 * (shared/spec/hardening.md 8): entry_kind (lstat's type) and move_aside,
 * which renames an invalid store, whatever it is (garbage, a FIFO, a
 * directory, a link: rename moves the entry itself and never follows it),
 * to `<name>.invalid-<UTC time>` and keeps at most `keep` such entries,
 * removing the oldest (a directory without following links, bounded). A
 * leftover `<file>.tmp` that is a directory is moved aside the same way,
 * so a planted tmp cannot fail every later write.
 *
 * Descriptors live in fd boxes (sbxw.c) created before the open, so a Lua
 * error can never leak one. Failures return `nil, message` with short fixed
 * messages; errno details never reach Lua.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbxw.h"
#include "waux.h"

#define READ_MIN_ROOM 1   /* reserve at least this much before each read */
#define ASIDE_TAG ".invalid-"
#define ASIDE_MAX_TRIES 10         /* names tried within one second */
#define ASIDE_MAX_SCAN 100000      /* directory entries looked at when pruning */
#define ASIDE_MAX_FOUND 64         /* set-aside names pruned per call */
#define RM_MAX_DEPTH 16            /* a planted directory removed at most this deep */
#define RM_MAX_ENTRIES 10000       /* ... and with at most this many entries */
#define ASIDE_KEEP 3

static int fail(lua_State *L, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, msg);
  return 2;
}

/* sbxw.read_file(path, max_bytes) -> bytes | nil, msg */
static int l_read_file(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer max = luaL_checkinteger(L, 2);
  struct stat st;
  sbxw__buf_t b;
  int *fd;
  luaL_argcheck(L, max >= 0, 2, "max_bytes must not be negative");
  lua_settop(L, 2);
  fd = sbxw__fd_box(L);                                   /* slot 3 */
  sbxw__buf_init(L, &b);                                  /* slot 4 */
  *fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (*fd < 0) {
    if (errno == ENOENT) return fail(L, "missing");
    if (errno == ELOOP) return fail(L, "not a regular file");
    return fail(L, "io");
  }
  if (fstat(*fd, &st) != 0) {
    sbxw__fd_close(fd);
    return fail(L, "io");
  }
  if (!S_ISREG(st.st_mode)) {
    sbxw__fd_close(fd);
    return fail(L, "not a regular file");
  }
  if ((unsigned long long)st.st_size > (unsigned long long)max) {
    sbxw__fd_close(fd);
    return fail(L, "too large");
  }
  /* The size is known: one buffer of size + 1 (the +1 sees growth). */
  sbxw__buf_reserve(&b, (size_t)st.st_size + 1);
  for (;;) {
    char *at = sbxw__buf_reserve(&b, READ_MIN_ROOM);
    size_t room = b.cap - b.len;
    ssize_t n = read(*fd, at, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      sbxw__fd_close(fd);
      return fail(L, "io");
    }
    if (n == 0) break;
    b.len += (size_t)n;
    if (b.len > (size_t)max) {                           /* grew meanwhile */
      sbxw__fd_close(fd);
      return fail(L, "too large");
    }
  }
  sbxw__fd_close(fd);
  lua_pushlstring(L, b.p, b.len);
  return 1;
}

/* Flushes the directory holding path (the rename), best effort. */
static void sync_parent(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  size_t n;
  int fd;
  if (slash == NULL) {
    strcpy(dir, ".");
  } else {
    n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir) return;
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

/* Removes name under dirfd, whatever it is, never following a link; a
 * directory is emptied first, at most RM_MAX_DEPTH deep and *budget entries
 * in all. 0, or -1 (what is left stays). */
static int remove_entry(int at, const char *name, int depth, long *budget) {
  struct stat st;
  int fd, rc = 0;
  DIR *d;
  if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
  if (--*budget < 0) return -1;
  if (!S_ISDIR(st.st_mode)) return (unlinkat(at, name, 0) == 0 || errno == ENOENT) ? 0 : -1;
  if (depth >= RM_MAX_DEPTH) return -1;
  fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  d = fdopendir(fd);
  if (d == NULL) {
    close(fd);
    return -1;
  }
  for (int pass = 0; pass < 2 && rc == 0; pass++) {
    struct dirent *e;
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      if (remove_entry(dirfd(d), e->d_name, depth + 1, budget) != 0) {
        rc = -1;
        break;
      }
    }
    if (rc == 0 && unlinkat(at, name, AT_REMOVEDIR) == 0) break;
    if (rc == 0 && errno != ENOTEMPTY) rc = -1;
  }
  closedir(d);
  return rc;
}

static int name_desc(const void *a, const void *b) {
  return -strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Keeps the `keep` newest `<base>.invalid-*` entries of dir (their names
 * sort by time), removing the others. Best effort. */
static void prune_aside(const char *dir, const char *base, int keep) {
  char prefix[NAME_MAX + 1];
  char *found[ASIDE_MAX_FOUND];
  size_t plen, n = 0;
  long scanned = 0, budget = RM_MAX_ENTRIES;
  struct dirent *e;
  DIR *d;
  int fd;
  if (snprintf(prefix, sizeof prefix, "%s" ASIDE_TAG, base) >= (int)sizeof prefix) return;
  plen = strlen(prefix);
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  d = fdopendir(fd);
  if (d == NULL) {
    close(fd);
    return;
  }
  while (n < ASIDE_MAX_FOUND && scanned++ < ASIDE_MAX_SCAN && (e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, plen) != 0) continue;
    if ((found[n] = strdup(e->d_name)) != NULL) n++;
  }
  qsort(found, n, sizeof found[0], name_desc);
  for (size_t i = 0; i < n; i++) {
    if ((int)i >= keep) (void)remove_entry(dirfd(d), found[i], 0, &budget);
    free(found[i]);
  }
  closedir(d);
}

/*
 * rename(2) that never replaces an entry: renameat2(RENAME_NOREPLACE), or,
 * where the filesystem refuses the flag with EINVAL (gVisor's gofer mounts,
 * i.e. /workspace under runsc: shared/spec/warm-turns.md 4), an lstat of the
 * target then a plain rename. The gap between the two is no weakness: during
 * its turn only this container writes the workspace (every earlier one is
 * confirmed removed), and the target is an aside name nothing else uses.
 * 0, or -1 with errno (EEXIST when the target exists).
 */
static int rename_noreplace(const char *from, const char *to) {
  struct stat st;
  if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL) return -1;
  if (lstat(to, &st) == 0) {
    errno = EEXIST;
    return -1;
  }
  if (errno != ENOENT) return -1;
  return rename(from, to);
}

/*
 * Renames path to `<path>.invalid-<YYYYMMDDTHHMMSSZ>` (then `-1`, `-2`, ...
 * when taken: rename_noreplace never replaces an entry), then prunes to the
 * `keep` newest. On success *name gets the new last component. 0 or -1.
 */
static int move_aside(const char *path, int keep, char *name, size_t cap) {
  char dir[PATH_MAX], target[PATH_MAX], stamp[32];
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  struct tm tm;
  time_t now = time(NULL);
  if (*base == '\0' || gmtime_r(&now, &tm) == NULL) return -1;
  if (strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm) == 0) return -1;
  if (slash == NULL) strcpy(dir, ".");
  else if (snprintf(dir, sizeof dir, "%.*s", (int)(slash == path ? 1 : slash - path), path) >= (int)sizeof dir)
    return -1;
  for (int i = 0; i < ASIDE_MAX_TRIES; i++) {
    int n = i == 0 ? snprintf(target, sizeof target, "%s" ASIDE_TAG "%s", path, stamp)
                   : snprintf(target, sizeof target, "%s" ASIDE_TAG "%s-%d", path, stamp, i);
    if (n < 0 || (size_t)n >= sizeof target) return -1;
    if (rename_noreplace(path, target) == 0) {
      const char *tbase = strrchr(target, '/');
      size_t tlen;
      tbase = tbase ? tbase + 1 : target;
      tlen = strlen(tbase);
      if (tlen >= cap) tlen = cap - 1;
      memcpy(name, tbase, tlen);
      name[tlen] = '\0';
      prune_aside(dir, base, keep);
      return 0;
    }
    if (errno != EEXIST) return -1;
  }
  return -1;
}

/* sbxw.write_file_atomic(path, bytes) -> true | nil, "write failed" */
static int l_write_file_atomic(lua_State *L) {
  size_t plen, len;
  const char *path = luaL_checklstring(L, 1, &plen);
  const char *bytes = luaL_checklstring(L, 2, &len);
  char tmp[PATH_MAX];
  int *fd, ok = 0;
  luaL_argcheck(L, plen > 0 && strlen(path) == plen, 1, "invalid path");
  lua_settop(L, 2);
  fd = sbxw__fd_box(L);
  if (plen + sizeof ".tmp" > sizeof tmp) return fail(L, "write failed");
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", sizeof ".tmp");
  /* 1. A leftover tmp goes; unlink never follows a symlink. A directory
   * there (planted) is moved aside instead. */
  if (unlink(tmp) != 0 && errno != ENOENT) {
    char moved[NAME_MAX + 1];
    if ((errno != EISDIR && errno != EPERM) || move_aside(tmp, ASIDE_KEEP, moved, sizeof moved) != 0)
      return fail(L, "write failed");
  }
  /* 2. Exclusive, no-follow create. */
  *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
  if (*fd < 0) return fail(L, "write failed");
  /* 3. Write, fsync, close; 4. rename over the file. */
  if (sbxw__write_all(*fd, bytes, len) == 0 && fsync(*fd) == 0) {
    int c = sbxw__fd_close(fd);
    ok = c == 0 && rename(tmp, path) == 0;
  }
  sbxw__fd_close(fd);
  if (!ok) {
    (void)unlink(tmp);
    return fail(L, "write failed");
  }
  sync_parent(path);
  lua_pushboolean(L, 1);
  return 1;
}

/* sbxw.mkdir(path) -> true | nil, "mkdir failed" */
static int l_mkdir(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  char buf[PATH_MAX];
  struct stat st;
  luaL_argcheck(L, plen > 0 && strlen(path) == plen, 1, "invalid path");
  if (plen >= sizeof buf) return fail(L, "mkdir failed");
  memcpy(buf, path, plen + 1);
  for (size_t i = 1; i <= plen; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    if (buf[i - 1] == '/') continue;                     /* "//" */
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
      buf[i] = saved;
      break;                                             /* stat decides */
    }
    buf[i] = saved;
  }
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return fail(L, "mkdir failed");
  lua_pushboolean(L, 1);
  return 1;
}

/* sbxw.entry_kind(path) -> "missing" | "file" | "dir" | "link" | "fifo" |
 * "other" (lstat: a link is never followed) */
static int l_entry_kind(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  const char *k;
  if (lstat(path, &st) != 0) k = errno == ENOENT ? "missing" : "other";
  else if (S_ISREG(st.st_mode)) k = "file";
  else if (S_ISDIR(st.st_mode)) k = "dir";
  else if (S_ISLNK(st.st_mode)) k = "link";
  else if (S_ISFIFO(st.st_mode)) k = "fifo";
  else k = "other";
  lua_pushstring(L, k);
  return 1;
}

/* sbxw.move_aside(path [, keep]) -> the new name | nil, "aside failed" */
static int l_move_aside(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  lua_Integer keep = luaL_optinteger(L, 2, ASIDE_KEEP);
  char name[NAME_MAX + 1];
  luaL_argcheck(L, plen > 0 && strlen(path) == plen, 1, "invalid path");
  luaL_argcheck(L, keep >= 1 && keep <= 16, 2, "keep must be 1 to 16");
  if (move_aside(path, (int)keep, name, sizeof name) != 0) return fail(L, "aside failed");
  lua_pushstring(L, name);
  return 1;
}

void sbxw__open_fs(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"read_file", l_read_file}, {"write_file_atomic", l_write_file_atomic},
    {"mkdir", l_mkdir}, {"entry_kind", l_entry_kind}, {"move_aside", l_move_aside}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
