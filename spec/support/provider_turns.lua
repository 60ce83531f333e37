-- provider_turns.lua: one sealed turn per provider family of
-- spec/providers.md ("Behaviours the specs must cover" 7) against that
-- family's loopback server (spec/fixtures/provider_upstream.mjs), shared by
-- spec/provider_turns_spec.lua (the real worker Lua on the host, over the
-- turn's real broker socket) and spec/docker/provider_turns_spec.lua (the
-- real image in real Docker). Each case names the options the README's
-- "Using it with your provider" gives that family.
--
--   local P = require "provider_turns"
--   P.FAMILIES                       -- {name, options, text, check(requests)}
--   P.runtime(root, family_case, upstream, driver, logger) -> rt
local sandbox = require "sandbox"

local P = {}

P.KEY = "sk-provider-spec-7Hq2"
P.GUEST = { id = "guest", name = "Guest", principalId = "p_guest" }

-- The host tool every family's first reply asks for.
P.CLOCK = {
  name = "clock", description = "The current time.", parameters = { type = "object", properties = {} },
  run = function() return "12:00" end,
}

local function header(req, name)
  local out = {}
  for _, h in ipairs(req.headers) do
    if h[1] == name then out[#out + 1] = h[2] end
  end
  return out
end
P.header = header

-- The assistant message with tool calls in a request body (decoded).
local function asked(json, req)
  for _, m in ipairs(json.decode(req.body).messages) do
    if m.role == "assistant" and m.tool_calls then return m end
  end
end

P.FAMILIES = {
  { name = "openai", path = "/v1/chat/completions",
    options = { model = "o4-mini", outputTokensField = "max_completion_tokens", maxOutputTokens = 16000 },
    text = "openai: I'm sorry, but I can't help with that.",
    check = function(reqs, json)
      assert(#reqs == 2, "two model calls")
      for _, r in ipairs(reqs) do
        assert(header(r, "authorization")[1] == "Bearer " .. P.KEY)
        local b = json.decode(r.body)
        assert(b.max_completion_tokens == 16000 and b.max_tokens == nil, r.body)
      end
      assert(asked(json, reqs[2]).content == json.null, "a tool-only message goes back with content null")
    end },
  { name = "azure", path = "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
    options = { model = "gpt-4o", modelAuth = "api-key" },
    text = "azure: it is 12:00.",
    check = function(reqs)
      assert(#reqs == 1)
      assert(#header(reqs[1], "api-key") == 1 and header(reqs[1], "api-key")[1] == P.KEY)
      assert(#header(reqs[1], "authorization") == 0)
      assert(reqs[1].url == "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21")
    end },
  { name = "deepseek", path = "/chat/completions",
    options = { model = "deepseek-reasoner" },
    text = "deepseek: it is 12:00.",
    check = function(reqs, json)
      assert(#reqs == 2)
      assert(asked(json, reqs[2]).reasoning_content == "The guest asks for the time, so I call the clock tool first.")
    end },
  { name = "gemini", path = "/v1beta/openai/chat/completions",
    options = { model = "gemini-3-pro-preview" },
    text = "gemini: it is 12:00.",
    check = function(reqs, json)
      assert(#reqs == 2)
      local call = asked(json, reqs[2]).tool_calls[1]
      assert(call.extra_content.google.thought_signature == "CiQB0e2Kb6Vh8w3pZ9Q4xLm2nT7rYc1sU5vW0aBdEfGhIjKlMnOpQr==")
    end },
  { name = "mistral", path = "/v1/chat/completions",
    options = { model = "magistral-medium-latest" },
    text = "mistral: it is 12:00.",
    check = function(reqs) assert(#reqs == 2) end },
  { name = "openrouter", path = "/api/v1/chat/completions",
    options = { model = "openai/gpt-oss-120b" },
    text = "openrouter: it is 12:00.",
    check = function(reqs, json)
      assert(#reqs == 2)
      local a = asked(json, reqs[2])
      assert(a.tool_calls[1]["function"].arguments == "{}", "a call without arguments goes back as {}")
      assert(a.reasoning == "Need the time; the clock takes no arguments.")
    end },
  { name = "ollama", path = "/v1/chat/completions",
    options = { model = "llama3.2", modelAuth = "none" },
    text = "ollama: it is 12:00.",
    check = function(reqs)
      assert(#reqs == 2)
      for _, r in ipairs(reqs) do
        assert(#header(r, "authorization") == 0 and #header(r, "api-key") == 0, "no credential header")
      end
    end },
}

-- A runtime for one family: its options, the loopback upstream, a driver.
function P.runtime(root, case, upstream, driver, over)
  local o = {
    image = "pi-roundtable-sandbox:local",
    runRoot = root .. "/run", workspaceRoot = root .. "/work",
    modelUrl = string.format("http://127.0.0.1:%d%s", upstream.port, case.path), allowHttp = true,
    apiKey = function() return P.KEY end,
    tools = { P.CLOCK }, driver = driver, turnTimeoutMs = 60000,
    runtime = require("docker_runtime").name,   -- the docker-runsc pass
  }
  for k, v in pairs(case.options) do o[k] = v end
  if o.modelAuth == "none" then o.apiKey = nil end
  for k, v in pairs(over or {}) do o[k] = v end
  if o.driver == false then o.driver = nil end
  return sandbox.runtime(o)
end

return P
