-- runtime/_descriptors.lua: a turn's share of the host's file descriptors
-- (shared/spec/hardening.md 2). The budget itself is the core's
-- (core/fdbudget.c: a host reserve, a turn's cost plus its 2 guaranteed
-- broker connections, a shared pool for connections beyond them); this is
-- how a turn takes its charge:
--
--   descriptors.raise(logger)     once per process, at the first runtime:
--                                 the soft RLIMIT_NOFILE goes up to the hard
--                                 limit, and the value is logged (info); a
--                                 call without a logger raises and leaves the
--                                 log line to the first one with a logger
--   descriptors.acquire(signal[, reclaim])   yields until the turn's charge
--                                 fits: first it reclaims idle pooled broker
--                                 connections (core.broker_reclaim), then
--                                 calls reclaim() (the warm pool gives back
--                                 another channel's charge), then it
--                                 waits, re-checking every POLL_MS, for
--                                 turns to settle; raises
--                                 `sandbox host is out of file descriptors`
--                                 when the turn's deadline passes meanwhile
--                                 (its reason: host_descriptors), or the
--                                 signal's own reason for a stop
--   descriptors.release()         gives the charge back (once per acquire)
--   descriptors.take()            the charge of a listener that outlives
--                                 turns (rich mode's broker): true when it
--                                 fits now, after reclaiming idle pooled
--                                 connections; false otherwise, never waits
--                                 (released with descriptors.release())
--
-- A turn that must wait waits in its channel's queue: the turn is admitted
-- (busy lists it) but starts nothing, so another channel's turn never fails
-- for lack of descriptors.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.POLL_MS = 100
M.LOG_RAISED = "descriptor limit"

local raised = false

function M.raise(logger)
  if raised then return end
  local soft, hard = core.fd_raise()
  if logger then
    raised = true
    logger:info(M.LOG_RAISED, { nofile = soft, hard = hard })
  end
end

local function stop(signal, timed_out_reason)
  if signal.reason == timed_out_reason then error(errors.HOST_DESCRIPTORS, 0) end
  error(signal.reason, 0)
end

function M.acquire(signal, timed_out_reason, reclaim)
  while true do
    local ok, short = core.fd_turn_acquire()
    if ok then return end
    if core.broker_reclaim(short) > 0 and core.fd_turn_acquire() then return end
    if reclaim then reclaim() end
    if signal.aborted then stop(signal, timed_out_reason) end
    async.sleep(M.POLL_MS)
  end
end

function M.take()
  local ok, short = core.fd_turn_acquire()
  if ok then return true end
  return core.broker_reclaim(short) > 0 and core.fd_turn_acquire() == true
end

function M.release()
  core.fd_turn_release()
end

return M
