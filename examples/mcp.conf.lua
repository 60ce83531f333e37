-- examples/mcp.conf.lua: an MCP server allow-list. The container sees the
-- listed tools as mcp_0_search and mcp_0_fetch_page and may call only those,
-- with single tools/call requests through the broker (POST /mcp/docs); the
-- server's URL and token stay on the host.
--
--   export MODEL_API_KEY=... DOCS_MCP_TOKEN=...
--   sbx run examples/mcp.conf.lua --channel demo:docs --speaker alice:Alice \
--     "Find the page about rate limits"
--
-- List only tools you would let every guest of every sandbox channel call.
-- The upstream must be a trusted Streamable HTTP endpoint answering JSON; the
-- broker refuses answers that reflect the token back.
local sandbox = require "sandbox"

local home = os.getenv("HOME")
if not home or home == "" then error("HOME is required", 0) end

return sandbox {
  image = "pi-roundtable-sandbox:local",
  runRoot = "/tmp/roundtable-sandbox-run",
  workspaceRoot = home .. "/.local/share/roundtable-sandbox/workspaces",
  stateFile = home .. "/.local/share/roundtable-sandbox/state/channels.json",
  model = "operator-selected-model",
  modelUrl = "https://api.openai.com/v1/chat/completions",
  apiKey = function() return os.getenv("MODEL_API_KEY") end,
  mcp = {
    {
      name = "docs",
      url = "https://mcp.example.com/mcp",
      -- Optional: a token for this server, read on the host for each call.
      apiKey = function(_scope) return os.getenv("DOCS_MCP_TOKEN") end,
      tools = {
        {
          name = "search",
          description = "Search the product documentation",
          parameters = {
            type = "object",
            properties = { query = { type = "string", description = "what to look for" } },
            required = { "query" },
            additionalProperties = false,
          },
        },
        {
          name = "fetch_page",
          description = "Read one documentation page by its id",
          parameters = {
            type = "object",
            properties = { id = { type = "string" } },
            required = { "id" },
            additionalProperties = false,
          },
        },
      },
    },
  },
}
