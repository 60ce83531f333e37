-- precheck/_describe.lua: the guide text a model reads before it writes a
-- precheck script (shared/spec/precheck.md 3), built from a checked grant.
-- The quoted fragments are the spec's; the rest is worded for the model.
local M = {}

local LINES = {
  "A precheck script is a JavaScript ES module run before a scheduled turn: "
    .. "`export default async ({ mcp, firedAt, timeZone, today, schedule }) => result`.",
  "Return `{ wake: false, note? }` to skip the turn (a note is posted in small text) or "
    .. "`{ wake: true, context }` to wake the agent with `context`; any other value, a throw, "
    .. "or running out of time wakes the agent with the error.",
  "`today` is the date in the host's time zone (YYYY-MM-DD): hand it to tools as it is "
    .. "instead of deriving a UTC date; `firedAt` is the firing instant as a Date object and "
    .. "`timeZone` the host's IANA zone name.",
  "Await each MCP call before the next one (calls never run in parallel); console output "
    .. "is discarded and only the returned value counts.",
  "Name the server and the tool of every call as literal strings: the host reads them when "
    .. "the script is saved, a run may call only those, and a held tool needs the owner's "
    .. "approval once, at save time.",
  "`mcp.call(server, tool, args)` returns the raw MCP tool result; `mcp.json(server, tool, "
    .. "args)` returns its structured content, else its first text item decoded as JSON; "
    .. "both throw when the tool reports an error.",
  "Inside its container the script has no network, no host file and no credential; the MCP "
    .. "tools listed here are its only reach.",
}

-- servers: the checked grant (lua/sandbox/precheck/_grant.lua), in order.
-- A server granted no tool cannot be called and is not listed.
function M.text(servers)
  local out = {}
  for i, l in ipairs(LINES) do out[i] = l end
  local reach = {}
  for _, s in ipairs(servers) do
    if #s.tools > 0 then reach[#reach + 1] = "- " .. s.name .. ": " .. table.concat(s.tools, ", ") end
  end
  if #reach == 0 then
    out[#out + 1] = "This script can call no MCP server, so it can only decide from the date and time."
  else
    out[#out + 1] = "MCP tools this script may call (server: tools):"
    for _, l in ipairs(reach) do out[#out + 1] = l end
  end
  return table.concat(out, "\n")
end

return M
