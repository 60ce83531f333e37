/*
 * docker_demux.c: Docker's framed log stream (spec/rich-mode.md 5.4), the
 * body of `GET /containers/<name>/logs` for a container without a TTY, read
 * back as text: core.docker_demux(buf).
 *
 * Each frame is 8 header bytes, [stream 0-2][0][0][0][u32 big-endian
 * length], then the payload; the text is the payloads joined in order. Any
 * invalid header (a stream byte over 2, a non-zero padding byte), or bytes
 * but no complete frame, gives the whole buffer as it is (plain text, e.g. a
 * TTY container's log). A last frame cut short (the read was bounded) is
 * left out. Pure and allocation-bounded: the text is never longer than the
 * buffer. Fuzzed by fuzz/demux_fuzz.c.
 */
#include <stdint.h>
#include <string.h>

#include "aux.h"
#include "docker_demux.h"
#include "parts.h"

size_t sbx__docker_demux(const unsigned char *buf, size_t len, unsigned char *out, int *framed) {
  size_t at = 0, o = 0;
  int complete = 0;
  *framed = 0;
  while (at < len) {
    size_t left = len - at, k, plen;
    /* A header that is already invalid in its first bytes, even if short. */
    if (buf[at] > 2) return 0;
    for (k = 1; k < 4 && k < left; k++)
      if (buf[at + k] != 0) return 0;
    if (left < 8) break;                       /* an incomplete last header */
    plen = (size_t)buf[at + 4] << 24 | (size_t)buf[at + 5] << 16 |
           (size_t)buf[at + 6] << 8 | (size_t)buf[at + 7];
    if (plen > left - 8) break;                /* an incomplete last frame */
    if (out != NULL) memcpy(out + o, buf + at + 8, plen);
    o += plen;
    at += 8 + plen;
    complete = 1;
  }
  *framed = complete;
  return complete ? o : 0;
}

/* core.docker_demux(buf) -> text */
static int l_docker_demux(lua_State *L) {
  size_t len, olen;
  const unsigned char *buf = (const unsigned char *)luaL_checklstring(L, 1, &len);
  int framed;
  luaL_Buffer b;
  sbx__docker_demux(buf, len, NULL, &framed);
  if (!framed) {
    lua_settop(L, 1);                          /* plain text: the buffer itself */
    return 1;
  }
  olen = sbx__docker_demux(buf, len, (unsigned char *)luaL_buffinitsize(L, &b, len), &framed);
  luaL_pushresultsize(&b, olen);
  return 1;
}

void sbx__open_docker_demux(lua_State *L) {
  lua_pushcfunction(L, l_docker_demux);
  lua_setfield(L, -2, "docker_demux");
}
