-- signal.lua: cancellation signals, as host callbacks see them in ctx.signal.
--   sig.aborted            boolean field
--   sig.reason             why ("turn ended", "client closed", "deadline", ...)
--   sig:throw_if_aborted() raises signal.AbortError when aborted
--   sig:on_abort(fn)       fn(reason) once when it aborts (at once if it has);
--                          returns a function that removes the handler
-- Only the owner calls abort(); a child made with signal.child(parent) aborts
-- with its parent.
local M = {}

local Signal = {}
Signal.__index = Signal

M.AbortError = setmetatable({}, { __tostring = function() return "aborted" end })

function M.new()
  return setmetatable({ aborted = false, reason = nil, _handlers = {} }, Signal)
end

function Signal:abort(reason)
  if self.aborted then return false end
  self.aborted = true
  self.reason = reason or "aborted"
  local hs = self._handlers
  self._handlers = {}
  for _, h in ipairs(hs) do
    if h.fn then
      local ok, err = pcall(h.fn, self.reason)
      if not ok and os.getenv("SBX_DEBUG") then io.stderr:write("sbx: abort handler: ", tostring(err), "\n") end
    end
  end
  return true
end

function Signal:on_abort(fn)
  if self.aborted then
    pcall(fn, self.reason)
    return function() end
  end
  local h = { fn = fn }
  self._handlers[#self._handlers + 1] = h
  return function() h.fn = nil end
end

function Signal:throw_if_aborted()
  if self.aborted then error(M.AbortError, 2) end
end

-- A signal that aborts when parent does (or by itself).
function M.child(parent)
  local s = M.new()
  if parent then
    local remove = parent:on_abort(function(reason) s:abort(reason) end)
    s._detach = remove
  end
  return s
end

-- Removes the link to the parent (so a long-lived parent does not keep it).
function Signal:detach()
  if self._detach then self._detach(); self._detach = nil end
end

return M
