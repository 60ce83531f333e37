/*
 * dir_handle.c: directory-anchored no-follow file creation (spec/rich-mode.md
 * 2 and 16.4 steps 1 and 9). Rich mode's attachment collection opens the
 * channel's attachments directory once and creates every file relative to
 * that descriptor, so a guest that swaps the directory or plants a link at a
 * file name afterwards redirects nothing:
 *
 *   core.dir_open(path)
 *       open(path, O_RDONLY|O_DIRECTORY|O_NOFOLLOW) -> handle | nil,
 *       "ENAME: message", "ENAME" (Linux answers ENOTDIR for a symbolic
 *       link, as for anything else that is not a directory).
 *   handle:write_new(name, bytes [, mode])
 *       openat(dirfd, name, O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, mode default
 *       0600), write every byte, close -> true | nil, "ENAME: message",
 *       "ENAME". EEXIST when anything (a planted symlink included) is already
 *       at name: it is never opened or followed. name must be one path
 *       component (no "/", not "." or "..", no NUL), else EINVAL. A failed
 *       write unlinks the file this call created.
 *   core.utf8_nfc(s)
 *       Unicode NFC of valid UTF-8 s (libutf8proc) -> string | nil, "EINVAL:
 *       ..." for invalid UTF-8 (16.4 step 8: attachment names).
 *   handle:close()        idempotent; the collector also runs it at the end
 *                         (and __gc / __close do if it was forgotten).
 * Synchronous: the callers write at most 25 MiB per file.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdlib.h>
#include <utf8proc.h>

#include "aux.h"
#include "parts.h"

#define DIR_HANDLE_MT "sandbox.core.dir_handle"

typedef struct {
  int fd;
} dir_handle;

static dir_handle *check_open(lua_State *L) {
  dir_handle *h = luaL_checkudata(L, 1, DIR_HANDLE_MT);
  if (h->fd < 0) luaL_error(L, "directory handle is closed");
  return h;
}

static int valid_component(const char *name, size_t len) {
  if (len == 0 || len > 255 || memchr(name, '\0', len) != NULL || memchr(name, '/', len) != NULL) return 0;
  return !(strcmp(name, ".") == 0 || strcmp(name, "..") == 0);
}

static int l_dir_open(lua_State *L) {
  size_t plen;
  const char *path = sbx__check_path(L, 1, &plen);
  dir_handle *h = lua_newuserdatauv(L, sizeof(*h), 0);
  h->fd = -1;
  luaL_setmetatable(L, DIR_HANDLE_MT);
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  h->fd = fd;
  return 1;
}

static int l_write_new(lua_State *L) {
  dir_handle *h = check_open(L);
  size_t nlen, blen;
  const char *name = luaL_checklstring(L, 2, &nlen);
  const char *bytes = luaL_checklstring(L, 3, &blen);
  lua_Integer mode = luaL_optinteger(L, 4, 0600);
  luaL_argcheck(L, mode >= 0 && mode <= 0777, 4, "mode out of range");
  if (!valid_component(name, nlen)) return sbx__push_error(L, EINVAL, "not a single file name");
  int fd = openat(h->fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
  if (fd < 0) return sbx__push_error(L, errno, NULL);
  int err = sbx__write_all(fd, bytes, blen);
  if (close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    unlinkat(h->fd, name, 0);
    return sbx__push_error(L, err, NULL);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_close(lua_State *L) {
  dir_handle *h = luaL_checkudata(L, 1, DIR_HANDLE_MT);
  if (h->fd >= 0) close(h->fd);
  h->fd = -1;
  return 0;
}

static int l_utf8_nfc(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  utf8proc_uint8_t *out = NULL;
  utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &out,
                                    UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (n < 0) return sbx__push_error(L, EINVAL, "invalid UTF-8");
  lua_pushlstring(L, (const char *)out, (size_t)n);
  free(out);
  return 1;
}

void sbx__open_dir_handle(lua_State *L) {
  static const luaL_Reg methods[] = {{"write_new", l_write_new}, {"close", l_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"dir_open", l_dir_open}, {"utf8_nfc", l_utf8_nfc}, {NULL, NULL}};
  sbx__class_closable(L, DIR_HANDLE_MT, methods, l_close);
  luaL_setfuncs(L, funcs, 0);
}
