/*
 * fdbudget.c: the host's file descriptors as a budget, so one hostile
 * channel cannot starve the others (shared/spec/hardening.md 2).
 *
 *   core.fd_raise() -> soft, hard     raises the soft RLIMIT_NOFILE to the hard
 *                                     limit (done once per process: the runtime
 *                                     calls it at startup and logs the value)
 *   core.fd_count() -> n              descriptors open now (/proc/self/fd)
 *   core.fd_budget() -> {limit, base, turns, pool, pool_used, committed}
 *   core.fd_turn_acquire() -> true | false, short
 *                                     charges one running turn, or says how many
 *                                     descriptors are missing for it
 *   core.fd_turn_release()            gives a turn's charge back
 *
 * Design. Descriptors are budgeted, not first come: the limit is split into
 *   base       what was open when the process last had no turn running
 *              (measured at the first turn after such a moment; while turns
 *              run, whatever is open beyond every charge raises it),
 *   reserve    SBX_FD_HOST_RESERVE for the host's own work,
 *   turns      SBX_FD_TURN_COST + SBX_FD_GUARANTEED_CONNS per running turn,
 *   headroom   SBX_FD_TURN_HEADROOM turns' worth, so the next turn can start,
 *   pool       what is left: broker connections beyond a turn's guaranteed
 *              two (up to the listener's 16) are taken from it, first come.
 * A connection over its turn's share while the pool is empty is accepted and
 * closed at once by the listener (conn.c, under both listeners). A turn is admitted only when
 * its whole charge fits beside the pool's connections in use; when it does
 * not, the caller reclaims idle pooled connections (core.broker_reclaim) or
 * waits in its channel queue.
 *
 * The accounting is an upper bound of the real use (a turn rarely has every
 * descriptor of its cost open at once), so the limit itself is never reached
 * through the budgeted paths; an EMFILE at accept (a host library, the
 * embedding host) is met with the reserved-descriptor pattern instead of a
 * stopped listener (sbx__fd_emfile_drain).
 *
 * All of it is process-wide state of the loop thread: every runtime, every
 * listener of the process draws on the one limit.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "aux.h"
#include "fdbudget.h"
#include "parts.h"

#define PER_TURN (SBX_FD_TURN_COST + SBX_FD_GUARANTEED_CONNS)
#define FD_LIMIT_CAP 1048576L      /* the kernel's nr_open default */

static struct {
  int inited;
  long limit;          /* soft RLIMIT_NOFILE, capped */
  long base;           /* open descriptors with no turn running */
  long turns;          /* charged turns */
  long pool_used;      /* pooled connections open */
  int reserve_fd;      /* kept for an EMFILE accept; -1 when lost */
} B = {0, 0, 0, 0, 0, -1};

static long count_open(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  long n = 0;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;                      /* the directory's own descriptor */
}

static long soft_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur > (rlim_t)FD_LIMIT_CAP) return FD_LIMIT_CAP;
  return (long)r.rlim_cur;
}

static void reserve_open(void) {
  if (B.reserve_fd < 0) B.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void init(void) {
  if (B.inited) return;
  B.inited = 1;
  reserve_open();
  B.limit = soft_limit();
  B.base = count_open();
  if (B.base < 0) B.base = 0;
}

static long committed(long turns) {
  return B.base + SBX_FD_HOST_RESERVE + turns * PER_TURN;
}

static long pool_size(void) {
  long n = B.limit - committed(B.turns) - SBX_FD_TURN_HEADROOM * PER_TURN;
  return n > 0 ? n : 0;
}

int sbx__fd_pool_take(void) {
  init();
  if (B.pool_used >= pool_size()) return 0;
  B.pool_used++;
  return 1;
}

void sbx__fd_pool_give(void) {
  if (B.pool_used > 0) B.pool_used--;
}

int sbx__fd_emfile_drain(int fd) {
  int n = 0, c;
  init();
  if (B.reserve_fd >= 0) {
    close(B.reserve_fd);
    B.reserve_fd = -1;
  }
  while ((c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0 || errno == EINTR) {
    if (c >= 0) {
      close(c);
      n++;
    }
  }
  reserve_open();
  return n;
}

/* core.fd_raise() -> soft, hard */
static int l_fd_raise(lua_State *L) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    struct rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  B.limit = soft_limit();
  lua_pushinteger(L, r.rlim_cur == RLIM_INFINITY ? -1 : (lua_Integer)r.rlim_cur);
  lua_pushinteger(L, r.rlim_max == RLIM_INFINITY ? -1 : (lua_Integer)r.rlim_max);
  return 2;
}

static int l_fd_count(lua_State *L) {
  lua_pushinteger(L, count_open());
  return 1;
}

static int l_fd_budget(lua_State *L) {
  init();
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, B.limit);
  lua_setfield(L, -2, "limit");
  lua_pushinteger(L, B.base);
  lua_setfield(L, -2, "base");
  lua_pushinteger(L, B.turns);
  lua_setfield(L, -2, "turns");
  lua_pushinteger(L, pool_size());
  lua_setfield(L, -2, "pool");
  lua_pushinteger(L, B.pool_used);
  lua_setfield(L, -2, "pool_used");
  lua_pushinteger(L, committed(B.turns));
  lua_setfield(L, -2, "committed");
  return 1;
}

/* core.fd_turn_acquire() -> true | false, descriptors short */
static int l_fd_turn_acquire(lua_State *L) {
  long need;
  init();
  B.limit = soft_limit();
  {
    /* Idle: measure the host's own again. Busy: what is open beyond every
     * charge is the host's own too, so the base only grows then (a host that
     * is never idle does not drift below its real use). */
    long n = count_open();
    if (n >= 0 && B.turns == 0 && B.pool_used == 0) B.base = n;
    else if (n >= 0 && n - B.turns * PER_TURN - B.pool_used > B.base) B.base = n - B.turns * PER_TURN - B.pool_used;
  }
  need = committed(B.turns + 1) + B.pool_used - B.limit;
  if (need > 0) {
    lua_pushboolean(L, 0);
    lua_pushinteger(L, need);
    return 2;
  }
  B.turns++;
  lua_pushboolean(L, 1);
  return 1;
}

static int l_fd_turn_release(lua_State *L) {
  (void)L;
  if (B.turns > 0) B.turns--;
  return 0;
}

void sbx__open_fdbudget(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"fd_raise", l_fd_raise}, {"fd_count", l_fd_count}, {"fd_budget", l_fd_budget},
    {"fd_turn_acquire", l_fd_turn_acquire}, {"fd_turn_release", l_fd_turn_release},
    {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
