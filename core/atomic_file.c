/*
 * atomic_file.c: the routing state file's write and read (spec/runtime.md
 * 3.3 step 3 and 7.1). A reader of the state file sees either the old list
 * or the new one, never a torn write, even when the host dies mid-write or
 * the machine loses power:
 *
 *   core.write_file_atomic(path, bytes [, opts])
 *       create or truncate <path>.tmp (O_NOFOLLOW, mode 0600; it must be a
 *       regular file owned by the process uid), write every byte, fsync,
 *       close, rename over <path>, then fsync the directory so the rename
 *       itself is durable.  -> true | nil, "ENAME: message", "ENAME"
 *       On any failure before the rename the temp file is unlinked (only
 *       when it is the regular file this call opened); <path> is untouched.
 *       opts.crash_before_rename = true is a test seam: stop after the fsync
 *       of the temp file, leave it in place and return nil, "ECANCELED:
 *       simulated crash before rename", "ECANCELED", exactly what a crash at
 *       that point leaves on disk.
 *   core.read_file_nofollow(path, max)
 *       open with O_NOFOLLOW, require a regular file, read at most max bytes
 *       -> bytes | nil, "ENAME: message", "ENAME" (EFBIG "file too large"
 *       past max; ELOOP for a symbolic link; EINVAL "not a regular file").
 *   core.write_file_new(path, bytes [, mode])
 *       create path exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, mode default
 *       0600), write every byte, close -> true | nil, "ENAME: message",
 *       "ENAME" (EEXIST when anything, a symbolic link included, is already
 *       there; it is never opened or followed). A failed write unlinks the
 *       file this call created. Rich mode's .channel-key record
 *       (spec/rich-mode.md 4, alias guard step 2).
 *
 * Both are synchronous: the state file is at most 1 MiB of channel keys and
 * is written only by an owner command or a trusted plugin. Nothing between
 * open and close can raise, so no descriptor leaks on a Lua error.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "aux.h"
#include "parts.h"

#define ATOMIC_TMP_SUFFIX ".tmp"
#define ATOMIC_READ_MAX ((lua_Integer)64 * 1024 * 1024)

/* fsync of the directory holding path (the rename's durability). */
static int fsync_parent(const char *path, size_t len) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  size_t n;
  if (slash == NULL) {
    strcpy(dir, ".");
  } else {
    n = (size_t)(slash - path);
    if (n == 0) n = 1;                 /* "/file" -> "/" */
    if (n >= sizeof dir || n > len) return ENAMETOOLONG;
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return errno;
  int err = 0;
  if (fsync(dfd) != 0 && errno != EINVAL) err = errno;   /* EINVAL: fs without dir fsync */
  close(dfd);
  return err;
}

static int l_write_file_atomic(lua_State *L) {
  size_t plen, blen;
  const char *path = sbx__check_path(L, 1, &plen);
  const char *bytes = luaL_checklstring(L, 2, &blen);
  int crash = 0;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    crash = sbx__opt_boolean_field(L, 3, "write_file_atomic", "crash_before_rename", 0);
  }
  char tmp[PATH_MAX];
  if (plen + sizeof ATOMIC_TMP_SUFFIX > sizeof tmp) return sbx__push_error(L, ENAMETOOLONG, NULL);
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ATOMIC_TMP_SUFFIX, sizeof ATOMIC_TMP_SUFFIX);

  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  struct stat st;
  int err = 0;
  if (fstat(fd, &st) != 0) {
    err = errno;
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);                         /* not ours: never unlink it */
    return sbx__push_error(L, EINVAL, "temp file is not a service-owned regular file");
  }
  if (err == 0 && fchmod(fd, 0600) != 0) err = errno;
  if (err == 0) err = sbx__write_all(fd, bytes, blen);
  if (err == 0 && fsync(fd) != 0) err = errno;
  if (close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    unlink(tmp);
    return sbx__push_error(L, err, NULL);
  }
  if (crash) return sbx__push_error(L, ECANCELED, "simulated crash before rename");
  if (rename(tmp, path) != 0) {
    err = errno;
    unlink(tmp);
    return sbx__push_error(L, err, NULL);
  }
  err = fsync_parent(path, plen);
  if (err != 0) return sbx__push_error(L, err, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_read_file_nofollow(lua_State *L) {
  size_t plen;
  const char *path = sbx__check_path(L, 1, &plen);
  lua_Integer max = luaL_checkinteger(L, 2);
  luaL_argcheck(L, max >= 0 && max <= ATOMIC_READ_MAX, 2, "max out of range");
  /* the buffer first: nothing below raises while the descriptor is open */
  char *buf = lua_newuserdatauv(L, (size_t)max + 1, 0);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return sbx__push_error(L, err, NULL);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return sbx__push_error(L, EINVAL, "not a regular file");
  }
  size_t got = 0, cap = (size_t)max + 1;
  while (got < cap) {
    ssize_t r = read(fd, buf + got, cap - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return sbx__push_error(L, err, NULL);
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got > (size_t)max) return sbx__push_error(L, EFBIG, "file too large");
  lua_pushlstring(L, buf, got);
  return 1;
}

static int l_write_file_new(lua_State *L) {
  size_t plen, blen;
  const char *path = sbx__check_path(L, 1, &plen);
  const char *bytes = luaL_checklstring(L, 2, &blen);
  lua_Integer mode = luaL_optinteger(L, 3, 0600);
  luaL_argcheck(L, mode >= 0 && mode <= 0777, 3, "mode out of range");
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  int err = sbx__write_all(fd, bytes, blen);
  if (close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    unlink(path);
    return sbx__push_error(L, err, NULL);
  }
  lua_pushboolean(L, 1);
  return 1;
}

void sbx__open_atomic_file(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"write_file_atomic", l_write_file_atomic},
    {"read_file_nofollow", l_read_file_nofollow},
    {"write_file_new", l_write_file_new},
    {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
