-- providers_spec.lua: the broker's side of spec/providers.md ("Behaviours the
-- specs must cover" 1-4 and 6) over its real Unix socket, against a real
-- loopback upstream (spec/fixtures/fake_upstream.mjs): the three options,
-- the credential header each modelAuth sends, the forced body's output
-- field, the rebuilt members real providers need (content null beside tool
-- calls, reasoning, extra_content) and what the operator log keeps of a
-- provider's refusal. The worker's side is spec/worker_providers_spec.lua;
-- a sealed turn per provider family is spec/provider_turns_spec.lua.
local async = require "sandbox.async"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local H = require "broker_harness"
local C = require "log_capture"
local fake_upstream = require "fake_upstream"

local run = async.run
local fake

setup(function() fake = fake_upstream.start() end)
teardown(function() if fake then fake:stop() end end)

-- Runs fn(broker, socket, capture) against a fresh broker on the fake.
local function with_broker(over, fn, script)
  return run(function()
    fake:reset()
    if script then fake:script(script) end
    local cap = C.new()
    local o = H.options(fake, over)
    if o.apiKey == false then o.apiKey = nil end        -- `apiKey = false`: no hook at all
    o.recorder = cap.recorder
    local b, path, dir = H.start(o)
    local ok, err = pcall(fn, b, path, cap)
    H.finish(b, dir)
    if not ok then error(err, 0) end
  end)
end

local function sent() return fake:log() end

local function header_values(req, name)
  local out = {}
  for _, h in ipairs(req.headers) do
    if h[1] == name then out[#out + 1] = h[2] end
  end
  return out
end

local function message_body(msg_json)
  return '{"messages":[' .. msg_json .. ']}'
end

local ASSISTANT_CALL = '{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
  .. '"function":{"name":"lookup","arguments":"{}"}}]}'

describe("the model route's options (providers.md 1, item 1)", function()
  local base = { model = "m", modelUrl = "https://models.example/v1/chat/completions",
    apiKey = function() return "k" end, channel = "fake:guests", speaker = H.SPEAKER }
  local function build(over)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(over) do o[k] = v end
    local ok, b = pcall(sandbox.broker, o)
    if not ok then return b end
    return b.cfg
  end

  it("defaults to bearer, 4096 tokens in max_tokens", function()
    local cfg = build {}
    assert.equal("bearer", cfg.modelAuth)
    assert.equal(4096, cfg.maxOutputTokens)
    assert.equal("max_tokens", cfg.outputTokensField)
  end)

  it("refuses anything else with the spec's strings", function()
    for _, v in ipairs { "Bearer", "basic", "", 1, true } do
      assert.equal('modelAuth must be "bearer", "api-key" or "none"', build { modelAuth = v })
    end
    for _, v in ipairs { 0, 200001, 1.5, "4096", -1 } do
      assert.equal("maxOutputTokens must be 1 to 200000", build { maxOutputTokens = v })
    end
    for _, v in ipairs { "max_output_tokens", "MAX_TOKENS", 4096 } do
      assert.equal('outputTokensField must be "max_tokens" or "max_completion_tokens"', build { outputTokensField = v })
    end
    assert.equal(200000, build({ maxOutputTokens = 200000 }).maxOutputTokens)
    assert.equal(1, build({ maxOutputTokens = 1 }).maxOutputTokens)
  end)

  it("sandbox{} takes the same names and refuses an apiKey with modelAuth none", function()
    local o = { image = "i", runRoot = "/r", workspaceRoot = "/w", stateFile = "/s/c.json", model = "m",
      modelUrl = "http://127.0.0.1:11434/v1/chat/completions", allowHttp = true,
      modelAuth = "none", maxOutputTokens = 8192, outputTokensField = "max_completion_tokens" }
    local app = sandbox(o)
    assert.equal("none", app.broker_config.modelAuth)
    assert.equal(8192, app.broker_config.maxOutputTokens)
    o.apiKey = function() return "ollama" end
    local ok, err = pcall(sandbox, o)
    assert.is_false(ok)
    assert.equal('apiKey is unused when modelAuth is "none"', err)
    local bok, berr = pcall(sandbox.broker, { model = "m", modelUrl = o.modelUrl, allowHttp = true,
      modelAuth = "none", apiKey = o.apiKey, channel = "fake:guests", speaker = H.SPEAKER })
    assert.is_false(bok)
    assert.equal('apiKey is unused when modelAuth is "none"', berr)
    assert.equal('modelAuth must be "bearer", "api-key" or "none"',
      select(2, pcall(sandbox, { model = "m", modelUrl = o.modelUrl, allowHttp = true, modelAuth = "x" })))
  end)
end)

describe("the credential header of each modelAuth (item 2)", function()
  it("api-key sends exactly one api-key header and no Authorization", function()
    with_broker({ modelAuth = "api-key" }, function(_, path)
      assert.equal(200, H.post(path, "/model").status)
      local req = sent()[1]
      assert.same({ H.KEY }, header_values(req, "api-key"))
      assert.same({}, header_values(req, "authorization"))
    end)
  end)

  it("bearer sends Authorization: Bearer and no api-key", function()
    with_broker({}, function(_, path)
      assert.equal(200, H.post(path, "/model").status)
      local req = sent()[1]
      assert.same({ "Bearer " .. H.KEY }, header_values(req, "authorization"))
      assert.same({}, header_values(req, "api-key"))
    end)
  end)

  it("none sends neither, never calls apiKey, and does not filter the reply", function()
    -- Ollama's replies hold its system fingerprint `fp_ollama`; with no
    -- credential there is nothing to reflect
    local reply = { status = 200, body = '{"system_fingerprint":"fp_ollama","choices":[{"message":'
      .. '{"role":"assistant","content":"ollama says hi"}}]}' }
    with_broker({ modelAuth = "none", apiKey = false }, function(_, path)
      local r = H.post(path, "/model")
      assert.equal(200, r.status)
      assert.truthy(r.body:find("fp_ollama", 1, true))
      local req = sent()[1]
      assert.same({}, header_values(req, "authorization"))
      assert.same({}, header_values(req, "api-key"))
    end, { reply })
  end)

  it("the same reply with the placeholder key as a bearer credential is refused, naming the fix", function()
    local reply = { status = 200, body = '{"system_fingerprint":"fp_ollama","choices":[{"message":'
      .. '{"role":"assistant","content":"hi"}}]}' }
    with_broker({ apiKey = function() return "ollama" end }, function(_, path, cap)
      local r = H.post(path, "/model")
      assert.equal(502, r.status)
      assert.equal("broker call failed", r.body)
      local line = cap:find("model reply refused")
      assert.truthy(line, table.concat(cap.lines, "\n"))
      local p = C.parse_text(line)
      assert.equal("reflection", p.fields.reason)
      assert.equal("/model", p.fields.route)
      assert.equal('the upstream echoed the credential; if it is not a secret (a local server\'s placeholder), '
        .. 'use modelAuth = "none"', p.fields.fix)
    end, { reply })
  end)
end)

describe("the forced body (item 3)", function()
  it("carries max_completion_tokens, not max_tokens, with the configured limit; the guest's own are dropped", function()
    with_broker({ outputTokensField = "max_completion_tokens", maxOutputTokens = 12000 }, function(_, path)
      local r = H.post(path, "/model",
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":99999}')
      assert.equal(200, r.status)
      assert.equal('{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":false,'
        .. '"max_completion_tokens":12000}', sent()[1].body)
    end)
  end)

  it("keeps max_tokens by default, with the tools before stream", function()
    with_broker({ maxOutputTokens = 7 }, function(_, path)
      H.post(path, "/model", '{"messages":[],"tools":[],"max_completion_tokens":3}')
      assert.equal('{"model":"test-model","messages":[],"tools":[],"stream":false,"max_tokens":7}', sent()[1].body)
    end)
  end)
end)

describe("the rebuilt members real providers need (item 4)", function()
  local function status_of(path, msgs)
    return H.post(path, "/model", message_body(msgs)).status
  end

  it("accepts content null only beside a non-empty tool_calls", function()
    with_broker({}, function(_, path)
      assert.equal(200, status_of(path, ASSISTANT_CALL .. ',{"role":"tool","tool_call_id":"c1","content":"x"}'))
      assert.equal('{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
        .. '"function":{"name":"lookup","arguments":"{}"}}]}',
        json.encode(json.decode(sent()[1].body).messages[1]))
      assert.equal(400, status_of(path, '{"role":"assistant","content":null}'))
      assert.equal(400, status_of(path, '{"role":"assistant","content":null,"tool_calls":[]}'))
      assert.equal(400, status_of(path, '{"role":"user","content":null}'))
      assert.equal(400, status_of(path, '{"role":"tool","tool_call_id":"c1","content":null}'))
      assert.equal(1, #sent())
    end)
  end)

  it("forwards reasoning_content and reasoning unchanged within 65,536 bytes encoded, refuses more", function()
    with_broker({}, function(_, path)
      local fits = string.rep("r", 65536 - 2)            -- its JSON string literal: 65,536 bytes
      local msg = '{"role":"assistant","content":null,"reasoning_content":"' .. fits .. '","reasoning":"why",'
        .. '"tool_calls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{}"}}]}'
      assert.equal(200, status_of(path, msg))
      local fwd = json.decode(sent()[1].body).messages[1]
      assert.equal(fits, fwd.reasoning_content)
      assert.equal("why", fwd.reasoning)
      local over = msg:gsub(fits, fits .. "r")
      assert.equal(400, status_of(path, over))
      assert.equal(400, status_of(path, '{"role":"assistant","content":"x","reasoning":5}'))
      assert.equal(400, status_of(path, '{"role":"assistant","content":"x","reasoning_content":null}'))
      assert.equal(400, status_of(path, '{"role":"user","content":"x","reasoning_content":"no"}'))
      -- an escape counts as what it encodes to: 32,767 newlines are 65,534 bytes + quotes
      assert.equal(200, status_of(path, '{"role":"assistant","content":"x","reasoning":"'
        .. string.rep("\\n", 32767) .. '"}'))
      assert.equal(400, status_of(path, '{"role":"assistant","content":"x","reasoning":"'
        .. string.rep("\\n", 32768) .. '"}'))
    end)
  end)

  it("forwards a tool call's extra_content object as parsed within 16,384 bytes, refuses more or a non-object", function()
    with_broker({}, function(_, path)
      local sig = '{"google":{"thought_signature":"c2lnbmF0dXJl"}}'
      local call = '{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{}"},"extra_content":%s,"index":0}'
      local function msg(extra) return '{"role":"assistant","content":null,"tool_calls":[' .. call:format(extra) .. ']}' end
      assert.equal(200, status_of(path, msg(sig)))
      local fwd = json.decode(sent()[1].body).messages[1].tool_calls[1]
      assert.equal('{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{}"},'
        .. '"extra_content":{"google":{"thought_signature":"c2lnbmF0dXJl"}}}', json.encode(fwd))
      local fill = string.rep("s", 16384 - #'{"x":""}')
      assert.equal(200, status_of(path, msg('{"x":"' .. fill .. '"}')))
      assert.equal(400, status_of(path, msg('{"x":"' .. fill .. 's"}')))
      assert.equal(400, status_of(path, msg('"c2lnbmF0dXJl"')))
      assert.equal(400, status_of(path, msg("[]")))
      assert.equal(400, status_of(path, msg("null")))
    end)
  end)
end)

describe("a provider's refusal in the operator log (providers.md 4, item 6)", function()
  it("never forwards a non-2xx body; the log keeps only the whitelisted tokens", function()
    local body = json.encode(json.object({ "error" }, { error = json.object({ "message", "type", "param", "code" }, {
      message = "Incorrect API key provided: " .. H.KEY .. ". You can find your API key at https://x.example/keys",
      type = "invalid_request_error", param = json.null, code = "invalid_api_key" }) }))
    with_broker({}, function(_, path, cap)
      local r = H.post(path, "/model")
      assert.equal(502, r.status)
      assert.equal("broker call failed", r.body)
      local line = cap:find("model call refused upstream")
      assert.truthy(line, table.concat(cap.lines, "\n"))
      local p = C.parse_text(line)
      assert.equal("401", p.fields.status)
      assert.equal("invalid_api_key", p.fields.code)
      assert.equal("invalid_request_error", p.fields.type)
      assert.is_nil(p.fields.param)
      assert.equal("check the credential apiKey returns for this channel", p.fields.fix)
      for _, l in ipairs(cap.lines) do
        assert.is_nil(l:find(H.KEY, 1, true), l)
        assert.is_nil(l:find("Incorrect", 1, true), l)
        assert.is_nil(l:find("x.example", 1, true), l)
      end
      local audit = C.parse_text(assert(cap:find("broker call ")))
      assert.equal("502", audit.fields.status)
      assert.equal("upstream_status", audit.fields.reason)
      assert.equal("401", audit.fields.upstream_status)
    end, { { status = 401, headers = { ["Content-Type"] = "application/json" }, body = body } })
  end)

  it("drops a token that holds the credential, and one that is not a short plain token", function()
    local body = '{"error":{"code":"' .. H.KEY .. '","type":"has spaces","param":"' .. string.rep("p", 65) .. '"}}'
    with_broker({}, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      local p = C.parse_text(assert(cap:find("model call refused upstream")))
      assert.same({ "channel", "turn", "route", "status", "fix" }, p.order)
      assert.is_nil(table.concat(cap.lines, "\n"):find(H.KEY, 1, true))
    end, { { status = 403, body = body } })
  end)

  it("names the provider's request id on the operator line (x-request-id before request-id), never to the guest", function()
    local body = '{"error":{"type":"rate_limit_error","message":"slow down"}}'
    with_broker({ upstreamRetries = 0 }, function(_, path, cap)
      local r = H.post(path, "/model")
      assert.equal(502, r.status)
      assert.is_nil(r.body:find("req_", 1, true))
      local p = C.parse_text(assert(cap:find("model call refused upstream")))
      assert.equal("req_abc-123", p.fields.request_id)
      assert.equal("req_abc-123", C.parse_text(assert(cap:find("broker call "))).fields.request_id)
    end, { { status = 429, headers = { ["request-id"] = "req_other", ["x-request-id"] = "req_abc-123" }, body = body } })
  end)

  it("keeps Azure's apim-request-id, and drops a request id that holds the credential or is not a plain token", function()
    with_broker({ upstreamRetries = 0 }, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      assert.equal("0a1b2c3d-4e5f", C.parse_text(assert(cap:find("model call refused upstream"))).fields.request_id)
    end, { { status = 500, headers = { ["apim-request-id"] = "0a1b2c3d-4e5f" }, body = "{}" } })
    with_broker({ upstreamRetries = 0 }, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      local p = C.parse_text(assert(cap:find("model call refused upstream")))
      assert.is_nil(p.fields.request_id)
      assert.is_nil(table.concat(cap.lines, "\n"):find(H.KEY, 1, true))
    end, { { status = 500, headers = { ["x-request-id"] = H.KEY, ["request-id"] = "has spaces in it" }, body = "{}" } })
  end)

  it("names the outputTokensField fix for a 400 unsupported_parameter max_tokens", function()
    local body = '{"error":{"message":"Unsupported parameter: \'max_tokens\' is not supported with this model. '
      .. 'Use \'max_completion_tokens\' instead.","type":"invalid_request_error","param":"max_tokens",'
      .. '"code":"unsupported_parameter"}}'
    with_broker({}, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      local line = assert(cap:find("model call refused upstream"))
      assert.truthy(line:find(' status=400 code=unsupported_parameter ', 1, true)
        or line:find('status=400', 1, true), line)
      local p = C.parse_text(line)
      assert.equal("unsupported_parameter", p.fields.code)
      assert.equal("max_tokens", p.fields.param)
      assert.equal('set outputTokensField = "max_completion_tokens"', p.fields.fix)
      assert.truthy(line:find('fix="set outputTokensField = \\"max_completion_tokens\\""', 1, true), line)
    end, { { status = 400, body = body } })
  end)

  it("names modelAuth api-key for a 401 to a bearer key on an Azure host; 429 and 404 get theirs", function()
    local azure = "myres.openai.azure.com"
    local url = string.format("http://%s:%d/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
      azure, fake.port)
    local seam = { connectTo = { string.format("%s:%d:127.0.0.1:%d", azure, fake.port, fake.port) } }
    with_broker({ modelUrl = url, transport = seam, upstreamRetries = 0 }, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      assert.equal('set modelAuth = "api-key"', C.parse_text(assert(cap:find("model call refused"))).fields.fix)
      cap:clear()
      assert.equal(502, H.post(path, "/model").status)
      assert.equal("the provider is rate limiting or out of quota",
        C.parse_text(assert(cap:find("model call refused"))).fields.fix)
      cap:clear()
      assert.equal(502, H.post(path, "/model").status)
      assert.equal("check modelUrl and model", C.parse_text(assert(cap:find("model call refused"))).fields.fix)
    end, {
      { status = 401, body = '{"error":{"code":"401","message":"Access denied due to invalid subscription key."}}' },
      { status = 429, body = '{"error":{"code":"rate_limit_exceeded"}}' },
      { status = 404, body = '{"error":{"code":"DeploymentNotFound"}}' },
    })
  end)

  it("reads at most 4,096 bytes of the body: a longer one keeps no tokens and still fails closed", function()
    local long = '{"error":{"code":"late_code","message":"' .. string.rep("m", 5000) .. '"}}'
    local short = '{"error":"insufficient_quota"}'
    with_broker({ upstreamRetries = 0 }, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      assert.is_nil(C.parse_text(assert(cap:find("model call refused"))).fields.code)
      cap:clear()
      assert.equal(502, H.post(path, "/model").status)
      assert.equal("insufficient_quota", C.parse_text(assert(cap:find("model call refused"))).fields.code)
    end, { { status = 500, body = long }, { status = 429, body = short } })
  end)
end)

describe("the host's retry policy (broker/_retry.lua)", function()
  local retry = require "sandbox.broker._retry"
  local OK = '{"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}]}'

  it("429 with Retry-After: 1 twice, then 200: the worker gets the answer, the operator three counted tries", function()
    with_broker({}, function(b, path, cap)
      local started = require("sandbox.core").now()
      local r = H.post(path, "/model")
      local took = require("sandbox.core").now() - started
      assert.equal(200, r.status)
      assert.matches('"content":"fine"', r.body, 1, true)
      assert.equal(3, #sent())
      assert.truthy(took >= 1900, "Retry-After was honoured")
      local line = C.parse_text(assert(cap:find("broker call ")))
      assert.equal("3", line.fields.tries)
      assert.equal("200", line.fields.upstream_status)
    end, {
      { status = 429, headers = { ["Retry-After"] = "1" }, body = '{"error":{"type":"rate_limit_error"}}' },
      { status = 429, headers = { ["Retry-After"] = "1" }, body = '{"error":{"type":"rate_limit_error"}}' },
      { status = 200, headers = { ["Content-Type"] = "application/json" }, body = OK },
    })
  end)

  it("a 5xx burst is tried 1 + upstreamRetries times, then refused as the last answer says", function()
    with_broker({ upstreamRetries = 1 }, function(_, path, cap)
      assert.equal(502, H.post(path, "/model").status)
      assert.equal(2, #sent())
      local p = C.parse_text(assert(cap:find("model call refused upstream")))
      assert.equal("529", p.fields.status)
      assert.equal("2", C.parse_text(assert(cap:find("broker call "))).fields.tries)
    end, {
      { status = 500, body = "{}" },
      { status = 529, headers = { ["Retry-After"] = "0" }, body = '{"type":"error","error":{"type":"overloaded_error"}}' },
      { status = 200, body = OK },
    })
  end)

  it("never retries a refusal the upstream meant (4xx other than 429)", function()
    with_broker({}, function(_, path)
      assert.equal(502, H.post(path, "/model").status)
      assert.equal(1, #sent())
    end, { { status = 400, body = '{"error":{"code":"bad"}}' }, { status = 200, body = OK } })
  end)

  it("takes no wait that would pass the call's deadline", function()
    with_broker({ listenTimeouts = { call_ms = 1500 } }, function(_, path)
      assert.equal(502, H.post(path, "/model").status)
      assert.equal(1, #sent())           -- Retry-After 30 s is past the deadline: the 429 stands
    end, { { status = 429, headers = { ["Retry-After"] = "30" }, body = "{}" }, { status = 200, body = OK } })
  end)

  it("retries a connection that was never made, and a name that did not resolve; not a timeout", function()
    assert.is_true(retry.retryable("upstream_unreachable", { cause = "connection refused" }))
    assert.is_true(retry.retryable("upstream_unreachable", { cause = "name resolution failed" }))
    assert.is_false(retry.retryable("upstream_unreachable", { cause = "the server closed the connection without a reply" }))
    assert.is_false(retry.retryable("upstream_timeout", { cause = "timed out" }))
    assert.is_true(retry.retryable("upstream_status", { status = 503 }))
    assert.is_false(retry.retryable("upstream_status", { status = 401 }))
  end)

  it("backs off exponentially with jitter, or waits what Retry-After says", function()
    assert.equal(250, retry.delay_ms(1, {}, function() return 0 end))
    assert.equal(750, retry.delay_ms(1, {}, function() return 1 end))
    assert.equal(1000, retry.delay_ms(2, {}, function() return 0.5 end))
    assert.equal(retry.MAX_BACKOFF_MS, retry.delay_ms(10, {}, function() return 0.5 end))
    assert.equal(2000, retry.delay_ms(1, { retry_after_ms = 2000 }))
  end)

  it("upstreamRetries is 0 to 5", function()
    for _, bad in ipairs { -1, 6, 1.5, "2" } do
      local ok, err = pcall(sandbox, { image = "x", runRoot = "/tmp/never", workspaceRoot = "/tmp/never2",
        model = "m", modelUrl = "https://x.example/v1", apiKey = function() return "k" end, upstreamRetries = bad })
      assert.is_false(ok)
      assert.equal("upstreamRetries must be 0 to 5", err)
    end
  end)

  it("modelFallbacks: the next endpoint once the first is exhausted, keyed by apiKey with the endpoint in the scope", function()
    local scopes = {}
    local fb_url = fake:url("/fallback/v1/chat/completions")
    with_broker({ upstreamRetries = 0, modelFallbacks = { { modelUrl = fb_url, model = "fb-model" } },
        apiKey = function(scope)
          scopes[#scopes + 1] = scope.endpoint
          return scope.endpoint.fallback == 0 and H.KEY or "sk-fallback-key-22"
        end }, function(_, path, cap)
      local r = H.post(path, "/model")
      assert.equal(200, r.status)
      local log = sent()
      assert.equal(2, #log)
      assert.equal("/fallback/v1/chat/completions", log[2].url)
      assert.matches('"model":"fb-model"', log[2].body, 1, true)
      assert.equal(0, scopes[1].fallback)
      assert.equal(1, scopes[2].fallback)
      assert.equal("fb-model", scopes[2].model)
      assert.truthy(C.parse_text(assert(cap:find("broker call "))).fields.fallback)
    end, { { status = 503, body = "{}" }, { status = 200, headers = { ["Content-Type"] = "application/json" }, body = OK } })
  end)

  it("modelFallbacks is checked like modelUrl", function()
    for _, bad in ipairs { 5, { { modelUrl = "ftp://x/v1", model = "m" } }, { { model = "m" } },
        { { modelUrl = "https://x.example/v1", model = " " } }, { {}, {}, {}, {}, {} } } do
      local ok = pcall(sandbox, { image = "x", runRoot = "/tmp/never", workspaceRoot = "/tmp/never2",
        model = "m", modelUrl = "https://x.example/v1", apiKey = function() return "k" end, modelFallbacks = bad })
      assert.is_false(ok)
    end
  end)
end)

