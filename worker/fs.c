/*
 * fs.c: the worker's file primitives (spec/worker.md sections 7.2, 7.7, 8.3):
 * read_file (never follows a symlink at the last component, regular files
 * only, byte cap), write_file_atomic (remove leftover tmp, exclusive
 * no-follow create at mode 0600, write, fsync, close, rename) and mkdir
 * (missing parents, mode 0700).
 *
 * Descriptors live in fd boxes (sbxw.c) created before the open, so a Lua
 * error can never leak one. Failures return `nil, message` with short fixed
 * messages; errno details never reach Lua.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbxw.h"
#include "waux.h"

#define READ_MIN_ROOM 1   /* reserve at least this much before each read */

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
  /* 1. A leftover tmp goes; unlink never follows a symlink. */
  if (unlink(tmp) != 0 && errno != ENOENT) return fail(L, "write failed");
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

void sbxw__open_fs(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"read_file", l_read_file}, {"write_file_atomic", l_write_file_atomic},
    {"mkdir", l_mkdir}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
