/*
 * fs_usage.c: how much disk a workspace holds, and how much its filesystem
 * has left (shared/spec/hardening.md 3):
 *
 *   core.fs_usage(path, max_entries [, fn])   with fn: measures in the libuv
 *       threadpool, then calls fn({bytes=, entries=, complete=}) on the loop
 *       (or fn({error="ENAME"}) when path cannot be opened as a directory
 *       without following a link); without fn: measures at once, on the
 *       calling thread, and returns that table (for a small max_entries: the
 *       runtime tries a few hundred entries so first, then the full walk in
 *       the threadpool). bytes counts allocated blocks (st_blocks x 512, so
 *       a sparse file costs what it holds), of path and of everything under
 *       it, never following a symbolic link; complete is false when the walk
 *       stopped at max_entries entries, SBX_USAGE_MAX_DEPTH levels or its
 *       open budget (a hostile tree is measured as incomplete, never walked
 *       for long). Returns nothing; the walk cannot be cancelled.
 *   core.fs_statfs(path) -> {free=, used=, total=, fsid=} | nil, err, code
 *       free is what the service account may still use (f_bavail), used is
 *       f_blocks - f_bfree, in bytes; fsid names the filesystem.
 *
 * The walk holds at most three descriptors at any moment: it keeps no
 * directory open while it descends; it remembers each level's name and
 * telldir position instead and reopens the path from the root, one
 * O_NOFOLLOW|O_DIRECTORY openat per component, when it climbs back. So a
 * deep tree costs time (bounded by the open budget), never descriptors the
 * descriptor budget (fdbudget.c) did not count.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "loop.h"
#include "parts.h"

#define SBX_USAGE_MAX_DEPTH  64
#define USAGE_OPENS_PER_ENTRY 8         /* open budget: this many per allowed entry */

typedef struct {
  char name[NAME_MAX + 1];
  long pos;                              /* telldir of the next entry to read */
} frame_t;

typedef struct {
  uv_work_t req;
  sbx__loop_t *lp;
  int cb_ref;
  char *path;
  long max_entries;
  /* results */
  uint64_t bytes;
  long entries;
  int complete;
  int err;
  frame_t frames[SBX_USAGE_MAX_DEPTH + 1];
} usage_t;

/* The directory at frames[1..depth] under root, opened without following
 * any link; -1 on failure. */
static int open_level(int root, const frame_t *f, int depth, long *opens) {
  int fd = dup(root), nfd;
  if (fd < 0) return -1;
  for (int i = 1; i <= depth; i++) {
    (*opens)++;
    nfd = openat(fd, f[i].name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    if (nfd < 0) return -1;
    fd = nfd;
  }
  return fd;
}

static void walk(usage_t *u) {
  struct stat st;
  long opens = 0, budget = u->max_entries * USAGE_OPENS_PER_ENTRY + 64;
  int depth = 0;
  int root = open(u->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0) {
    u->err = errno;
    return;
  }
  if (fstat(root, &st) == 0) u->bytes += (uint64_t)st.st_blocks * 512;
  u->frames[0].pos = 0;
  u->complete = 1;
  for (;;) {
    int fd = open_level(root, u->frames, depth, &opens);
    DIR *d;
    struct dirent *e;
    int descended = 0;
    if (fd < 0) {
      /* gone or swapped for a link meanwhile: nothing more to count there */
      if (depth == 0) break;
      depth--;
      continue;
    }
    if ((d = fdopendir(fd)) == NULL) {
      close(fd);
      u->complete = 0;
      break;
    }
    if (u->frames[depth].pos != 0) seekdir(d, u->frames[depth].pos);
    while ((e = readdir(d)) != NULL) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      if (++u->entries > u->max_entries) {
        u->complete = 0;
        break;
      }
      if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      u->bytes += (uint64_t)st.st_blocks * 512;
      if (!S_ISDIR(st.st_mode)) continue;
      if (depth + 1 > SBX_USAGE_MAX_DEPTH || opens + depth + 1 > budget || strlen(e->d_name) > NAME_MAX) {
        u->complete = 0;
        break;
      }
      u->frames[depth].pos = telldir(d);
      depth++;
      memcpy(u->frames[depth].name, e->d_name, strlen(e->d_name) + 1);
      u->frames[depth].pos = 0;
      descended = 1;
      break;
    }
    closedir(d);
    if (!u->complete) break;
    if (descended) continue;
    if (depth == 0) break;
    depth--;                             /* climb back: resume the parent */
  }
  close(root);
}

static void usage_work(uv_work_t *req) {
  walk((usage_t *)req->data);
}

static void push_result(lua_State *L, const usage_t *u) {
  lua_createtable(L, 0, 3);
  if (u->err != 0) {
    lua_pushstring(L, sbx__errno_name(u->err));
    lua_setfield(L, -2, "error");
  } else {
    lua_pushinteger(L, (lua_Integer)u->bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, u->entries > u->max_entries ? u->max_entries : u->entries);
    lua_setfield(L, -2, "entries");
    lua_pushboolean(L, u->complete);
    lua_setfield(L, -2, "complete");
  }
}

static void usage_done(uv_work_t *req, int status) {
  usage_t *u = req->data;
  lua_State *L = u->lp->L;
  (void)status;
  lua_rawgeti(L, LUA_REGISTRYINDEX, u->cb_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, u->cb_ref);
  push_result(L, u);
  free(u->path);
  free(u);
  sbx__pcall(L, 1);
}

/* core.fs_usage(path, max_entries, fn) */
static int l_fs_usage(lua_State *L) {
  size_t len;
  const char *path = sbx__check_path(L, 1, &len);
  lua_Integer max = luaL_checkinteger(L, 2);
  usage_t *u;
  luaL_argcheck(L, max >= 1 && max <= 100000000, 2, "max_entries out of range");
  if (lua_isnoneornil(L, 3)) {
    usage_t *s = lua_newuserdatauv(L, sizeof *s, 0);    /* GC-owned */
    memset(s, 0, sizeof *s);
    s->path = (char *)path;
    s->max_entries = (long)max;
    walk(s);
    push_result(L, s);
    return 1;
  }
  luaL_checktype(L, 3, LUA_TFUNCTION);
  u = calloc(1, sizeof *u);
  if (u == NULL || (u->path = strdup(path)) == NULL) {
    free(u);
    return luaL_error(L, "out of memory");
  }
  u->lp = sbx__loop(L);
  u->max_entries = (long)max;
  u->req.data = u;
  u->cb_ref = sbx__ref(L, 3);
  if (uv_queue_work(&u->lp->uv, &u->req, usage_work, usage_done) != 0) {
    sbx__unref(L, &u->cb_ref);
    free(u->path);
    free(u);
    return luaL_error(L, "fs_usage: cannot queue the walk");
  }
  return 0;
}

/* core.fs_statfs(path) -> {free, used, total, fsid} | nil, err, code */
static int l_fs_statfs(lua_State *L) {
  size_t len;
  const char *path = sbx__check_path(L, 1, &len);
  struct statvfs s;
  if (statvfs(path, &s) != 0) return sbx__push_error(L, errno, NULL);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)((uint64_t)s.f_bavail * s.f_frsize));
  lua_setfield(L, -2, "free");
  lua_pushinteger(L, (lua_Integer)((uint64_t)(s.f_blocks - s.f_bfree) * s.f_frsize));
  lua_setfield(L, -2, "used");
  lua_pushinteger(L, (lua_Integer)((uint64_t)s.f_blocks * s.f_frsize));
  lua_setfield(L, -2, "total");
  lua_pushinteger(L, (lua_Integer)s.f_fsid);
  lua_setfield(L, -2, "fsid");
  return 1;
}

void sbx__open_fs_usage(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"fs_usage", l_fs_usage}, {"fs_statfs", l_fs_statfs}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
