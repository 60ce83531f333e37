/*
 * fdbudget.h: what the connection engine (conn.c) uses of the descriptor budget (fdbudget.c,
 * shared/spec/hardening.md 2). Single-threaded: only the loop thread calls
 * these.
 */
#ifndef SBX_FDBUDGET_H
#define SBX_FDBUDGET_H

/* 1 when one more broker connection beyond a turn's guaranteed ones may be
 * taken from the shared pool (it is then counted), 0 when the pool is empty. */
int sbx__fd_pool_take(void);

/* Gives back a connection sbx__fd_pool_take counted. */
void sbx__fd_pool_give(void);

/* After accept failed with EMFILE/ENFILE on the listening descriptor fd:
 * closes the reserved descriptor, accepts and closes every pending
 * connection, reopens the reserve (the classic pattern). Returns how many
 * connections it accepted and closed. */
int sbx__fd_emfile_drain(int fd);

#endif
