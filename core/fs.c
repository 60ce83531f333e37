/*
 * fs.c: the filesystem guards the runtime needs (spec/runtime.md 3.1 step 8,
 * 5.3 steps 3-4 and 10, 6.1, 7.6). Everything is synchronous and local: these are
 * a handful of syscalls on directories the service owns, never a payload.
 *
 *   core.fs_stat(path)      follows links   -> {type, mode, uid, gid, size}
 *   core.fs_lstat(path)     does not follow -> same  | nil, err, errno
 *   core.fs_mkdir(path [, mode])   one directory (default 0700); EEXIST is an
 *                                  error (callers re-check with lstat)
 *   core.fs_mkdir_p(path [, mode]) every missing component, mode 0700 by
 *                                  default; existing directories are left as
 *                                  they are (never chmod-ed)
 *   core.realpath(path)     canonical path (every link resolved)
 *   core.fs_mkdtemp(tmpl)   mkdtemp(3): tmpl ends in XXXXXX; mode 0700
 *   core.fs_rmtree(path)    removes path and everything under it without
 *                           following any symbolic link (a link is unlinked,
 *                           never entered); a missing path is success
 *   core.fs_readdir(path)   names in the directory except "." and ".."
 *   core.lock_dir(path)     -> lock: an exclusive non-blocking flock on the
 *                           directory (spec/runtime.md 6.1); held by another
 *                           process: nil, "EAGAIN: held by another process",
 *                           "EAGAIN". lock:release() (also on __gc, __close
 *                           and process exit), lock:held()
 *
 * `type` is one of "dir", "file", "link", "socket", "fifo", "char",
 * "block", "other"; `mode` holds the permission bits only (07777).
 * Failures return nil, "ENAME: strerror text", "ENAME" (sbx__push_error);
 * a wrong argument (an empty path, one holding NUL) raises.
 * The walk in fs_rmtree uses openat/unlinkat on descriptors opened with
 * O_NOFOLLOW|O_DIRECTORY, so a link swapped in during the walk is never
 * followed; its depth is bounded by FS_RMTREE_MAX_DEPTH.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "aux.h"
#include "parts.h"

#define FS_RMTREE_MAX_DEPTH 128
#define LOCK_MT "sbx.dirlock"


static const char *type_name(mode_t m) {
  if (S_ISDIR(m)) return "dir";
  if (S_ISREG(m)) return "file";
  if (S_ISLNK(m)) return "link";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISFIFO(m)) return "fifo";
  if (S_ISCHR(m)) return "char";
  if (S_ISBLK(m)) return "block";
  return "other";
}

static int push_stat(lua_State *L, const struct stat *st) {
  lua_createtable(L, 0, 5);
  lua_pushstring(L, type_name(st->st_mode));
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)(st->st_mode & 07777));
  lua_setfield(L, -2, "mode");
  lua_pushinteger(L, (lua_Integer)st->st_uid);
  lua_setfield(L, -2, "uid");
  lua_pushinteger(L, (lua_Integer)st->st_gid);
  lua_setfield(L, -2, "gid");
  lua_pushinteger(L, (lua_Integer)st->st_size);
  lua_setfield(L, -2, "size");
  return 1;
}

static int l_stat(lua_State *L) {
  struct stat st;
  if (stat(sbx__check_path(L, 1, NULL), &st) != 0) return sbx__push_error(L, errno, NULL);
  return push_stat(L, &st);
}

static int l_lstat(lua_State *L) {
  struct stat st;
  if (lstat(sbx__check_path(L, 1, NULL), &st) != 0) return sbx__push_error(L, errno, NULL);
  return push_stat(L, &st);
}

static mode_t opt_mode(lua_State *L, int idx) {
  lua_Integer m = luaL_optinteger(L, idx, 0700);
  luaL_argcheck(L, m >= 0 && m <= 07777, idx, "mode out of range");
  return (mode_t)m;
}

static int l_mkdir(lua_State *L) {
  const char *p = sbx__check_path(L, 1, NULL);
  if (mkdir(p, opt_mode(L, 2)) != 0) return sbx__push_error(L, errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

/* Creates each missing component of an absolute or relative path in turn. */
static int l_mkdir_p(lua_State *L) {
  size_t n;
  const char *p = sbx__check_path(L, 1, NULL);
  mode_t mode = opt_mode(L, 2);
  char buf[PATH_MAX];
  struct stat st;
  n = strlen(p);
  if (n >= sizeof buf) return sbx__push_error(L, ENAMETOOLONG, NULL);
  memcpy(buf, p, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    if (buf[i - 1] == '/') continue;            /* repeated slash */
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, mode) != 0) {
      int err = errno;
      if (err != EEXIST) return sbx__push_error(L, err, NULL);
      if (stat(buf, &st) != 0) return sbx__push_error(L, errno, NULL);
      if (!S_ISDIR(st.st_mode)) return sbx__push_error(L, ENOTDIR, NULL);
    }
    buf[i] = saved;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_realpath(lua_State *L) {
  char *r = realpath(sbx__check_path(L, 1, NULL), NULL);
  if (r == NULL) return sbx__push_error(L, errno, NULL);
  lua_pushstring(L, r);   /* a memory raise here would leak r (PATH_MAX bytes at most) */
  free(r);
  return 1;
}

static int l_mkdtemp(lua_State *L) {
  size_t n;
  const char *t = luaL_checklstring(L, 1, &n);
  char buf[PATH_MAX];
  luaL_argcheck(L, n >= 6 && strlen(t) == n && strcmp(t + n - 6, "XXXXXX") == 0, 1,
                "template must end in XXXXXX");
  if (n >= sizeof buf) return sbx__push_error(L, ENAMETOOLONG, NULL);
  memcpy(buf, t, n + 1);
  if (mkdtemp(buf) == NULL) return sbx__push_error(L, errno, NULL);
  lua_pushstring(L, buf);
  return 1;
}

/* Empties the directory open at dfd (which it closes). Returns 0 or errno. */
static int rm_children(int dfd, int depth) {
  DIR *d;
  struct dirent *e;
  int err = 0;
  if (depth > FS_RMTREE_MAX_DEPTH) { close(dfd); return ELOOP; }
  d = fdopendir(dfd);
  if (d == NULL) { err = errno; close(dfd); return err; }
  while (err == 0) {
    errno = 0;
    e = readdir(d);
    if (e == NULL) { err = errno; break; }
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) continue;
    if (errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) { err = errno; break; }
    /* A directory: open it without following a link, empty it, remove it. */
    int child = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0) { err = errno; break; }
    err = rm_children(child, depth + 1);
    if (err == 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT) err = errno;
  }
  closedir(d);
  return err;
}

static int l_rmtree(lua_State *L) {
  const char *p = sbx__check_path(L, 1, NULL);
  struct stat st;
  int fd, err;
  if (lstat(p, &st) != 0) {
    if (errno == ENOENT) { lua_pushboolean(L, 1); return 1; }
    return sbx__push_error(L, errno, NULL);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(p) != 0 && errno != ENOENT) return sbx__push_error(L, errno, NULL);
    lua_pushboolean(L, 1);
    return 1;
  }
  fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  err = rm_children(fd, 1);
  if (err != 0) return sbx__push_error(L, err, NULL);
  if (rmdir(p) != 0 && errno != ENOENT) return sbx__push_error(L, errno, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_readdir(lua_State *L) {
  const char *p = sbx__check_path(L, 1, NULL);
  DIR *d;
  struct dirent *e;
  lua_Integer i = 0;
  lua_newtable(L);   /* before opendir: a raise here leaks nothing */
  d = opendir(p);
  if (d == NULL) return sbx__push_error(L, errno, NULL);
  for (;;) {
    errno = 0;
    e = readdir(d);
    if (e == NULL) break;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (!lua_checkstack(L, 2)) break;
    lua_pushstring(L, e->d_name);   /* a memory raise here would leak d: names are short */
    lua_rawseti(L, -2, ++i);
  }
  int err = errno;
  closedir(d);
  if (err != 0) return sbx__push_error(L, err, NULL);
  return 1;
}

/* ---- the installation lock --------------------------------------------- */

typedef struct { int fd; } lock_t;

/* core.lock_dir(path) -> lock | nil, message, code. Opens the directory
 * read-only, close-on-exec, and takes an exclusive non-blocking flock on it;
 * the lock userdata owns the descriptor before anything can fail. */
static int l_lock_dir(lua_State *L) {
  const char *path = sbx__check_path(L, 1, NULL);
  lock_t *lk = lua_newuserdatauv(L, sizeof *lk, 0);
  int fd;
  lk->fd = -1;
  luaL_setmetatable(L, LOCK_MT);
  fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    close(fd);
    return sbx__push_error(L, e, e == EWOULDBLOCK ? "held by another process" : NULL);
  }
  lk->fd = fd;
  return 1;
}

/* lock:release(); idempotent. */
static int lock_release(lua_State *L) {
  lock_t *lk = luaL_checkudata(L, 1, LOCK_MT);
  if (lk->fd >= 0) {
    close(lk->fd);   /* closing the only descriptor drops the flock */
    lk->fd = -1;
  }
  return 0;
}

static int lock_held(lua_State *L) {
  lock_t *lk = luaL_checkudata(L, 1, LOCK_MT);
  lua_pushboolean(L, lk->fd >= 0);
  return 1;
}

void sbx__open_fs(lua_State *L) {
  static const luaL_Reg lock_methods[] = {
    {"release", lock_release}, {"held", lock_held}, {NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"fs_stat", l_stat}, {"fs_lstat", l_lstat}, {"fs_mkdir", l_mkdir},
    {"fs_mkdir_p", l_mkdir_p}, {"realpath", l_realpath}, {"fs_mkdtemp", l_mkdtemp},
    {"fs_rmtree", l_rmtree}, {"fs_readdir", l_readdir}, {"lock_dir", l_lock_dir},
    {NULL, NULL}};
  sbx__class_closable(L, LOCK_MT, lock_methods, lock_release);
  luaL_setfuncs(L, fns, 0);
}
