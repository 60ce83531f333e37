/*
 * localtime.c: the time zone primitives (spec/worker.md sections 2.1, 6.1):
 * zone_valid(zone) and local_time(zone, epoch) -> "M/D/YYYY, h:mm:ss AM".
 *
 * A zone name must match ^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$ (so no "." and
 * no ".." can appear), be at most SBXW_MAX_ZONE_BYTES, and name a regular
 * file under /usr/share/zoneinfo that starts with the TZif magic. The
 * conversion itself is glibc's: TZ is set to ":<absolute zone file>" (glibc
 * then reads that file and consults no other variable), tzset() reloads it
 * and localtime_r converts. The binary reads no environment variable; the
 * loadable module (a host process) restores the caller's TZ afterwards.
 * glibc falls back to UTC on a file it cannot parse, hence the checks first.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbxw.h"

#define ZONE_PATH_MAX (sizeof SBXW_ZONEINFO_DIR + 1 + SBXW_MAX_ZONE_BYTES + 1)

static int zone_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '+' || c == '-';
}

/* 1 when zone matches the pattern: segments of zone_char joined by '/'. */
static int zone_name_ok(const char *z, size_t n) {
  if (n == 0 || n > SBXW_MAX_ZONE_BYTES) return 0;
  if (z[0] == '/' || z[n - 1] == '/') return 0;
  for (size_t i = 0; i < n; i++) {
    if (z[i] == '/') {
      if (z[i + 1] == '/') return 0;                     /* empty segment */
    } else if (!zone_char((unsigned char)z[i])) {
      return 0;                                          /* NUL included */
    }
  }
  return 1;
}

/* Fills path with the zone file; 1 when it is a regular TZif file. */
static int zone_file(const char *z, size_t n, char *path, size_t cap) {
  struct stat st;
  char magic[4];
  int fd, ok;
  if (!zone_name_ok(z, n)) return 0;
  if ((size_t)snprintf(path, cap, "%s/%s", SBXW_ZONEINFO_DIR, z) >= cap) return 0;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return 0;
  ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
       read(fd, magic, sizeof magic) == (ssize_t)sizeof magic &&
       memcmp(magic, "TZif", 4) == 0;
  close(fd);
  return ok;
}

/* sbxw.zone_valid(zone) -> boolean */
static int l_zone_valid(lua_State *L) {
  size_t n;
  const char *z = luaL_checklstring(L, 1, &n);
  char path[ZONE_PATH_MAX];
  lua_pushboolean(L, zone_file(z, n, path, sizeof path));
  return 1;
}

/* Converts t in the zone file at path; 0 on success. */
static int convert(const char *path, time_t t, struct tm *out) {
  char tz[ZONE_PATH_MAX + 1];
  int rc;
#ifdef SBXW_MODULE
  const char *old = getenv("TZ");
  char *saved = NULL;
  if (old != NULL && (saved = strdup(old)) == NULL) return -1;
#endif
  snprintf(tz, sizeof tz, ":%s", path);
  rc = setenv("TZ", tz, 1);
  if (rc == 0) {
    tzset();
    rc = localtime_r(&t, out) == NULL ? -1 : 0;
  }
#ifdef SBXW_MODULE
  if (saved != NULL) setenv("TZ", saved, 1); else unsetenv("TZ");
  free(saved);
  tzset();
#endif
  return rc;
}

/* sbxw.local_time(zone, epoch) -> "M/D/YYYY, h:mm:ss AM" | nil, "invalid time zone" */
static int l_local_time(lua_State *L) {
  size_t n;
  const char *z = luaL_checklstring(L, 1, &n);
  lua_Number e = luaL_checknumber(L, 2);
  char path[ZONE_PATH_MAX], out[64];
  struct tm tm;
  int hour;
  luaL_argcheck(L, isfinite(e) && fabs(e) < 1e15, 2, "epoch out of range");
  if (!zone_file(z, n, path, sizeof path) || convert(path, (time_t)floor(e), &tm) != 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "invalid time zone");
    return 2;
  }
  hour = tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12;
  snprintf(out, sizeof out, "%d/%d/%lld, %d:%02d:%02d %s", tm.tm_mon + 1, tm.tm_mday,
           (long long)tm.tm_year + 1900, hour, tm.tm_min, tm.tm_sec,
           tm.tm_hour < 12 ? "AM" : "PM");
  lua_pushstring(L, out);
  return 1;
}

void sbxw__open_localtime(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"zone_valid", l_zone_valid}, {"local_time", l_local_time}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
