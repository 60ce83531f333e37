-- rich/broker_model_spec.lua: the Anthropic route of a rich broker over its
-- real socket against the Anthropic-shaped SSE upstream (spec/rich-mode.md
-- 11; behaviours 52-80): the rebuilt request the upstream sees, the
-- credential of the admitting scope, refusals that never leave the host,
-- response headers, status passthrough, the reflection stream across chunks,
-- the SSE error watch and the upstream failure log.
local async = require "sandbox.async"
local core = require "sandbox.core"
local harness = require "rich_harness"
local json = require "sandbox.json"
local peer = require "rich_peer"
local upstream = require "anthropic_upstream"

local SECRET = harness.SECRET

describe("rich broker: the Anthropic route (11)", function()
  local up, h

  setup(function() up = upstream.start() end)
  teardown(function() up:stop() end)
  before_each(function()
    async.run(function() up:reset() end)
    h = harness.new { up = up }
  end)
  after_each(function() h:stop() end)

  local function run(fn) return async.run(fn) end
  local function body_of(r) return json.plain(json.decode(r.body)) end

  it("B52: the upstream sees the host secret, no cookie, the API URL, the profile's model and capped max_tokens", function()
    run(function()
      h:bind()
      local r = h:model({ model = "claude-opus-4", max_tokens = 1e6, messages = { { role = "user", content = "hi" } } },
        { "Authorization: Bearer sandbox-dummy-token", "Cookie: session=guest", "X-Api-Key: guest-key",
          "Anthropic-Version: 2023-06-01", "X-Forwarded-For: 1.2.3.4", "User-Agent: claude-cli/2.1.141" })
      assert.equal(200, r.status)
      assert.equal("https://api.anthropic.com/v1/messages", h.fetched[1].url)
      local seen = up:messages()[1]
      assert.equal("Bearer " .. SECRET, seen.headers.authorization)
      assert.is_nil(seen.headers.cookie)
      assert.is_nil(seen.headers["x-api-key"])
      assert.is_nil(seen.headers["x-forwarded-for"])
      assert.equal("2023-06-01", seen.headers["anthropic-version"])
      assert.equal("claude-cli/2.1.141", seen.headers["user-agent"])
      assert.equal("identity", seen.headers["accept-encoding"])
      assert.equal("claude-sonnet-4-6", seen.body.model)
      assert.equal(128000, seen.body.max_tokens)
    end)
  end)

  it("19: a repeated member name's last value wins, and the upstream sees one", function()
    run(function()
      h:bind()
      local r = h:post("/anthropic/v1/messages",
        '{"max_tokens":5,"messages":[{"role":"user","content":"first"}],"max_tokens":7,"messages":[{"role":"user","content":"last"}]}')
      assert.equal(200, r.status)
      local seen = up:messages()[1]
      assert.equal(7, seen.body.max_tokens)
      assert.equal("last", seen.body.messages[1].content)
    end)
  end)

  it("B53: the token is read on every model call from the bound scope, per channel and speaker", function()
    h:stop()
    local scopes = {}
    h = harness.new { up = up, over = { oauthToken = function(scope)
      scopes[#scopes + 1] = scope
      return "tok-" .. scope.channel .. "-" .. scope.speaker.principalId
    end } }
    run(function()
      local release = h:bind { channel = "discord:a", speaker = { id = "1", name = "Ann", principalId = "ann" } }
      assert.equal(200, h:model().status)
      assert.equal(200, h:model().status)
      release()
      release = h:bind { channel = "discord:b", speaker = { id = "2", name = "Bo", principalId = "bo" } }
      assert.equal(200, h:model().status)
      release()
      local auth = {}
      for i, m in ipairs(up:messages()) do auth[i] = m.headers.authorization end
      assert.same({ "Bearer tok-discord:a-ann", "Bearer tok-discord:a-ann", "Bearer tok-discord:b-bo" }, auth)
      assert.same({ channel = "discord:a", speaker = { id = "1", name = "Ann", principalId = "ann" } }, scopes[1])
      assert.equal(3, #scopes)
    end)
  end)

  it("B54: a call admitted under turn A whose body arrives after B binds uses A's token", function()
    h:stop()
    h = harness.new { up = up, over = { oauthToken = function(scope) return "tok-" .. scope.speaker.principalId end } }
    run(function()
      local releaseA = h:bind { speaker = { id = "1", name = "A", principalId = "alice" } }
      local body = json.encode(json.jsonable({ messages = { { role = "user", content = "late" } } }))
      local head = "POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        .. #body .. "\r\n\r\n"
      local got
      local unix_request = require "unix_request"
      local handle = unix_request(h.sock, head, { keep_open = true, timeout_ms = 20000 }, function(r) got = r end)
      harness.eventually(function() return h.b:stats().active == 1 end)
      releaseA()
      local releaseB = h:bind { speaker = { id = "2", name = "B", principalId = "bob" } }
      handle:write(body)
      handle:shutdown()
      harness.eventually(function() return got ~= nil end, 10000)
      assert.equal(200, peer.parse(got.data).status)
      assert.equal(200, h:model().status)
      releaseB()
      local m = up:messages()
      assert.equal("Bearer tok-alice", m[1].headers.authorization)
      assert.equal("Bearer tok-bob", m[2].headers.authorization)
    end)
  end)

  it("B55: a getter answering nil or \"\" gives 502 without reaching the upstream", function()
    for _, v in ipairs { false, "" } do
      h:stop()
      h = harness.new { up = up, over = { oauthToken = function() if v then return v end return nil end } }
      run(function()
        h:bind { turnId = "t-b55" }
        local r = h:model()
        assert.equal(502, r.status)
        assert.equal("Broker call failed", r.body)
        assert.equal("false", r.headers["x-should-retry"])   -- issue 26: final, the worker must not retry
        assert.equal(0, #up:messages())
      end)
      local w = h:warns("sandbox upstream call failed")
      assert.equal("Credential unavailable", w[1].error)
      assert.equal("t-b55", w[1].turn)      -- one turn field in every mode's lines
    end
  end)

  it("B56: an ordinary tool_use/tool_result transcript passes", function()
    run(function()
      h:bind()
      local r = h:model({ max_tokens = 100, messages = {
        { role = "user", content = "roll" },
        { role = "assistant", content = { { type = "tool_use", id = "toolu_1", name = "mcp__custom-tools__dice", input = { n = 2 } } } },
        { role = "user", content = { { type = "tool_result", tool_use_id = "toolu_1", content = "4" } } },
      }, tools = { { name = "mcp__custom-tools__dice", input_schema = { type = "object" } } } })
      assert.equal(200, r.status)
      assert.equal("tool_result", up:messages()[1].body.messages[3].content[1].type)
    end)
  end)

  it("B57-B62: refusals are 400s in the API's shape, never reach the upstream, and log once each", function()
    local cases = {
      { { messages = { { role = "assistant", content = { { type = "server_tool_use", id = "s", name = "web_search", input = {} } } } } },
        "Native tools or remote media refused" },
      { { messages = { { role = "user", content = { { type = "image", source = { type = "url", url = "https://x/y.png" } } } } } },
        "Native tools or remote media refused" },
      { { messages = { { role = "user", content = "x" } }, tools = { { name = "t", input_schema = { ["$ref"] = "https://e.example/s" } } } },
        "Remote schema or native tool refused" },
      { { messages = { { role = "user", content = "x" } }, tools = { { type = "web_search_20250305", name = "web_search" } } },
        "Remote schema or native tool refused" },
      { { messages = { { role = "user", content = "x" } }, tool_choice = { type = "tool", name = "web_search" } }, "Invalid tool choice" },
      { { messages = { { role = "user", content = "a" }, { role = "system", content = { { type = "tool_addition" } } } } },
        "messages.1.content.0: Input tag 'tool_addition'" },
      { { messages = { { role = "developer", content = "x" } } }, "Unexpected role" },
    }
    run(function()
      h:bind()
      for _, c in ipairs(cases) do
        local r = h:model(c[1])
        assert.equal(400, r.status)
        local v = body_of(r)
        assert.equal("error", v.type)
        assert.equal("invalid_request_error", v.error.type)
        assert.is_truthy(v.error.message:find(c[2], 1, true), v.error.message)
      end
      assert.equal(0, #up:messages())
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(#cases, #w)
    for _, f in ipairs(w) do
      assert.equal(400, f.status)
      assert.equal("model", f.upstream)
      assert.equal("discord:party", f.channel)
      assert.is_number(f.latencyMs)
    end
    assert.matches("input message role", w[#w].error, 1, true)
  end)

  it("B59/B63-B65/B67/B68: the upstream sees the host's caps", function()
    local function seen(level, body, target)
      local out
      run(function()
        local release = h:bind { thinking = level }
        local r = h:model(body, nil, target)
        assert.equal(200, r.status)
        release()
        local m = up:messages()
        out = m[#m].body
      end)
      return out
    end
    local adaptive = { type = "adaptive", display = "summarized" }
    local function msg(extra)
      local b = { messages = { { role = "user", content = "hi" } } }
      for k, v in pairs(extra) do b[k] = v end
      return b
    end
    assert.same({ effort = "low" }, seen("low", msg { thinking = adaptive, output_config = { effort = "max" } }).output_config)
    assert.same({ effort = "medium" }, seen("medium", msg { thinking = adaptive, output_config = { effort = "xhigh" } }).output_config)
    assert.same({ effort = "xhigh" }, seen("xhigh", msg { thinking = adaptive, output_config = { effort = "xhigh" } }).output_config)
    assert.same({ effort = "low" }, seen("high", msg { thinking = adaptive, output_config = { effort = "low" } }).output_config)
    assert.same({ effort = "low" }, seen("low", msg { thinking = adaptive }).output_config)
    assert.is_nil(seen("high", msg { thinking = adaptive }).output_config)
    assert.same({ type = "enabled", budget_tokens = 8192 }, seen("medium", msg { thinking = { type = "enabled", budget_tokens = 120000 } }).thinking)
    local x = seen("xhigh", msg { max_tokens = 64000, thinking = { type = "enabled", budget_tokens = 32000 } })
    assert.same({ 64000, 32000 }, { x.max_tokens, x.thinking.budget_tokens })
    assert.same({ effort = "max" }, seen("xhigh", msg { thinking = adaptive, output_config = { effort = "max" } }).output_config)
    local c = seen("high", msg { max_tokens = 8192, stream = true }, "/anthropic/v1/messages/count_tokens")
    assert.is_nil(c.max_tokens)
    assert.is_nil(c.stream)
    assert.equal(32001, seen("xhigh", msg { max_tokens = 8192, thinking = { type = "enabled", budget_tokens = 32000 } }).max_tokens)
    local sys = seen("low", { messages = {
      { role = "system", content = { { type = "text", text = "env", cache_control = { type = "ephemeral" } } },
        clear_at = "never", junk = 1, output_config = { effort = "max" } },
      { role = "user", content = "hi" } }, system = "string system" })
    assert.same({ role = "system", content = { { type = "text", text = "env", cache_control = { type = "ephemeral" } } },
      clear_at = "never", output_config = { effort = "low" } }, sys.messages[1])
    assert.equal("string system", sys.system)
  end)

  it("B66: with ?beta=true the SSE stream passes through with its content type", function()
    run(function()
      up:push { upstream.sse_text("Hello streamed") }
      h:bind()
      local r = h:model({ stream = true, messages = { { role = "user", content = "hi" } } }, nil, "/anthropic/v1/messages?beta=true")
      assert.equal(200, r.status)
      assert.matches("^text/event%-stream", r.headers["content-type"])
      assert.matches("event: message_start", r.body, 1, true)
      assert.matches("Hello streamed", r.body, 1, true)
      assert.equal("?beta=true", up:messages()[1].search)
      assert.equal("https://api.anthropic.com/v1/messages?beta=true", h.fetched[1].url)
    end)
  end)

  -- issue 26 (overrides 11.5's passthrough for the error BODY): the worker
  -- gets a fixed, content-free error of the upstream's type, the kept headers
  -- and x-should-retry: false; statuses a worker retries become 400.
  local function fixed(t) return '{"type":"error","error":{"type":"' .. t .. '","message":"Upstream error"}}' end

  it("B69/B70: an error status reaches the worker as a fixed, content-free body with the kept headers only", function()
    h:stop()
    h = harness.new { up = up, over = { upstreamRetries = 0 } }
    run(function()
      up:push {
        { json = { type = "error", error = { type = "invalid_request_error", message = "prompt is too long" } }, status = 400,
          headers = { ["set-cookie"] = "a=b", ["request-id"] = "req_42" } },
        { json = { type = "error", error = { type = "rate_limit_error", message = "slow down" } }, status = 429,
          headers = { ["retry-after"] = "7", ["anthropic-ratelimit-unified-status"] = "rejected", ["x-internal"] = "secret-route" } },
      }
      h:bind()
      local r = h:model()
      assert.equal(400, r.status)
      assert.equal("req_42", r.headers["request-id"])
      assert.equal("false", r.headers["x-should-retry"])
      assert.is_nil(r.headers["set-cookie"])
      assert.equal(fixed("invalid_request_error"), r.body)
      r = h:model()
      assert.equal(400, r.status)
      assert.equal(fixed("api_error"), r.body)
      assert.equal("false", r.headers["x-should-retry"])
      assert.is_nil(r.headers["retry-after"])
      assert.equal("rejected", r.headers["anthropic-ratelimit-unified-status"])
      assert.is_nil(r.headers["x-internal"])
      assert.equal("close", r.headers.connection)
    end)
  end)

  it("issue 26: 401/403/404/413/429/500/529 bodies with provider text give the worker none of it; the operator line has status, type, request id and fix", function()
    h:stop()
    h = harness.new { up = up, over = { upstreamRetries = 0 } }
    local cases = {
      { 401, "authentication_error", "OAuth token has expired. Please obtain a new token", 400, "authentication_error",
        "the provider refused the credential oauthToken returned: refresh the host's login" },
      { 403, "permission_error", "Your organization does not have access to Claude Opus", 403, "permission_error",
        "the provider refused the credential oauthToken returned: refresh the host's login" },
      { 404, "not_found_error", "model: claude-secret-internal", 404, "not_found_error", "check upstream and the profile's model" },
      { 413, "request_too_large", "Request exceeds the maximum allowed number of bytes", 413, "request_too_large" },
      { 429, "rate_limit_error", "This request would exceed your organization's rate limit of 50,000 input tokens per minute",
        400, "api_error", "the provider is rate limiting or out of quota" },
      { 500, "api_error", "Internal server error at shard 7", 400, "api_error" },
      { 529, "overloaded_error", "Overloaded", 400, "api_error" },
      { 418, "teapot_error", "I am a teapot", 418, "api_error" },
    }
    run(function()
      h:bind()
      for i, c in ipairs(cases) do
        up:push { { json = { type = "error", error = { type = c[2], message = c[3] } }, status = c[1],
          headers = { ["request-id"] = "req_case_" .. i } } }
        local r = h:model()
        assert.equal(c[4], r.status, c[3])
        assert.equal(fixed(c[5]), r.body)
        assert.is_nil(r.raw:find(c[3], 1, true))
        assert.equal("false", r.headers["x-should-retry"])
        assert.equal("application/json", r.headers["content-type"])
        assert.equal("req_case_" .. i, r.headers["request-id"])
      end
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(#cases, #w)
    for i, c in ipairs(cases) do
      assert.same({ c[1], c[2], "req_case_" .. i, c[6], 1 }, { w[i].status, w[i].type, w[i].request_id, w[i].fix, w[i].tries })
    end
  end)

  it("issue 26: a 529 five times (upstreamRetries 2) is tried three times, then one final error the worker does not retry", function()
    local over = { json = { type = "error", error = { type = "overloaded_error", message = "Overloaded" } }, status = 529,
      headers = { ["retry-after"] = "0" } }
    run(function()
      up:push { over, over, over, over, over }
      h:bind()
      local r = h:model()
      assert.equal(400, r.status)
      assert.equal(fixed("api_error"), r.body)
      assert.equal("false", r.headers["x-should-retry"])
      assert.equal(3, #up:messages())
      up:reset()
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(1, #w)
    assert.same({ 529, "overloaded_error", 3 }, { w[1].status, w[1].type, w[1].tries })
  end)

  it("issue 26: 429 with Retry-After: 1 then 200 streams the answer; the try is counted", function()
    local tries
    h:stop()
    h = harness.new { up = up, over = { audit = true } }
    run(function()
      up:push { { json = { type = "error", error = { type = "rate_limit_error", message = "slow down" } }, status = 429,
        headers = { ["retry-after"] = "1" } }, upstream.sse_text("after the wait") }
      h:bind()
      local r = h:model({ stream = true, messages = { { role = "user", content = "x" } } })
      assert.equal(200, r.status)
      assert.matches("after the wait", r.body, 1, true)
      assert.equal(2, #up:messages())
    end)
    assert.equal(0, #h:warns("sandbox upstream call failed"))
    for _, l in ipairs(h.logs) do if l.msg == "broker call" then tries = l.fields.tries end end
    assert.equal(2, tries)
  end)

  local function broken(r)
    -- the connection was destroyed mid-stream: a head, then no end of the chunked body
    return r.status == nil or not r.raw:find("\r\n0\r\n\r\n", 1, true)
  end

  it("B72/B73: a 500 whose body is the token gives the fixed error; a token split across a stream's chunks ends it content-free", function()
    h:stop()
    h = harness.new { up = up, over = { upstreamRetries = 0 } }
    run(function()
      up:push {
        { raw = SECRET, status = 500 },
        { chunks = { "data: {\"text\":\"" .. SECRET:sub(1, 12), SECRET:sub(13) .. "\"}\n\n" } },
      }
      h:bind()
      local r = peer.raw(h.sock, peer.bytes("POST", "/anthropic/v1/messages", json.encode(json.jsonable({ messages = { { role = "user", content = "x" } } }))))
      assert.is_nil(r.data:find(SECRET, 1, true))
      assert.is_nil(r.data:find(SECRET:sub(1, 12), 1, true))
      local p = peer.parse(r.data)
      assert.equal(400, p.status)
      assert.equal(fixed("api_error"), p.body)
      r = peer.raw(h.sock, peer.bytes("POST", "/anthropic/v1/messages", json.encode(json.jsonable({ messages = { { role = "user", content = "x" } } }))))
      assert.is_nil(r.data:find(SECRET, 1, true))
      assert.is_nil(r.data:find(SECRET:sub(1, 12), 1, true))
      p = peer.parse(r.data)
      assert.equal(200, p.status)
      assert.equal("event: error\ndata: " .. fixed("api_error") .. "\n\n", p.body)
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal("Credential reflected", w[#w].error)
  end)

  it("B74: the URL-encoded, base64, base64url and both hex forms are caught too", function()
    local function uri(s) return (s:gsub("[^%w%-_.!~*'()]", function(c) return string.format("%%%02X", c:byte()) end)) end
    local forms = { uri(SECRET), core.base64(SECRET), core.base64url(SECRET), core.hex(SECRET), core.hex(SECRET):upper() }
    run(function()
      h:bind()
      for _, f in ipairs(forms) do
        up:push { { raw = "{\"echo\":\"" .. f .. "\"}", status = 200 } }
        local r = h:model()
        assert.is_nil(r.raw:find(f, 1, true))
        assert.is_true(broken(r))
      end
    end)
  end)

  it("B75: an error event split across chunks of a 200 stream is logged once; the worker gets the events before it and a content-free error event", function()
    local head = upstream.sse({ { type = "message_start", message = { id = "m" } } })
    local ev = head .. 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded, provider text"}}\n\n'
    local cut = #ev - 20
    run(function()
      up:push { { chunks = { ev:sub(1, cut), ev:sub(cut + 1), upstream.sse({ { type = "error", error = { type = "again" } } }) },
        headers = { ["request-id"] = "req_mid" } } }
      h:bind()
      local r = h:model({ stream = true, messages = { { role = "user", content = "x" } } })
      assert.equal(200, r.status)
      assert.equal(head .. "event: error\ndata: " .. fixed("api_error") .. "\n\n", r.body)
      assert.is_nil(r.body:find("Overloaded", 1, true))
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(1, #w)
    assert.same({ 200, "overloaded_error", "req_mid" }, { w[1].status, w[1].type, w[1].request_id })
    assert.equal('stream error event: {"type":"error"', w[1].body:sub(1, #'stream error event: {"type":"error"'))
  end)

  it("issue 26: an overloaded_error event arriving a few bytes at a time after text events gives the worker the text and no provider text", function()
    local text = upstream.sse(upstream.sse_text("partial answer").events):match("^(.-event: content_block_stop.-\n\n)")
    local err = 'event: error\r\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded: provider says hi"}}\r\n\r\n'
    local chunks = { text }
    for i = 1, #err, 3 do chunks[#chunks + 1] = err:sub(i, i + 2) end
    run(function()
      up:push { { chunks = chunks } }
      h:bind()
      local r = h:model({ stream = true, messages = { { role = "user", content = "x" } } })
      assert.equal(200, r.status)
      assert.equal(text .. "event: error\ndata: " .. fixed("api_error") .. "\n\n", r.body)
      assert.is_nil(r.raw:find("provider says hi", 1, true))
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.same({ 200, "overloaded_error" }, { w[1].status, w[1].type })
  end)

  it("B76/B77: a 529 and a 2 MiB 413 are logged with status, latency and a redacted body; the worker gets the fixed error (issue 26)", function()
    local big = string.rep("y", 2 * 1024 * 1024)
    h:stop()
    h = harness.new { up = up, over = { upstreamRetries = 0 } }
    run(function()
      up:push {
        { json = { type = "error", error = { type = "overloaded_error", message = "Overloaded, try later" } }, status = 529 },
        { raw = big, status = 413 },
      }
      h:bind()
      local r = h:model()
      assert.equal(400, r.status)
      assert.equal(fixed("api_error"), r.body)
      r = h:model()
      assert.equal(413, r.status)
      assert.equal(fixed("api_error"), r.body)
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.same({ 529, 413 }, { w[1].status, w[2].status })
    assert.equal("model", w[1].upstream)
    assert.equal("discord:party", w[1].channel)
    assert.is_number(w[1].latencyMs)
    assert.matches("overloaded", w[1].body:lower(), 1, true)
    assert.is_true(utf8.len(w[2].body) <= 2000)
    for _, f in ipairs(w) do
      local all = json.encode(json.jsonable(f))
      assert.is_nil(all:find(SECRET, 1, true))
      assert.is_nil(all:find(core.base64(SECRET), 1, true))
    end
  end)

  it("B76: a 529 whose body echoes the token raw and in base64 is logged with that body redacted; the worker gets none of it", function()
    local echo = '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded for '
      .. SECRET .. " aka " .. core.base64(SECRET) .. '"}}'
    h:stop()
    h = harness.new { up = up, over = { upstreamRetries = 0 } }
    run(function()
      up:push { { raw = echo, status = 529 } }
      h:bind()
      local r = peer.raw(h.sock, peer.bytes("POST", "/anthropic/v1/messages", '{"messages":[{"role":"user","content":"x"}]}'))
      assert.is_nil(r.data:find(SECRET, 1, true))
      assert.equal(fixed("api_error"), peer.parse(r.data).body)
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(1, #w)
    assert.same({ "discord:party", "model", 529 }, { w[1].channel, w[1].upstream, w[1].status })
    assert.is_number(w[1].latencyMs)
    assert.matches("overloaded", w[1].body:lower(), 1, true)
    assert.matches("[redacted]", w[1].body, 1, true)
    local all = json.encode(json.jsonable(w[1]))
    assert.is_nil(all:find(SECRET, 1, true))
    assert.is_nil(all:find(core.base64(SECRET), 1, true))
  end)

  it("B78/B79: a thrown upstream error is logged with its cause chain; a 3xx is refused", function()
    h:stop()
    h = harness.new { up = up, over = { fetchImpl = function()
      error({ name = "Error", message = "socket hang up", cause = { name = "Error", message = "ECONNRESET" } }, 0)
    end } }
    run(function()
      h:bind()
      local r = h:model()
      assert.equal(502, r.status)
      assert.equal("Broker call failed", r.body)
      assert.equal("false", r.headers["x-should-retry"])
    end)
    assert.equal("Error: socket hang up (cause: Error: ECONNRESET)", h:warns("sandbox upstream call failed")[1].error)
    h:stop()
    h = harness.new { up = up }
    run(function()
      up:push { { raw = "moved", status = 302, headers = { location = "https://elsewhere.example/" } } }
      h:bind()
      local r = h:model()
      assert.equal(502, r.status)
      assert.equal("Broker call failed", r.body)
    end)
    assert.equal(302, h:warns("sandbox upstream call failed")[1].status)
  end)

  it("B80: a response over 50 MiB breaks the stream #slow", function()
    run(function()
      up:push { { fill = 50 * 1024 * 1024 + 1, chunkBytes = 1024 * 1024 } }
      h:bind()
      local r = peer.raw(h.sock, peer.bytes("POST", "/anthropic/v1/messages", '{"messages":[]}'),
        { timeout_ms = 120000, max_bytes = 60 * 1024 * 1024 })
      local head = r.data:sub(1, 200)
      assert.is_true(r.ok, tostring(r.error) .. " " .. head)
      assert.equal("HTTP/1.1 200", r.data:sub(1, 12), head)
      assert.is_true(broken(peer.parse(r.data)))
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal(1, #w, json.encode(json.jsonable(h.logs)))
    assert.equal("Response too large", w[1].error)
  end)
end)
