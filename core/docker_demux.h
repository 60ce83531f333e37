/*
 * docker_demux.h: Docker's log-frame demultiplexing (docker_demux.c,
 * spec/rich-mode.md 5.4) as a pure function, for the Lua binding and
 * fuzz/demux_fuzz.c.
 */
#ifndef SBX_DOCKER_DEMUX_H
#define SBX_DOCKER_DEMUX_H

#include <stddef.h>

/*
 * Joins the payloads of the frames in buf[0..len) into out (at least len
 * bytes, or NULL to only measure) and returns their length, with *framed
 * set. *framed is 0, and 0 returned, when a header is invalid or no frame
 * is complete: the caller then takes the whole buffer as text.
 */
size_t sbx__docker_demux(const unsigned char *buf, size_t len, unsigned char *out, int *framed);

#endif
