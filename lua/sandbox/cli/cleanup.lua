-- cli/cleanup.lua: `sbx cleanup`. The sealed worker, container driver and runtime
-- it needs are not built yet (issue 3); until then it says so.
local M = {}

M.help = "usage: sbx cleanup ...\n\nNot built yet: sealed turns need the worker and the container runtime.\n"

function M.run()
  io.stderr:write("sbx cleanup: not built yet (the sealed worker and runtime come next)\n")
  return 1
end

return M
