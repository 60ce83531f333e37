-- provider_seam_spec.lua: the provider seam (shared/review/one-engine.md,
-- "The shape to reach" 3): lua/sandbox/providers/ has one module per wire
-- format and is the only host code that reads a provider's wire members;
-- the broker, the reasons and the metrics read the facts it returns.
local json = require "sandbox.json"
local openai_chat = require "sandbox.providers.openai_chat"

local function lua_files(dir)
  local p = assert(io.popen("find " .. dir .. " -name '*.lua' | LC_ALL=C sort"))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- Lines of code (comments left out) that name a wire member.
local function code_mentions(path, word)
  local hits = {}
  for line in io.lines(path) do
    local code = line:gsub("%-%-.*$", "")
    if code:find(word, 1, true) then hits[#hits + 1] = line end
  end
  return hits
end

describe("openai_chat.reply_facts", function()
  it("says a reply holds a message, its finish and whether it calls tools", function()
    local f = openai_chat.reply_facts(json.decode(
      '{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]},"finish_reason":"tool_calls"}]}'))
    assert.same({ message = true, finish = "tool_calls", tool_calls = true }, f)
  end)

  it("names an unknown finish_reason other and a missing message false", function()
    local f = openai_chat.reply_facts(json.decode('{"choices":[{"finish_reason":"weird"}]}'))
    assert.same({ message = false, finish = "other", tool_calls = false }, f)
  end)

  it("gives no facts for a body that is not a reply", function()
    assert.same({ message = false, tool_calls = false }, openai_chat.reply_facts(json.decode("[1]")))
    assert.same({ message = false, tool_calls = false }, openai_chat.reply_facts(nil))
  end)
end)

describe("openai_chat.auth_headers", function()
  it("sends the credential as modelAuth says", function()
    assert.same({ "Content-Type: application/json", "Accept: application/json", "Authorization: Bearer k" },
      openai_chat.auth_headers("bearer", "k"))
    assert.same({ "Content-Type: application/json", "Accept: application/json", "api-key: k" },
      openai_chat.auth_headers("api-key", "k"))
    assert.same({ "Content-Type: application/json", "Accept: application/json" },
      openai_chat.auth_headers("none", nil))
  end)
end)

describe("openai_chat.error_tokens", function()
  it("keeps code, type and param tokens and never the message", function()
    local t = openai_chat.error_tokens(
      '{"error":{"message":"secret sk-123 echoed","type":"invalid_request_error","code":"bad","param":"max_tokens"}}')
    assert.same({ code = "bad", type = "invalid_request_error", param = "max_tokens" }, t)
  end)

  it("reads an Anthropic error body's type", function()
    local t = openai_chat.error_tokens('{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')
    assert.same({ type = "overloaded_error" }, t)
  end)

  it("drops a token that holds the credential", function()
    local filter = { hit = function(_, v) return v == "sk-secret" end }
    assert.same({}, openai_chat.error_tokens('{"error":{"code":"sk-secret"}}', filter))
  end)
end)

describe("the provider seam", function()
  it("keeps the OpenAI Chat Completions reply members inside lua/sandbox/providers/", function()
    local outside = {}
    for _, path in ipairs(lua_files("lua/sandbox")) do
      if not path:find("^lua/sandbox/providers/") and not path:find("/cli/_demo_model%.lua$") then
        for _, word in ipairs({ '"choices"', ".choices", "finish_reason" }) do
          for _, line in ipairs(code_mentions(path, word)) do outside[#outside + 1] = path .. ": " .. line end
        end
      end
    end
    assert.same({}, outside)
  end)

  it("is the only place that builds the model route's api-key header (MCP's Bearer is the broker's)", function()
    local outside = {}
    for _, path in ipairs(lua_files("lua/sandbox")) do
      if not path:find("^lua/sandbox/providers/") and not path:find("^lua/sandbox/rich/") then
        for _, line in ipairs(code_mentions(path, '"api-key: "')) do
          outside[#outside + 1] = path .. ": " .. line
        end
      end
    end
    assert.same({}, outside)
  end)

  it("keeps the Anthropic Messages headers and rebuild inside lua/sandbox/providers/", function()
    local outside = {}
    for _, path in ipairs(lua_files("lua/sandbox")) do
      if not path:find("^lua/sandbox/providers/") then
        for _, word in ipairs({ '"anthropic-version"', "anthropic%-ratelimit", '"x-should-retry"', "thinking.budget_tokens" }) do
          for _, line in ipairs(code_mentions(path, word)) do outside[#outside + 1] = path .. ": " .. line end
        end
      end
    end
    assert.same({}, outside)
  end)
end)

describe("anthropic_messages", function()
  local anthropic = require "sandbox.providers.anthropic_messages"
  it("rebuilds the request headers: fixed ones, the bearer, the copy list without control characters", function()
    local h = anthropic.request_headers({ ["anthropic-version"] = "2023-06-01", ["x-api-key"] = "sk-guest",
      ["anthropic-beta"] = "a\r\nb: c", cookie = "x" }, "tok")
    assert.equal("Bearer tok", h.authorization)
    assert.equal("2023-06-01", h["anthropic-version"])
    assert.is_nil(h["x-api-key"])
    assert.is_nil(h["anthropic-beta"])
    assert.is_nil(h.cookie)
  end)

  it("keeps only the response headers 11.5 lists", function()
    for _, n in ipairs { "content-type", "request-id", "retry-after", "x-should-retry", "anthropic-ratelimit-requests-limit" } do
      assert.is_true(anthropic.response_header_kept(n), n)
    end
    for _, n in ipairs { "set-cookie", "x-api-key", "mcp-session-id", "cf-ray" } do
      assert.is_false(anthropic.response_header_kept(n), n)
    end
  end)
end)

