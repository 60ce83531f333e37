-- worker_spec.lua: the sealed worker's Lua (worker/lua/) on the host, through
-- the turn entry's seams, against the real primitive module
-- build/worker/sbxw.so. Items refer to spec/worker.md section 9
-- ("Behaviours the specs must cover") and, for the runs against a real
-- broker, to spec/broker.md items 75-78.
local W = require "worker_harness"

if not W.available() then
  describe("sealed worker", function()
    pending("build/worker/sbxw.so is not built (run make)")
  end)
  return
end

local sbxw = W.sbxw()
local worker = W.worker()
local text = require "text"
local memory = require "memory"
local budget = require "budget"

local REFUSAL = "Tool call refused or failed."
local FAILED = { ok = false, text = "The sandbox worker failed." }
-- The failed reply naming one of the worker's own reasons (spec/operations.md 1).
local function failed(reason) return { ok = false, text = FAILED.text, reason = reason } end
local LIMIT = { ok = false, text = "The sandbox turn reached its model-call limit." }

local dirs = {}
local function workspace()
  local dir = W.tmpdir()
  dirs[#dirs + 1] = dir
  return dir
end

after_each(function()
  for _, dir in ipairs(dirs) do W.rmdir(dir) end
  dirs = {}
end)

-- Runs one turn: opts.turn (turn overrides), opts.script (W.scripted),
-- opts.dir, opts.clock. -> {reply, status, err, log, dir}
local function turn(opts)
  opts = opts or {}
  local dir = opts.dir or workspace()
  local broker, log = W.scripted(opts.script or {})
  local reply, status, err = worker.run_turn(W.turn(opts.turn),
    { workspace = dir, broker = broker, clock = opts.clock })
  return { reply = reply, status = status, err = err, log = log, dir = dir }
end

local function models(r) return W.model_requests(r.log) end

-- The messages of the n-th model request.
local function messages(r, n) return models(r)[n or 1].messages end

local function tool_messages(msgs)
  local out = {}
  for _, m in ipairs(msgs) do
    if m.role == "tool" then out[#out + 1] = m end
  end
  return out
end

local function last_assistant(msgs)
  for i = #msgs, 1, -1 do
    if msgs[i].role == "assistant" and msgs[i].tool_calls then return msgs[i] end
  end
end

local function args(t) return W.encode(t) end

local function set_args(scope, key, value, extra)
  local names, values = { "scope", "key", "text" }, { scope = scope, key = key, text = value }
  for k, v in pairs(extra or {}) do names[#names + 1] = k; values[k] = v end
  return W.encode(W.obj(names, values))
end

local function store_call(store, name, a, speaker)
  return store:run(name, a, speaker or "alice")
end

---------------------------------------------------------------- contract

describe("contract", function()
  it("prints exactly {\"ok\":true,\"text\":...} without a newline and exits 0 (item 2)", function()
    local fake = W.fake_socket({
      "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " .. #W.chat(" Hi\n")
        .. "\r\nconnection: close\r\n\r\n" .. W.chat(" Hi\n"),
    })
    finally(fake.stop)
    local out, err, rc = W.run_main(W.turn(), { workspace = workspace(), socket = fake.path })
    fake.stop()
    assert.equal('{"ok":true,"text":"Hi"}', out)
    assert.equal("", err)
    assert.equal(0, rc)
    local reply, status = worker.run_turn(W.turn(), { workspace = workspace(), broker = (W.scripted {}) })
    assert.same({ ok = true, text = "done" }, reply)
    assert.equal(0, status)
    assert.equal('{"ok":true,"text":"done"}', worker.encode_reply(reply))
  end)

  it("refuses invalid stdin with the failed reply and exit 1 (item 3)", function()
    local deep = string.rep("[", 65) .. string.rep("]", 65)
    local big = W.turn { text = string.rep("a", 262144) }
    local cases = {
      big, "\xff" .. W.turn(), W.turn():sub(1, -2), '{"text":' .. deep .. "}",
      W.turn { reset = W.null() }, W.turn { tools = W.arr { W.tool_spec("Bad-Name") } },
      W.turn { timeZone = "Mars/Olympus" }, W.turn { timeZone = "../etc/passwd" }, "",
      W.turn { speaker = W.NONE }, W.turn { tools = W.arr { W.tool_spec("clock"), W.tool_spec("clock") } },
      W.turn { mcp = W.arr { W.obj({ "server", "tools" }, { server = "catalog",
        tools = W.arr { W.tool_spec("search"), W.tool_spec("search") } }) } },
      W.turn { tools = W.NONE }, W.turn { text = 5 }, "[]",
    }
    for i, bytes in ipairs(cases) do
      local reply, status, err = worker.run_turn(bytes, { workspace = workspace(), broker = (W.scripted {}) })
      assert.same(failed("invalid_turn"), reply, "case " .. i)
      assert.equal(1, status)
      assert.equal("invalid turn", err, "case " .. i)
    end
    -- The depth rule is the decoder's: 64 levels are fine.
    local ok64 = W.turn():sub(1, -2) .. ',"extra":' .. string.rep("[", 63) .. string.rep("]", 63) .. "}"
    local reply = worker.run_turn(ok64, { workspace = workspace(), broker = (W.scripted {}) })
    assert.is_true(reply.ok)
    -- Through main(): a turn over 256 KiB and a missing zone.
    for _, bytes in ipairs { big, W.turn { timeZone = "Nowhere/Zone" } } do
      local out, err, rc = W.run_main(bytes, { workspace = workspace() })
      assert.equal('{"ok":false,"text":"The sandbox worker failed.","reason":"invalid_turn"}', out)
      assert.equal("", err)
      assert.equal(1, rc)
    end
  end)

  it("answers every internal failure with the generic reply and an empty stderr (item 4)", function()
    local r = turn { script = { model = { { 502, '{"error":"upstream"}' } } } }
    assert.same(FAILED, r.reply)
    assert.equal("broker refused", r.err)
    r = turn { script = { model = { "not json" } } }
    assert.equal("broker returned no JSON", r.err)
    r = turn { script = { model = { '{"choices":[]}' } } }
    assert.equal("invalid model response", r.err)
    assert.same(FAILED, r.reply)
    r = turn { script = { model = { function() error("boom") end } } }
    assert.same(FAILED, r.reply)
    assert.equal(1, r.status)
    -- main() with a broker that cannot be reached: the same bytes, nothing on stderr.
    local out, err, rc = W.run_main(W.turn(), { workspace = workspace(), socket = "/nonexistent/broker.sock" })
    assert.equal('{"ok":false,"text":"The sandbox worker failed."}', out)
    assert.equal("", err)
    assert.equal(1, rc)
  end)

  it("ends twelve tool-calling replies with the limit reply, exit 0 and no history (item 5)", function()
    local replies = {}
    for i = 1, 13 do
      replies[i] = W.calls { { id = "c" .. i, name = "memory_get", arguments = '{"scope":"speaker"}' } }
    end
    local r = turn { script = { model = replies } }
    assert.same(LIMIT, r.reply)
    assert.equal(0, r.status)
    assert.equal(12, #models(r))
    assert.is_nil(W.read(r.dir .. "/history.json"))
  end)

  it("sends only the speaker's id and name, never extra turn members (item 6)", function()
    local speaker = W.obj({ "id", "name", "principalId" }, { id = "alice", name = "Alice", principalId = "p-secret" })
    local r = turn { turn = { speaker = speaker, apiKey = "real-model-key", url = "https://models.example/" } }
    assert.is_true(r.reply.ok)
    local body = r.log[1].body
    assert.is_nil(body:find("p-secret", 1, true))
    assert.is_nil(body:find("real-model-key", 1, true))
    assert.is_nil(body:find("models.example", 1, true))
    assert.equal('{"speaker":{"id":"alice","name":"Alice"},"message":"hello"}', messages(r)[2].content)
  end)
end)

---------------------------------------------------------------- broker client

describe("broker client", function()
  local client = require "broker_client"

  local function response(status, body, headers)
    return "HTTP/1.1 " .. status .. " X\r\n" .. (headers or ("content-length: " .. #body .. "\r\n"))
      .. "connection: close\r\n\r\n" .. body
  end

  it("sends exactly host, content-type, content-length and the dummy bearer (item 7)", function()
    local fake = W.fake_socket { response(200, '{"ok":1}') }
    finally(fake.stop)
    sbxw.set_socket(fake.path)
    local status, body = client.request("/model", '{"messages":[]}')
    local raw = fake.requests()[1]
    fake.stop()
    assert.equal(200, status)
    assert.same({ ok = 1 }, { ok = body.ok })
    local head, sent = raw:match("^(.-)\r\n\r\n(.*)$")
    local lines = {}
    for line in (head .. "\r\n"):gmatch("(.-)\r\n") do lines[#lines + 1] = line end
    assert.equal("POST /model HTTP/1.1", lines[1])
    local names, values = {}, {}
    for i = 2, #lines do
      local n, v = lines[i]:match("^([^:]+):%s*(.-)%s*$")
      names[#names + 1] = n:lower()
      values[n:lower()] = v
    end
    assert.same({ "host", "content-type", "content-length", "authorization" }, names)
    assert.equal("broker", values.host)
    assert.equal("application/json", values["content-type"])
    assert.equal(tostring(#'{"messages":[]}'), values["content-length"])
    assert.equal("Bearer sandbox-dummy-key", values.authorization)
    assert.is_nil(values.connection)
    assert.equal('{"messages":[]}', sent)
  end)

  it("gets 200 from a real broker listener (item 8)", function()
    local b = W.broker_process()
    finally(b.stop)
    sbxw.set_socket(b.path)
    local status, body = sbxw.broker_request("/tools/echo", "{}")
    local status2, value = client.request("/tools/echo", '{"x":1}')
    b.stop()
    assert.equal(200, status)
    assert.equal('{"text":"pong"}', body)
    assert.equal(200, status2)
    assert.equal("pong", value.text)
  end)

  it("turns a non-200 answer into its status and {\"error\":\"broker refused\"} (item 9)", function()
    local fake = W.fake_socket {
      response(429, '{"error":"budget spent","detail":"secret"}'),
      response(403, "forbidden header"),
    }
    finally(fake.stop)
    sbxw.set_socket(fake.path)
    local s1, b1 = client.request("/model", "{}")
    local s2, b2 = client.request("/model", "{}")
    fake.stop()
    assert.equal(429, s1)
    assert.equal('{"error":"broker refused"}', W.encode(b1))
    assert.equal(403, s2)
    assert.equal('{"error":"broker refused"}', W.encode(b2))
  end)

  it("aborts a body over 1 MiB and refuses a non-JSON 200 (item 10)", function()
    local mib = '"' .. string.rep("a", 1048576) .. '"'
    local chunked = "5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n"
    local fake = W.fake_socket {
      response(200, mib),
      response(200, "not json"),
      response(200, '"' .. string.rep("a", 1048574) .. '"'),
      response(200, chunked, "transfer-encoding: chunked\r\n"),
      "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n[1,2]",
    }
    finally(fake.stop)
    sbxw.set_socket(fake.path)
    local results = {}
    for i = 1, 5 do results[i] = table.pack(client.request("/model", "{}")) end
    fake.stop()
    assert.same({ nil, "broker response too large" }, { results[1][1], results[1][2] })
    assert.same({ nil, "broker returned no JSON" }, { results[2][1], results[2][2] })
    assert.equal(200, results[3][1])
    assert.equal(1048574, #results[3][2])
    assert.equal(200, results[4][1])
    assert.equal(1, results[4][2].a)
    assert.equal(200, results[5][1])
    assert.equal(2, #results[5][2])
  end)
end)

---------------------------------------------------------------- loop

local function catalog(tools)
  return W.arr { W.obj({ "server", "tools" }, { server = "catalog", tools = W.arr(tools) }) }
end

describe("loop, registry and normalization", function()
  it("lists invalid_tool, the memory tools, host_<name> and mcp_<i>_<tool> in order (item 11)", function()
    local extra = W.obj({ "name", "description", "parameters", "run" }, {
      name = "clock", description = "Tells the time.",
      parameters = W.obj({ "type", "properties" }, { type = "object", properties = W.obj({}, {}) }), run = "x",
    })
    local r = turn { turn = {
      tools = W.arr { extra, W.tool_spec("weather") },
      mcp = W.arr { W.obj({ "server", "tools" }, { server = "catalog", tools = W.arr { W.tool_spec("search"), W.tool_spec("lookup") } }),
                    W.obj({ "server", "tools" }, { server = "docs", tools = W.arr { W.tool_spec("search") } }) },
    } }
    local tools = models(r)[1].tools
    local names = {}
    for i, t in ipairs(tools) do
      assert.equal("function", t.type)
      names[i] = t["function"].name
    end
    assert.same({ "invalid_tool", "memory_set", "memory_get", "memory_remove", "host_clock", "host_weather",
                  "mcp_0_search", "mcp_0_lookup", "mcp_1_search" }, names)
    assert.truthy(r.log[1].body:find(
      '{"type":"function","function":{"name":"host_clock","description":"Tells the time.",'
      .. '"parameters":{"type":"object","properties":{}}}}', 1, true))
    assert.truthy(r.log[1].body:find('"name":"invalid_tool","description":"[^"]*","parameters":'
      .. '{"type":"object","properties":{},"additionalProperties":false}}'))
  end)

  it("routes host_clock and an untyped mcp_0_search to /tools/clock and /mcp/catalog (item 12)", function()
    local search = W.obj({ "id", "function" }, { id = "s1",
      ["function"] = W.obj({ "name", "arguments" }, { name = "mcp_0_search", arguments = '{"query":"tea","n":2}' }) })
    local rpc = '{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"Tea"}]}}'
    local r = turn {
      turn = { tools = W.arr { W.tool_spec("clock") }, mcp = catalog { W.tool_spec("search") } },
      script = {
        model = { W.calls { { id = "c1", type = "function", name = "host_clock", arguments = '{"zone":"UTC"}' },
                            { raw = search } }, W.chat("It is noon.") },
        tools = { clock = function() return 200, '{ "text" : "12:00" }' end },
        mcp = { catalog = function() return 200, rpc end },
      },
    }
    assert.same({ ok = true, text = "It is noon." }, r.reply)
    assert.same({ "/model", "/tools/clock", "/mcp/catalog", "/model" }, W.routes(r.log))
    assert.equal('{"zone":"UTC"}', r.log[2].body)
    assert.equal('{"method":"tools/call","params":{"name":"search","arguments":{"query":"tea","n":2}}}', r.log[3].body)
    local msgs = messages(r, 2)
    local replay = last_assistant(msgs).tool_calls
    assert.equal('{"id":"s1","type":"function","function":{"name":"mcp_0_search","arguments":"{\\"query\\":\\"tea\\",\\"n\\":2}"}}',
      W.encode(replay[2]))
    local tm = tool_messages(msgs)
    assert.equal('{"text":"12:00"}', tm[1].content)
    assert.equal("c1", tm[1].tool_call_id)
    assert.equal(rpc, tm[2].content)
    assert.equal("s1", tm[2].tool_call_id)
  end)

  it("replays bash and Memory-Get as invalid_tool with the refusal text (item 13)", function()
    local r = turn { script = { model = {
      W.calls { { id = "a", name = "bash", arguments = '{"cmd":"id"}' },
                { id = "b", name = "Memory-Get", arguments = '{"scope":"speaker"}' },
                { id = "c", name = "invalid_tool", arguments = "{}" },
                { id = "d", arguments = "{}" },
                { raw = "memory_get" },
                { raw = W.obj({ "id", "function" }, { id = "f", ["function"] = "memory_get" }) } },
    } } }
    assert.is_true(r.reply.ok)
    local msgs = messages(r, 2)
    for _, call in ipairs(last_assistant(msgs).tool_calls) do
      assert.equal("invalid_tool", call["function"].name)
    end
    for _, m in ipairs(tool_messages(msgs)) do assert.equal(REFUSAL, m.content) end
    assert.equal(6, #tool_messages(msgs))
    assert.equal("call_0_4", last_assistant(msgs).tool_calls[5].id)
    assert.equal('{"omitted":"Invalid or large arguments omitted from context."}',
      last_assistant(msgs).tool_calls[6]["function"].arguments)
    assert.same({ "/model", "/model" }, W.routes(r.log))
  end)

  it("renames a repeated call_0_1 to call_0_1_1 and pairs each reply in order (item 14)", function()
    local get = '{"scope":"speaker"}'
    local r = turn { script = { model = {
      W.calls { { id = "call_0_1", name = "memory_set", arguments = set_args("speaker", "a", "A") },
                { id = "call_0_1", name = "memory_get", arguments = get },
                { id = "call_0_1_1", name = "memory_get", arguments = '{"scope":"channel"}' },
                { id = "call_1_0", name = "memory_get", arguments = get },
                { id = "call_1_0_1", name = "memory_get", arguments = get } },
      W.calls { { id = "call_0_1", name = "memory_get", arguments = '{"scope":"speaker","key":"a"}' } },
    } } }
    assert.is_true(r.reply.ok)
    local msgs = messages(r, 3)
    local ids, tids = {}, {}
    for _, m in ipairs(msgs) do
      for _, c in ipairs(m.tool_calls or {}) do ids[#ids + 1] = c.id end
      if m.role == "tool" then tids[#tids + 1] = m.tool_call_id end
    end
    assert.same({ "call_0_1", "call_0_1_1", "call_0_2", "call_1_0", "call_1_0_1", "call_1_0_2" }, ids)
    assert.same(ids, tids)
    local tm = tool_messages(msgs)
    assert.equal("Saved.", tm[1].content)
    assert.equal('[{"key":"a","text":"A"}]', tm[2].content)
    assert.equal("[]", tm[3].content)
    assert.equal('[{"key":"a","text":"A"}]', tm[6].content)
  end)

  it("replaces a 200-character or empty id with call_<step>_<index> (item 15)", function()
    local cjk128 = string.rep("\u{4e2d}", 128)
    local r = turn { script = { model = {
      W.calls { { id = string.rep("x", 200), name = "memory_get", arguments = '{"scope":"speaker"}' },
                { id = "", name = "memory_get", arguments = '{"scope":"speaker"}' },
                { name = "memory_get", arguments = '{"scope":"speaker"}' },
                { id = cjk128, name = "memory_get", arguments = '{"scope":"speaker"}' },
                { id = cjk128 .. "a", name = "memory_get", arguments = '{"scope":"speaker"}' },
                { raw = W.obj({ "id", "function" }, { id = 5, ["function"] = W.obj({ "name", "arguments" },
                  { name = "memory_get", arguments = '{"scope":"speaker"}' }) }) } },
    } } }
    local ids = {}
    for _, c in ipairs(last_assistant(messages(r, 2)).tool_calls) do ids[#ids + 1] = c.id end
    assert.same({ "call_0_0", "call_0_1", "call_0_2", cjk128, "call_0_4", "call_0_5" }, ids)
  end)

  it("replays arguments over 2 KiB as the placeholder but runs them in full (item 16)", function()
    local long = string.rep("b", 2000)
    local a = set_args("speaker", "long", long)
    assert.is_true(text.measure(a) > 2048)
    local base = set_args("speaker", "k", "")
    local quotes = select(2, base:gsub('"', ""))
    local exact = set_args("speaker", "k", string.rep("c", 2048 - 2 - quotes - #base))
    assert.equal(2048, text.measure(exact))
    assert.is_true(text.measure(exact) <= 2048)
    local r = turn { script = { model = {
      W.calls { { id = "a", name = "memory_set", arguments = a }, { id = "b", name = "memory_set", arguments = exact } },
    } } }
    local calls = last_assistant(messages(r, 2)).tool_calls
    assert.equal('{"omitted":"Invalid or large arguments omitted from context."}', calls[1]["function"].arguments)
    assert.equal(exact, calls[2]["function"].arguments)
    assert.equal("Saved.", tool_messages(messages(r, 2))[1].content)
    local stored = W.decode(W.read(r.dir .. "/memory.json"))
    assert.equal(long, stored[1].text)
  end)

  it("refuses bad arguments and tool-route refusals and keeps looping (item 17)", function()
    local r = turn {
      turn = { tools = W.arr { W.tool_spec("clock"), W.tool_spec("down") }, mcp = catalog { W.tool_spec("search") } },
      script = {
        model = {
          W.calls { { id = "a", name = "memory_get", arguments = "[1]" },
                    { id = "b", name = "memory_get", arguments = "{bad" },
                    { id = "c", name = "memory_get", arguments = W.obj({ "scope" }, { scope = "speaker" }) },
                    { id = "d", name = "host_clock", arguments = "{}" },
                    { id = "e", name = "mcp_0_search", arguments = '{"q":1}' },
                    { id = "f", name = "host_down", arguments = "{}" },
                    { id = "g", name = "memory_get", arguments = '"x"' },
                    { id = "h", name = "memory_get" } },
          W.chat("Still here."),
        },
        tools = { clock = function() return 429, '{"error":"budget"}' end,
                  down = function() return nil, "transport" end },
        mcp = { catalog = function() return 403, "forbidden" end },
      },
    }
    assert.same({ ok = true, text = "Still here." }, r.reply)
    local tm = tool_messages(messages(r, 2))
    assert.equal(8, #tm)
    for _, m in ipairs(tm) do assert.equal(REFUSAL, m.content) end
    local calls = last_assistant(messages(r, 2)).tool_calls
    assert.equal('{"omitted":"Invalid or large arguments omitted from context."}', calls[3]["function"].arguments)
    assert.equal("{bad", calls[2]["function"].arguments)
  end)

  it("fails on more than eight calls in one reply before any runs (item 18)", function()
    local list = {}
    for i = 1, 9 do list[i] = { id = "c" .. i, name = "memory_set", arguments = set_args("speaker", "k" .. i, "v") } end
    local r = turn { script = { model = { W.calls(list) } } }
    assert.same(FAILED, r.reply)
    assert.equal("too many tool calls", r.err)
    assert.equal(1, #r.log)
    assert.is_nil(W.read(r.dir .. "/memory.json"))
    list[9] = nil
    r = turn { script = { model = { W.calls(list) } } }
    assert.is_true(r.reply.ok)
    assert.equal(8, #W.decode(W.read(r.dir .. "/memory.json")))
  end)

  it("fails a reply with content null and no tool calls (item 19)", function()
    for _, body in ipairs {
      W.chat(W.null()), W.chat(" \t\u{3000}"), W.chat(5),
      '{"choices":[{"message":{"role":"assistant"}}]}',
      '{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[]}}]}',
    } do
      local r = turn { script = { model = { body } } }
      assert.same(failed("model_no_text"), r.reply)
      assert.equal("model returned no final text", r.err)
    end
    for _, body in ipairs { "[]", '{"choices":{}}', '{"choices":[{"message":"x"}]}', '{"choices":[1]}' } do
      assert.equal("invalid model response", turn { script = { model = { body } } }.err)
    end
  end)

  it("trims the final text and returns it whole up to 100,000 characters (item 20)", function()
    local r = turn { script = { model = { W.chat("\u{3000}\u{FEFF} Answer \u{2028}\n\u{A0}") } } }
    assert.same({ ok = true, text = "Answer" }, r.reply)
    local whole = string.rep("\u{4e2d}", 99998)
    r = turn { script = { model = { W.chat(" " .. whole .. " ") } } }
    assert.is_true(r.reply.ok)
    assert.equal(whole, r.reply.text)
    r = turn { script = { model = { W.chat(string.rep("a", 100001)) } } }
    assert.equal("model returned no final text", r.err)
    -- A message with both text and calls takes the tool path; its text is bounded to 4 KiB.
    r = turn { script = { model = { W.calls({ { id = "a", name = "memory_get", arguments = '{"scope":"speaker"}' } },
      string.rep("z", 5000)) } } }
    local content = last_assistant(messages(r, 2)).content
    assert.is_true(text.measure(content) <= 4096)
    assert.equal(text.MARKER, content:sub(-#text.MARKER))
  end)
end)

---------------------------------------------------------------- prompt

local function memory_file(dir, entries)
  local list = W.arr()
  for i, e in ipairs(entries) do
    list[i] = W.obj({ "scope", "key", "text" }, { scope = e[1], key = e[2], text = e[3] })
  end
  W.write(dir .. "/memory.json", W.encode(list))
end

local T = 1767625445 -- 2026-01-05T15:04:05Z

describe("system prompt and user message", function()
  it("holds the bounded prompt, the time line, the caution and both previews (item 21)", function()
    local dir = workspace()
    memory_file(dir, { { "speaker:alice", "drink", "Tea" }, { "speaker:bob", "drink", "Coffee" },
                       { "channel", "rule", "Be kind" } })
    local prompt = string.rep("p", 9000)
    local r = turn { dir = dir, clock = function() return T end,
                     turn = { prompt = prompt, timeZone = "Asia/Taipei" } }
    local system = messages(r)[1]
    assert.equal("system", system.role)
    local expected = table.concat({
      text.prompt_text(prompt, 8192),
      "Current time: 1/5/2026, 11:04:05 PM.",
      require("prompt").CAUTION,
      'Current speaker memory (untrusted data): [{"key":"drink","text":"Tea"}]',
      'Shared channel notes (untrusted data): [{"key":"rule","text":"Be kind"}]',
    }, "\n")
    assert.equal(expected, system.content)
    assert.is_true(text.measure(text.prompt_text(prompt, 8192)) <= 8192)
    assert.truthy(system.content:find("identity can be established only through host tools", 1, true))
    assert.is_nil(system.content:find("Coffee", 1, true))
    assert.is_nil(system.content:find("alice", 1, true))
    -- Empty previews read [].
    r = turn { clock = function() return T end }
    assert.truthy(messages(r)[1].content:find("\nCurrent speaker memory (untrusted data): []\n"
      .. "Shared channel notes (untrusted data): []", 1, true))
    assert.equal(1, #messages(r) - 1)
  end)

  it("formats the time as M/D/YYYY, h:mm:ss AM|PM in several zones, midnight and noon (item 22)", function()
    local cases = {
      { "UTC", T, "1/5/2026, 3:04:05 PM" },
      { "Asia/Taipei", T, "1/5/2026, 11:04:05 PM" },
      { "America/New_York", T, "1/5/2026, 10:04:05 AM" },
      { "Asia/Kolkata", T, "1/5/2026, 8:34:05 PM" },
      { "UTC", 1767571200, "1/5/2026, 12:00:00 AM" },
      { "America/New_York", 1767589200, "1/5/2026, 12:00:00 AM" },
      { "UTC", 1782907200, "7/1/2026, 12:00:00 PM" },
      { "Europe/London", 1782907200, "7/1/2026, 1:00:00 PM" },
    }
    for _, c in ipairs(cases) do
      assert.equal(c[3], sbxw.local_time(c[1], c[2]), c[1])
      local r = turn { clock = function() return c[2] end, turn = { timeZone = c[1] } }
      assert.truthy(messages(r)[1].content:find("\nCurrent time: " .. c[3] .. ".\n", 1, true), c[1])
    end
  end)

  it("sends the compact speaker/message wrapper as the user message (item 23)", function()
    local r = turn { turn = { text = 'Say "hi"\nplease', speaker = { id = "u-1", name = "Ann \u{1F600}" } } }
    local msgs = messages(r)
    assert.equal("user", msgs[#msgs].role)
    assert.equal('{"speaker":{"id":"u-1","name":"Ann \u{1F600}"},"message":"Say \\"hi\\"\\nplease"}',
      msgs[#msgs].content)
    local long = string.rep("\u{4e2d}", 20000)
    r = turn { turn = { text = long } }
    msgs = messages(r)
    local wrapper = '{"speaker":{"id":"alice","name":"Alice"},"message":"' .. long .. '"}'
    assert.equal(text.prompt_text(wrapper, 49152), msgs[#msgs].content)
    assert.equal(text.MARKER, msgs[#msgs].content:sub(-#text.MARKER))
  end)
end)

---------------------------------------------------------------- memory

describe("memory", function()
  local function open(dir)
    return assert(memory.open(dir))
  end

  it("ignores a speaker:\"victim\" argument (item 24)", function()
    local r = turn { script = { model = {
      W.calls { { id = "a", name = "memory_set",
                  arguments = set_args("speaker", "drink", "Tea", { speaker = "victim" }) } } } } }
    assert.is_true(r.reply.ok)
    assert.equal('[{"scope":"speaker:alice","key":"drink","text":"Tea"}]', W.read(r.dir .. "/memory.json"))
  end)

  it("keeps a speaker fact from other speakers and other workspaces (item 25)", function()
    local dir, other = workspace(), workspace()
    local store = open(dir)
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "drink", text = "Tea" }))
    assert.equal("[]", store_call(store, "memory_get", { scope = "speaker" }, "bob"))
    assert.equal("[]", store_call(store, "memory_get", { scope = "speaker", key = "drink" }, "bob"))
    assert.equal("[]", store_call(store, "memory_get", { scope = "channel" }))
    assert.equal("[]", store_call(open(other), "memory_get", { scope = "speaker" }))
    assert.equal('[{"key":"drink","text":"Tea"}]', store_call(open(dir), "memory_get", { scope = "speaker" }))
  end)

  it("shows a channel note to another speaker through a case-insensitive query (item 26)", function()
    local store = open(workspace())
    store_call(store, "memory_set", { scope = "channel", key = "Tea", text = "Oolong on FRIDAYS" })
    store_call(store, "memory_set", { scope = "channel", key = "Café", text = "ÉTÉ menu" })
    assert.equal('[{"key":"Tea","text":"Oolong on FRIDAYS"}]',
      store_call(store, "memory_get", { scope = "channel", query = "tea oolong" }, "bob"))
    assert.equal('[{"key":"Tea","text":"Oolong on FRIDAYS"}]',
      store_call(store, "memory_get", { scope = "channel", query = "fridays" }, "bob"))
    assert.equal('[{"key":"Café","text":"ÉTÉ menu"}]',
      store_call(store, "memory_get", { scope = "channel", query = "CAFÉ été" }, "bob"))
    assert.equal("[]", store_call(store, "memory_get", { scope = "channel", query = "coffee" }, "bob"))
    assert.equal("[]", store_call(store, "memory_get", { scope = "channel", key = "tea" }, "bob"))
  end)

  it("reads earlier entries in a new store; removal empties the speaker list and keeps the note (item 27)", function()
    local dir = workspace()
    local store = open(dir)
    store_call(store, "memory_set", { scope = "speaker", key = "drink", text = "Tea" })
    store_call(store, "memory_set", { scope = "channel", key = "rule", text = "Be kind" })
    store_call(store, "memory_set", { scope = "speaker", key = "drink", text = "Coffee" })
    local again = open(dir)
    assert.equal('[{"key":"drink","text":"Coffee"}]', store_call(again, "memory_get", { scope = "speaker" }))
    assert.equal('[{"scope":"channel","key":"rule","text":"Be kind"},{"scope":"speaker:alice","key":"drink","text":"Coffee"}]',
      W.read(dir .. "/memory.json"))
    assert.equal("Forgotten.", store_call(again, "memory_remove", { scope = "speaker", key = " drink " }))
    assert.equal("Forgotten.", store_call(again, "memory_remove", { scope = "speaker", key = "nothing" }))
    local third = open(dir)
    assert.equal("[]", store_call(third, "memory_get", { scope = "speaker" }))
    assert.equal('[{"key":"rule","text":"Be kind"}]', store_call(third, "memory_get", { scope = "channel" }, "bob"))
  end)

  it("stores ../../host and speaker ../../person as data only (item 28)", function()
    local parent = workspace()
    local dir = parent .. "/a/b"
    local store = open(dir)
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "../../host", text = "x" }, "../../person"))
    assert.equal('[{"key":"../../host","text":"x"}]',
      store_call(open(dir), "memory_get", { scope = "speaker", key = "../../host" }, "../../person"))
    assert.equal('[{"scope":"speaker:../../person","key":"../../host","text":"x"}]', W.read(dir .. "/memory.json"))
    assert.same({ "a", "a/b", "a/b/memory.json" }, W.files(parent))
  end)

  it("refuses a bad scope, a long text and unknown tools, keeping the earlier entry (item 29)", function()
    local dir = workspace()
    local store = open(dir)
    store_call(store, "memory_set", { scope = "speaker", key = "drink", text = "Tea" })
    local before = W.read(dir .. "/memory.json")
    local cases = {
      { "memory_set", { scope = "owner", key = "drink", text = "x" }, "scope must be speaker or channel" },
      { "bash", { scope = "owner" }, "scope must be speaker or channel" },
      { "memory_set", { scope = "speaker", key = "drink", text = string.rep("a", 2049) }, "text must be 1 to 2048 characters" },
      { "memory_set", { scope = "speaker", key = "drink", text = " \u{3000} " }, "text must be 1 to 2048 characters" },
      { "memory_set", { scope = "speaker", key = "drink", text = 5 }, "text must be 1 to 2048 characters" },
      { "bash", { scope = "speaker", key = "drink" }, "unknown memory tool" },
      { "bash", { scope = "speaker" }, "key is required" },
      { "memory_set", { scope = "speaker", key = 5, text = "x" }, "key is required" },
      { "memory_set", { scope = "speaker", key = "  ", text = "x" }, "key must be 1 to 128 characters" },
      { "memory_get", { scope = "speaker", key = string.rep("k", 129) }, "key must be 1 to 128 characters" },
    }
    for _, c in ipairs(cases) do
      local ok, err = store_call(store, c[1], c[2])
      assert.is_nil(ok)
      assert.equal(c[3], err)
      assert.equal(before, W.read(dir .. "/memory.json"))
    end
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = string.rep("\u{4e2d}", 128),
      text = string.rep("\u{4e2d}", 2048) }))
    assert.equal('[{"key":"drink","text":"Tea"}]', store_call(store, "memory_get", { scope = "speaker", key = "drink" }))
  end)

  it("refuses a speaker's 33rd key while another speaker still saves; an own key is replaced (hardening.md 5)", function()
    local dir = workspace()
    local store = open(dir)
    for i = 1, 32 do
      assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "k" .. i, text = "x" }, "mallory"))
    end
    local before = W.read(dir .. "/memory.json")
    local ok, err = store_call(store, "memory_set", { scope = "speaker", key = "k33", text = "x" }, "mallory")
    assert.is_nil(ok)
    assert.equal("memory capacity reached", err)
    assert.equal(before, W.read(dir .. "/memory.json"))
    -- replacing an own key still works; another speaker and the channel still save
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "k1", text = "y" }, "mallory"))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "drink", text = "Tea" }, "alice"))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "channel", key = "note", text = "z" }, "mallory"))
    assert.equal(34, #W.decode(W.read(dir .. "/memory.json")))
    -- a new store on the same file keeps counting (startFresh does not clear memory)
    store = open(dir)
    assert.is_nil((store_call(store, "memory_set", { scope = "speaker", key = "k34", text = "x" }, "mallory")))
    -- 64 KiB per speaker: a 2,048-character CJK text is ~6.2 KiB encoded, so
    -- ten fit (61,911 bytes) and the eleventh would not (68,100)
    dir = workspace()
    store = open(dir)
    local cjk = string.rep("\u{4e2d}", 2048)
    for i = 1, 10 do
      assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "c" .. i, text = cjk }, "mallory"))
    end
    ok, err = store_call(store, "memory_set", { scope = "speaker", key = "c11", text = cjk }, "mallory")
    assert.is_nil(ok)
    assert.equal("memory capacity reached", err)
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "c11", text = cjk }, "bob"))
    assert.equal("Forgotten.", store_call(store, "memory_remove", { scope = "speaker", key = "c1" }, "mallory"))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "c11", text = cjk }, "mallory"))
  end)

  it("keeps the channel totals above the speakers' shares: 8 speakers of 32 fill 256", function()
    local dir = workspace()
    local entries = {}
    for s = 1, 8 do
      for i = 1, 32 do entries[#entries + 1] = { "speaker:s" .. s, "k" .. i, "x" } end
    end
    memory_file(dir, entries)
    local store = open(dir)
    local ok, err = store_call(store, "memory_set", { scope = "speaker", key = "k1", text = "x" }, "s9")
    assert.is_nil(ok)
    assert.equal("memory capacity reached", err)
    assert.is_nil((store_call(store, "memory_set", { scope = "channel", key = "c", text = "x" }, "s9")))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "k1", text = "y" }, "s1"))
  end)

  it("refuses the 257th entry and a store over 512 KiB without writing; removal still works (item 30)", function()
    local dir = workspace()
    local entries = {}
    for i = 1, 256 do entries[i] = { "channel", "n" .. i, "x" } end
    memory_file(dir, entries)
    local before = W.read(dir .. "/memory.json")
    local store = open(dir)
    local ok, err = store_call(store, "memory_set", { scope = "channel", key = "n257", text = "x" })
    assert.is_nil(ok)
    assert.equal("memory capacity reached", err)
    assert.equal(before, W.read(dir .. "/memory.json"))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "channel", key = "n1", text = "y" }))
    assert.equal("Forgotten.", store_call(store, "memory_remove", { scope = "channel", key = "n2" }))
    assert.equal(255, #W.decode(W.read(dir .. "/memory.json")))

    dir = workspace()
    entries = {}
    local cjk = string.rep("\u{4e2d}", 2048)
    for i = 1, 84 do entries[i] = { "channel", "k" .. i, cjk } end
    memory_file(dir, entries)
    before = W.read(dir .. "/memory.json")
    store = open(dir)
    ok, err = store_call(store, "memory_set", { scope = "speaker", key = "one", text = cjk })
    assert.equal("memory capacity reached", err)
    assert.equal(before, W.read(dir .. "/memory.json"))
    assert.equal("Forgotten.", store_call(store, "memory_remove", { scope = "channel", key = "k1" }))
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "one", text = cjk }))
  end)

  it("writes through memory.json.tmp and a rename; moves a symlinked or non-regular store aside (item 31, hardening.md 8)", function()
    local dir = workspace()
    local outside = workspace() .. "/target"
    W.write(outside, "keep")
    os.execute(string.format("ln -s '%s' '%s/memory.json.tmp'", outside, dir))
    local store = open(dir)
    assert.equal("Saved.", store_call(store, "memory_set", { scope = "speaker", key = "k", text = "v" }))
    assert.equal("keep", W.read(outside))
    assert.same({ "memory.json" }, W.files(dir))
    assert.equal("600", W.sh("stat -c %a '" .. dir .. "/memory.json'"))

    -- a link in the store's place is moved aside as a link (never followed)
    local linked = workspace()
    os.execute(string.format("ln -s '%s/memory.json' '%s/memory.json'", dir, linked))
    local s2, repaired = memory.open(linked)
    assert.equal("memory_store", repaired)
    assert.same({}, s2.entries)
    local files = W.files(linked)
    assert.equal(1, #files)
    assert.matches("^memory%.json%.invalid%-%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$", files[1])
    assert.equal("symbolic link", W.sh("stat -c %F '" .. linked .. "/" .. files[1] .. "'"))
    assert.equal('[{"scope":"speaker:alice","key":"k","text":"v"}]', W.read(dir .. "/memory.json"))
    -- a directory or a FIFO likewise; the turn goes on with an empty store
    for _, plant in ipairs { "mkdir '%s/memory.json' && touch '%s/memory.json/x'", "mkfifo '%s/memory.json'" } do
      local d = workspace()
      os.execute(string.format(plant, d, d))
      local r = turn { dir = d }
      assert.is_nil(r.err)
      assert.same({ ok = true, text = "done", reason = "memory_store" }, r.reply)
      local names = W.files(d)
      assert.truthy(names[#names]:match("^memory%.json%.invalid%-") or names[1]:match("^memory%.json%.invalid%-"))
    end
  end)

  it("moves a corrupt memory.json aside and goes on with an empty store, with or without reset (item 32, hardening.md 8)", function()
    local too_many = {}
    for i = 1, 257 do too_many[i] = '{"scope":"channel","key":"k' .. i .. '","text":"x"}' end
    for _, bytes in ipairs {
      "not json", "{}", '[{"scope":"channel","key":"k","text":5}]', '[{"scope":"channel","key":"k"}]',
      '[1]', "[" .. table.concat(too_many, ",") .. "]", "\xef\xbb\xbf[]", '[{"scope":"channel","key":"k","key":"j","text":"x"}]',
    } do
      for _, reset in ipairs { false, true } do
        local dir = workspace()
        W.write(dir .. "/memory.json", bytes)
        local r = turn { dir = dir, turn = { reset = reset } }
        assert.is_nil(r.err)
        assert.same({ ok = true, text = "done", reason = "memory_store" }, r.reply)
        assert.equal(0, r.status)
        -- the model saw an empty store; the bad bytes are kept aside, unchanged
        assert.truthy(messages(r)[1].content:find("Shared channel notes (untrusted data): []", 1, true))
        local aside
        for _, f in ipairs(W.files(dir)) do
          if f:match("^memory%.json%.invalid%-") then aside = f end
        end
        assert.equal(bytes, W.read(dir .. "/" .. aside))
        assert.is_nil(W.read(dir .. "/memory.json"))
      end
    end
  end)

  it("keeps at most three stores moved aside, the newest", function()
    local dir = workspace()
    for i = 1, 3 do W.write(dir .. "/memory.json.invalid-20200101T00000" .. i .. "Z", "old" .. i) end
    W.write(dir .. "/memory.json", "garbage")
    assert.same({ ok = true, text = "done", reason = "memory_store" }, turn { dir = dir }.reply)
    local aside = {}
    for _, f in ipairs(W.files(dir)) do
      if f:match("^memory%.json%.invalid%-") then aside[#aside + 1] = f end
    end
    assert.equal(3, #aside)
    assert.same({ "memory.json.invalid-20200101T000002Z", "memory.json.invalid-20200101T000003Z" }, { aside[1], aside[2] })
    assert.equal("garbage", W.read(dir .. "/" .. aside[3]))
  end)
end)

---------------------------------------------------------------- history and budget

local function history_file(dir, entries)
  local list = W.arr()
  for i, e in ipairs(entries) do list[i] = W.obj({ "role", "content" }, { role = e[1], content = e[2] }) end
  W.write(dir .. "/history.json", W.encode(list))
end

describe("history and budget", function()
  it("keeps text at exactly the budget and truncates one byte over, never splitting a code point (item 33)", function()
    for _, b in ipairs { 4096, 8192, 49152 } do
      local exact = string.rep("a", b - 2)
      assert.equal(exact, text.prompt_text(exact, b))
      local over = exact .. "a"
      local cut = text.prompt_text(over, b)
      assert.equal(string.rep("a", b - 83) .. text.MARKER, cut)
      assert.equal(b, text.measure(cut))
    end
    assert.equal(83, text.measure(text.MARKER))
    assert.equal(80, utf8.len(text.MARKER))
    -- CJK: 16,356 three-byte characters survive a 49,152-byte budget.
    local cjk = string.rep("\u{4e2d}", 20000)
    local cut = text.prompt_text(cjk, 49152)
    assert.equal(string.rep("\u{4e2d}", 16356) .. text.MARKER, cut)
    -- Escapes are paid for: a quote costs two bytes; a control six.
    local quotes = string.rep('"', 2047)
    assert.equal(quotes, text.prompt_text(quotes, 4096))
    cut = text.prompt_text(quotes .. "x", 4096)
    assert.equal(string.rep('"', 2006) .. text.MARKER, cut)
    cut = text.prompt_text(string.rep("\1", 1000), 4096)
    assert.equal(string.rep("\1", 668) .. text.MARKER, cut)
    for _, s in ipairs { string.rep("\u{1F600}", 1200), string.rep("é", 3000), "a" .. string.rep("\u{4e2d}", 2000) } do
      cut = text.prompt_text(s, 4096)
      assert.is_true(sbxw.utf8_valid(cut))
      assert.is_true(text.measure(cut) <= 4096)
      assert.is_true(text.measure(cut) > 4096 - 4)
    end
  end)

  it("shows a saved fact and the previous answer next turn; a reset turn of another speaker sees neither (item 34)", function()
    local dir = workspace()
    local r = turn { dir = dir, turn = { text = "I like tea" }, script = { model = {
      W.calls { { id = "a", name = "memory_set", arguments = set_args("speaker", "drink", "Tea") } },
      W.chat("Noted your drink."),
    } } }
    assert.same({ ok = true, text = "Noted your drink." }, r.reply)
    r = turn { dir = dir, turn = { text = "What do I drink?" } }
    local body = r.log[1].body
    assert.truthy(body:find('Current speaker memory (untrusted data): [{\\"key\\":\\"drink\\",\\"text\\":\\"Tea\\"}]', 1, true))
    local msgs = messages(r)
    assert.equal('{"speaker":{"id":"alice","name":"Alice"},"message":"I like tea"}', msgs[2].content)
    assert.equal("Noted your drink.", msgs[3].content)
    assert.equal("assistant", msgs[3].role)
    r = turn { dir = dir, turn = { text = "Hi", reset = true, speaker = { id = "bob", name = "Bob" } } }
    body = r.log[1].body
    assert.is_nil(body:find("Noted your drink", 1, true))
    assert.is_nil(body:find("Tea", 1, true))
    assert.equal(2, #messages(r))
    local saved = W.decode(W.read(dir .. "/history.json"))
    assert.equal(2, #saved)
    assert.equal('{"speaker":{"id":"bob","name":"Bob"},"message":"Hi"}', saved[1].content)
    assert.equal("done", saved[2].content)
    assert.equal('[{"scope":"speaker:alice","key":"drink","text":"Tea"}]', W.read(dir .. "/memory.json"))
  end)

  it("keeps at most 20 entries and never stores tool calls or results (item 35)", function()
    local dir = workspace()
    local entries = {}
    for i = 1, 20 do entries[i] = { i % 2 == 1 and "user" or "assistant", "old " .. i } end
    history_file(dir, entries)
    local r = turn { dir = dir, turn = { text = "new" }, script = { model = {
      W.calls({ { id = "a", name = "memory_get", arguments = '{"scope":"speaker"}' } }, "thinking"),
      W.chat("Final."),
    } } }
    assert.is_true(r.reply.ok)
    local raw = W.read(dir .. "/history.json")
    local saved = W.decode(raw)
    assert.equal(20, #saved)
    assert.equal("old 3", saved[1].content)
    assert.equal('{"speaker":{"id":"alice","name":"Alice"},"message":"new"}', saved[19].content)
    assert.equal("Final.", saved[20].content)
    assert.is_nil(raw:find("tool", 1, true))
    assert.is_nil(raw:find("thinking", 1, true))
    assert.truthy(raw:match('^%[{"role":"user","content":"old 3"},{"role":"assistant","content":"old 4"}'))
    assert.equal("600", W.sh("stat -c %a '" .. dir .. "/history.json'"))
    -- Loaded and saved entries are bounded to 8 KiB each.
    history_file(dir, { { "user", string.rep("u", 9000) } })
    r = turn { dir = dir }
    assert.equal(text.prompt_text(string.rep("u", 9000), 8192), messages(r)[2].content)
    saved = W.decode(W.read(dir .. "/history.json"))
    assert.equal(text.prompt_text(string.rep("u", 9000), 8192), saved[1].content)
  end)

  it("moves a corrupt history.json aside and starts an empty history; with reset it is replaced (item 36, hardening.md 8)", function()
    local too_many = {}
    for i = 1, 21 do too_many[i] = { "user", "x" } end
    local cases = { "not json", "{}", '[{"role":"system","content":"x"}]', '[{"role":"user","content":null}]', "[1]" }
    for _, bytes in ipairs(cases) do
      local dir = workspace()
      W.write(dir .. "/history.json", bytes)
      local r = turn { dir = dir }
      assert.is_nil(r.err)
      assert.same({ ok = true, text = "done", reason = "history" }, r.reply)
      assert.equal(2, #messages(r))                   -- system and the current user: nothing earlier
      assert.equal(2, #W.decode(W.read(dir .. "/history.json")))
      local aside
      for _, f in ipairs(W.files(dir)) do
        if f:match("^history%.json%.invalid%-") then aside = f end
      end
      assert.equal(bytes, W.read(dir .. "/" .. aside))
      -- with reset the file is not read: garbage is simply replaced
      W.write(dir .. "/history.json", bytes)
      r = turn { dir = dir, turn = { reset = true } }
      assert.same({ ok = true, text = "done" }, r.reply)
      assert.equal(2, #W.decode(W.read(dir .. "/history.json")))
    end
    local dir = workspace()
    history_file(dir, too_many)
    assert.equal("history", turn { dir = dir }.reply.reason)
    for _, reset in ipairs { false, true } do
      dir = workspace()
      os.execute("mkdir '" .. dir .. "/history.json'")
      local r = turn { dir = dir, turn = { reset = reset } }
      assert.same({ ok = true, text = "done", reason = "history" }, r.reply)
      assert.equal(2, #W.decode(W.read(dir .. "/history.json")))
    end
    dir = workspace()
    local other = workspace()
    history_file(other, { { "user", "x" } })
    os.execute(string.format("ln -s '%s/history.json' '%s/history.json'", other, dir))
    assert.equal("history", turn { dir = dir }.reply.reason)
    assert.equal(1, #W.decode(W.read(other .. "/history.json")))   -- the link's target untouched
    -- both stores invalid: both moved aside, memory_store reported
    dir = workspace()
    W.write(dir .. "/memory.json", "x")
    W.write(dir .. "/history.json", "y")
    assert.equal("memory_store", turn { dir = dir }.reply.reason)
    assert.equal(3, #W.files(dir))                    -- both aside, and the new history.json
  end)

  it("keeps every request under 192 KiB with 144 notes, 20 long entries and a CJK message (item 37)", function()
    local dir = workspace()
    local notes = {}
    for i = 0, 143 do
      local body = i < 32 and string.rep("\u{4e2d}", 2048) or string.rep("n", 2048)
      notes[#notes + 1] = { "channel", "note_" .. i, body }
    end
    memory_file(dir, notes)
    local entries = {}
    for i = 1, 20 do entries[i] = { i % 2 == 1 and "user" or "assistant", string.rep(i % 3 == 0 and "\u{00e9}" or "h", 100000) } end
    history_file(dir, entries)
    local r = turn { dir = dir, turn = { text = string.rep("\u{6587}", 20000) }, script = { model = {
      W.calls { { id = "a", name = "memory_remove", arguments = '{"scope":"channel","key":"note_0"}' } },
      W.chat("Removed."),
    } } }
    assert.same({ ok = true, text = "Removed." }, r.reply)
    assert.equal(2, #models(r))
    for _, e in ipairs(r.log) do assert.is_true(#e.body < 196608, #e.body) end
    assert.equal("Forgotten.", tool_messages(messages(r, 2))[1].content)
    local store = assert(memory.open(dir))
    assert.equal("[]", store_call(store, "memory_get", { scope = "channel", key = "note_0" }))
    assert.equal(143, #W.decode(W.read(dir .. "/memory.json")))
    -- The saved history starts from the loaded entries (8 KiB each), not from
    -- what the fitting left in the request.
    local saved = W.decode(W.read(dir .. "/history.json"))
    assert.equal(20, #saved)
    assert.equal(text.prompt_text(entries[3][2], 8192), saved[1].content)
    assert.is_true(#messages(r, 1) < 22)
  end)

  it("drops old history one message at a time, then whole tool groups, never system or user (item 38)", function()
    local codec_ = W.codec()
    local sys = codec_.object({ "role", "content" }, { role = "system", content = "s" })
    local user = codec_.object({ "role", "content" }, { role = "user", content = string.rep("u", 40000) })
    local function hist(i) return codec_.object({ "role", "content" }, { role = i % 2 == 1 and "user" or "assistant", content = string.rep("h", 8000) .. i }) end
    local function group(step)
      local calls = codec_.array()
      local out = {}
      for i = 0, 7 do
        calls[#calls + 1] = codec_.object({ "id", "type", "function" }, { id = "call_" .. step .. "_" .. i, type = "function",
          ["function"] = codec_.object({ "name", "arguments" }, { name = "memory_get", arguments = "{}" }) })
      end
      out[1] = codec_.object({ "role", "content", "tool_calls" }, { role = "assistant", content = "", tool_calls = calls })
      for i = 0, 7 do
        out[#out + 1] = codec_.object({ "role", "tool_call_id", "content" }, { role = "tool", tool_call_id = "call_" .. step .. "_" .. i, content = string.rep("r", 4000) })
      end
      return out
    end
    local msgs = codec_.array { sys }
    for i = 1, 20 do msgs[#msgs + 1] = hist(i) end
    msgs[#msgs + 1] = user
    local payload = codec_.object({ "model", "messages", "tools" }, { model = "m", messages = msgs, tools = codec_.array() })
    local body = assert(budget.fit(payload, user))
    assert.is_true(#body <= 196608)
    local n = #msgs
    assert.equal(sys, msgs[1])
    assert.equal(user, msgs[n])
    assert.is_true(n < 22 and n > 2)
    -- The survivors are the newest entries, in order, with an assistant possibly first.
    assert.equal(string.rep("h", 8000) .. (20 - (n - 3)), msgs[2].content)
    -- One message fewer would have fitted too, one more would not.
    table.insert(msgs, 2, hist(20 - (n - 2)))
    assert.is_true(#W.encode(payload) > 196608)
    table.remove(msgs, 2)

    -- Now tool groups: history gone first, then the oldest groups as a whole.
    msgs = codec_.array { sys, hist(1), user }
    for step = 0, 5 do for _, m in ipairs(group(step)) do msgs[#msgs + 1] = m end end
    payload.messages = msgs
    body = assert(budget.fit(payload, user))
    assert.is_true(#body <= 196608)
    assert.equal(sys, msgs[1])
    assert.equal(user, msgs[2])
    assert.equal("assistant", msgs[3].role)
    local first_step = tonumber(msgs[3].tool_calls[1].id:match("^call_(%d+)_"))
    assert.is_true(first_step > 0)
    assert.equal((6 - first_step) * 9 + 2, #msgs)
    for i = 3, #msgs, 9 do
      for k = 1, 8 do assert.equal(msgs[i].tool_calls[k].id, msgs[i + k].tool_call_id) end
    end
    -- Nothing left to drop: failure.
    local huge = codec_.object({ "role", "content" }, { role = "user", content = string.rep("x", 200000) })
    payload.messages = codec_.array { sys, huge }
    assert.same({ nil, "model context exceeds request budget" }, { budget.fit(payload, huge) })
  end)

  it("drops tool groups inside a real turn and keeps replies paired (item 38)", function()
    local replies = {}
    local big = string.rep("r", 5000)
    for step = 1, 6 do
      local list = {}
      for i = 1, 8 do list[i] = { id = "s" .. step .. "c" .. i, name = "host_blob", arguments = '{"pad":"' .. string.rep("p", 1500) .. '"}' } end
      replies[step] = W.calls(list)
    end
    replies[7] = W.chat("Enough.")
    local r = turn { turn = { text = string.rep("m", 60000), tools = W.arr { W.tool_spec("blob") } }, script = {
      model = replies, tools = { blob = function() return 200, W.encode(W.obj({ "text" }, { text = big })) end },
    } }
    assert.same({ ok = true, text = "Enough." }, r.reply)
    local reqs = models(r)
    for _, e in ipairs(r.log) do assert.is_true(#e.body <= 196608) end
    local last = reqs[7].messages
    assert.equal("system", last[1].role)
    assert.equal("user", last[2].role)
    assert.equal("s", last[3].tool_calls[1].id:sub(1, 1))
    assert.is_true(last[3].tool_calls[1].id ~= "s1c1")
    for i = 3, #last, 9 do
      assert.equal("assistant", last[i].role)
      for k = 1, 8 do assert.equal(last[i].tool_calls[k].id, last[i + k].tool_call_id) end
    end
  end)

  it("fails tool lists over 32 KiB or 128 functions (item 39)", function()
    local r = turn { turn = { tools = W.arr { W.tool_spec("big", string.rep("d", 32000)) } } }
    assert.equal("tool descriptions exceed context budget", r.err)
    assert.equal(0, #r.log)
    local many = W.arr()
    for i = 1, 125 do many[i] = W.tool_spec("t" .. i, "d") end
    r = turn { turn = { tools = many } }
    assert.equal("tool descriptions exceed context budget", r.err)
    many[125] = nil
    r = turn { turn = { tools = many } }
    assert.is_true(r.reply.ok)
    assert.equal(128, #models(r)[1].tools)
  end)

  it("leaves history.json unchanged after a failed or limit-reached turn (item 40)", function()
    local dir = workspace()
    history_file(dir, { { "user", "before" }, { "assistant", "answer" } })
    local before = W.read(dir .. "/history.json")
    local limit = {}
    for i = 1, 12 do limit[i] = W.calls { { id = "c", name = "memory_get", arguments = '{"scope":"speaker"}' } } end
    assert.same(LIMIT, turn { dir = dir, script = { model = limit } }.reply)
    assert.equal(before, W.read(dir .. "/history.json"))
    assert.same(failed("model_no_text"), turn { dir = dir, script = { model = { W.chat(W.null()) } } }.reply)
    assert.equal(before, W.read(dir .. "/history.json"))
    assert.same(FAILED, turn { dir = dir, turn = { reset = true }, script = { model = { { 429, "" } } } }.reply)
    assert.equal(before, W.read(dir .. "/history.json"))
  end)
end)

---------------------------------------------------------------- real broker

describe("against a real broker (spec/broker.md items 75-78)", function()
  local async = require "sandbox.async"
  local H = require "broker_harness"
  local fake_upstream = require "fake_upstream"
  local fake

  setup(function() fake = fake_upstream.start() end)
  teardown(function() if fake then fake:stop() end end)

  local function canned(body)
    return { status = 200, headers = { ["Content-Type"] = "application/json" }, body = body }
  end

  -- Runs one turn in a task against a fresh broker; the worker's broker
  -- function sends over the real socket and yields while the loop turns.
  -- -> {reply, status, err, statuses, bodies (worker -> broker), upstream (fake log)}
  local CLOCK = { { name = "clock", description = "Tells the time.", parameters = { type = "object" },
                    run = function(input) return "12:00 " .. tostring(input.zone) end } }

  local function real_turn(responses, over, dir)
    local out = {}
    async.run(function()
      fake:reset()
      fake:script(responses)
      local b, path, bdir = H.start(H.options(fake, { tools = CLOCK }))
      local ok, err = pcall(function()
        out.statuses, out.bodies = {}, {}
        out.reply, out.status, out.err = worker.run_turn(W.turn(over), {
          workspace = dir or workspace(), broker = W.socket_broker(path, out.statuses, out.bodies) })
        out.upstream = fake:log()
      end)
      H.finish(b, bdir)
      if not ok then error(err, 0) end
    end)
    return out
  end

  local function upstream_messages(r, n) return W.decode(r.upstream[n].body).messages end

  local function assert_paired(msgs)
    local ids, seen = {}, {}
    for i, m in ipairs(msgs) do
      if m.tool_calls then
        for k, c in ipairs(m.tool_calls) do
          assert.is_nil(seen[c.id], "repeated id " .. c.id)
          seen[c.id] = true
          ids[#ids + 1] = c.id
          assert.equal("tool", msgs[i + k].role)
          assert.equal(c.id, msgs[i + k].tool_call_id)
        end
      end
    end
    return ids
  end

  it("replays a provider call named Memory-Get as invalid_tool and recovers (item 75)", function()
    local r = real_turn({
      canned(W.calls { { id = "call_x", type = "function", name = "Memory-Get", arguments = '{"scope":"speaker"}' },
                       { id = "call_y", type = "function", name = "memory_get", arguments = '{"scope":"speaker"}' },
                       { id = "call_z", type = "function", name = "host_clock", arguments = '{"zone":"UTC"}' } }),
      canned(W.chat("Recovered.")),
    }, { tools = W.arr { W.tool_spec("clock") } })
    assert.is_nil(r.err)
    assert.same({ ok = true, text = "Recovered." }, r.reply)
    assert.same({ 200, 200, 200 }, r.statuses)
    assert.same({ "/model", "/tools/clock", "/model" }, W.routes(r.bodies))
    assert.equal(2, #r.upstream)
    local msgs = upstream_messages(r, 2)
    local asst = last_assistant(msgs)
    assert.equal("invalid_tool", asst.tool_calls[1]["function"].name)
    assert.equal("memory_get", asst.tool_calls[2]["function"].name)
    assert.same({ "call_x", "call_y", "call_z" }, assert_paired(msgs))
    local tm = tool_messages(msgs)
    assert.equal(REFUSAL, tm[1].content)
    assert.equal("[]", tm[2].content)
    assert.equal('{"text":"12:00 UTC"}', tm[3].content)
  end)

  it("renormalizes a 200-character call id and the replay gets 200 (item 76)", function()
    local r = real_turn {
      canned(W.calls { { id = string.rep("i", 200), type = "function", name = "memory_get", arguments = '{"scope":"channel"}' } }),
      canned(W.chat("Fine.")),
    }
    assert.same({ ok = true, text = "Fine." }, r.reply)
    assert.same({ 200, 200 }, r.statuses)
    assert.same({ "call_0_0" }, assert_paired(upstream_messages(r, 2)))
  end)

  it("renormalizes duplicate call ids to unique ids and the replay gets 200 (item 77)", function()
    local r = real_turn {
      canned(W.calls { { id = "dup", type = "function", name = "memory_get", arguments = '{"scope":"channel"}' },
                       { id = "dup", type = "function", name = "memory_get", arguments = '{"scope":"speaker"}' },
                       { id = "", type = "function", name = "memory_get", arguments = '{"scope":"speaker"}' } }),
      canned(W.calls { { id = "dup", type = "function", name = "memory_get", arguments = '{"scope":"channel"}' } }),
      canned(W.chat("Unique.")),
    }
    assert.same({ ok = true, text = "Unique." }, r.reply)
    assert.same({ 200, 200, 200 }, r.statuses)
    assert.same({ "dup", "call_0_1", "call_0_2", "call_1_0" }, assert_paired(upstream_messages(r, 3)))
  end)

  it("keeps every status 200 and every upstream body under 192 KiB near capacity (item 78, item 37)", function()
    local dir = workspace()
    local notes = {}
    for i = 0, 143 do
      notes[#notes + 1] = { "channel", "note_" .. i, i < 32 and string.rep("\u{4e2d}", 2048) or string.rep("n", 2048) }
    end
    memory_file(dir, notes)
    local entries = {}
    for i = 1, 20 do
      entries[i] = { i % 2 == 1 and "user" or "assistant",
                     string.rep(i % 2 == 1 and "\u{1F600}" or "\u{00e9}\"\n", i % 2 == 1 and 100000 or 50000) }
    end
    history_file(dir, entries)
    local r = real_turn({
      canned(W.calls { { id = "r1", type = "function", name = "memory_remove", arguments = '{"scope":"channel","key":"note_0"}' },
                       { id = "r2", type = "function", name = "memory_get", arguments = '{"scope":"channel","query":"note"}' } }),
      canned(W.chat("Removed.")),
    }, { text = string.rep("\u{6587}", 20000) }, dir)
    assert.is_nil(r.err)
    assert.same({ ok = true, text = "Removed." }, r.reply)
    assert.same({ 200, 200 }, r.statuses)
    assert.equal(2, #r.upstream)
    for _, e in ipairs(r.upstream) do assert.is_true(e.body_length < 196608, e.body_length) end
    for _, e in ipairs(r.bodies) do assert.is_true(#e.body <= 196608) end
    local tm = tool_messages(upstream_messages(r, 2))
    assert.equal("Forgotten.", tm[1].content)
    assert.equal(text.MARKER, tm[2].content:sub(-#text.MARKER))
    local store = assert(memory.open(dir))
    assert.equal("[]", store_call(store, "memory_get", { scope = "channel", key = "note_0" }))
  end)

  it("runs main() in a child process through sbxw's own client to a real broker (items 2, 8)", function()
    local b
    async.run(function()
      fake:reset()
      fake:script { canned(W.calls { { id = "e", type = "function", name = "host_echo", arguments = "{}" } }),
                    canned(W.chat(" Hello from the sealed worker. ")) }
    end)
    b = W.broker_process { model_url = fake:url("/v1/chat/completions") }
    finally(b.stop)
    local out, err, rc = W.run_main(W.turn { tools = W.arr { W.tool_spec("echo") } },
      { workspace = workspace(), socket = b.path })
    assert.equal('{"ok":true,"text":"Hello from the sealed worker."}', out)
    assert.equal("", err)
    assert.equal(0, rc)
    local log
    async.run(function() log = fake:log() end)
    assert.equal(2, #log)
    local tm = tool_messages(W.decode(log[2].body).messages)
    assert.equal('{"text":"pong"}', tm[1].content)
    assert.is_nil(log[1].body:find("sandbox-dummy-key", 1, true))
  end)
end)

---------------------------------------------------------------- static binary

-- The same Lua under the binary's own environment (no io, no os, fixed
-- require directory): build/worker/sbx-worker-host reads ./worker/lua, so a
-- chroot holding that tree, a zone file, /workspace and /broker/broker.sock
-- (a real broker in a child process) is the container's view of the world.
local HOST_BINARY = W.BUILD .. "/worker/sbx-worker-host"
local can_chroot = W.sh("id -u") == "0" and W.read(HOST_BINARY) ~= nil
  and W.sh("command -v chroot") ~= ""

describe("static binary", function()
  local async = require "sandbox.async"
  local fake_upstream = require "fake_upstream"

  ;(can_chroot and it or pending)("answers a turn with memory and history through the real broker (items 2, 4, 8)", function()
    local fake = fake_upstream.start()
    finally(function() fake:stop() end)
    local root = workspace()
    os.execute(string.format("mkdir -p '%s/worker/lua' '%s/usr/share/zoneinfo/Asia' '%s/workspace' '%s/broker' && "
      .. "cp '%s' '%s/sbx-worker' && cp worker/lua/*.lua '%s/worker/lua/' && "
      .. "cp /usr/share/zoneinfo/Asia/Taipei '%s/usr/share/zoneinfo/Asia/'",
      root, root, root, root, HOST_BINARY, root, root, root))
    async.run(function()
      fake:reset()
      fake:script {
        { status = 200, headers = { ["Content-Type"] = "application/json" },
          body = W.calls { { id = "m", type = "function", name = "memory_set", arguments = set_args("speaker", "drink", "Tea") },
                           { id = "e", type = "function", name = "host_echo", arguments = "{}" } } },
        { status = 200, headers = { ["Content-Type"] = "application/json" }, body = W.chat("Hello from the sealed worker.") },
      }
    end)
    local b = W.broker_process { model_url = fake:url("/v1/chat/completions"), path = root .. "/broker/broker.sock" }
    finally(b.stop)
    W.write(root .. "/stdin", W.turn { timeZone = "Asia/Taipei", tools = W.arr { W.tool_spec("echo") } })
    local rc = W.sh(string.format("cd / && env -u LD_PRELOAD chroot '%s' /sbx-worker < '%s/stdin' > '%s/stdout' 2> '%s/stderr'; echo $?",
      root, root, root, root))
    assert.equal('{"ok":true,"text":"Hello from the sealed worker."}', W.read(root .. "/stdout"))
    assert.equal("", W.read(root .. "/stderr"))
    assert.equal("0", rc)
    assert.equal('[{"scope":"speaker:alice","key":"drink","text":"Tea"}]', W.read(root .. "/workspace/memory.json"))
    assert.equal(2, #W.decode(W.read(root .. "/workspace/history.json")))
    local log
    async.run(function() log = fake:log() end)
    local tm = tool_messages(W.decode(log[2].body).messages)
    assert.same({ "Saved.", '{"text":"pong"}' }, { tm[1].content, tm[2].content })
    -- A bad turn through the same binary: the generic reply, exit 1, empty stderr.
    W.write(root .. "/stdin", W.turn { reset = W.null() })
    rc = W.sh(string.format("cd / && env -u LD_PRELOAD chroot '%s' /sbx-worker < '%s/stdin' > '%s/stdout' 2> '%s/stderr'; echo $?",
      root, root, root, root))
    assert.equal('{"ok":false,"text":"The sandbox worker failed."}', W.read(root .. "/stdout"))
    assert.equal("", W.read(root .. "/stderr"))
    assert.equal("1", rc)
  end)
end)

describe("Lua environment", function()
  -- The binary's environment (worker/PRIMITIVES.md): base minus print,
  -- loadfile and dofile; string, table, math, utf8, coroutine; no io, no os.
  -- Every worker module is loaded afresh into a strict copy of it, where
  -- reading an undefined global or assigning any global raises.
  local function strict_require()
    local env = {}
    for _, name in ipairs { "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall",
                            "rawequal", "rawget", "rawlen", "rawset", "select", "setmetatable",
                            "tonumber", "tostring", "type", "xpcall", "string", "table", "math",
                            "utf8", "coroutine", "_VERSION" } do
      rawset(env, name, _G[name])
    end
    local loaded = { sbxw = sbxw }
    rawset(env, "require", function(name)
      if loaded[name] == nil then
        local source = assert(W.read("worker/lua/" .. name .. ".lua"), name)
        loaded[name] = assert(load(source, "@" .. name .. ".lua", "t", env))()
      end
      return loaded[name]
    end)
    setmetatable(env, {
      __index = function(_, k) error("undefined global " .. tostring(k), 2) end,
      __newindex = function(_, k) error("global assignment " .. tostring(k), 2) end,
    })
    return env.require
  end

  it("runs a whole turn with no io, no os and no globals", function()
    local strict_worker = strict_require()("worker")
    local dir = workspace()
    history_file(dir, { { "user", "earlier" }, { "assistant", "answer" } })
    local broker = W.scripted { model = {
      W.calls { { id = "a", name = "memory_set", arguments = set_args("channel", "k", "v") },
                { id = "a", name = "Bad", arguments = "{" },
                { id = "c", name = "host_clock", arguments = "{}" },
                { id = "d", name = "mcp_0_search", arguments = "{}" } },
      W.chat(" ok "),
    }, tools = { clock = function() return 200, '{"text":"1"}' end },
       mcp = { catalog = function() return 200, '{"result":{}}' end } }
    local reply, status, err = strict_worker.run_turn(W.turn {
      tools = W.arr { W.tool_spec("clock") }, mcp = catalog { W.tool_spec("search") },
      prompt = string.rep("p", 9000) }, { workspace = dir, broker = broker, clock = function() return T end })
    assert.is_nil(err)
    assert.same({ ok = true, text = "ok" }, reply)
    assert.equal(0, status)
    -- Failure paths too.
    local _, _, err2 = strict_worker.run_turn("{", { workspace = dir })
    assert.equal("invalid turn", err2)
    local limit = {}
    for i = 1, 12 do limit[i] = W.calls { { id = "x", name = "memory_get", arguments = '{"scope":"channel"}' } } end
    reply = strict_worker.run_turn(W.turn(), { workspace = dir, broker = (W.scripted { model = limit }) })
    assert.same(LIMIT, reply)
  end)
end)
