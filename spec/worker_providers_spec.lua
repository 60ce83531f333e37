-- worker_providers_spec.lua: the worker's side of spec/providers.md 2-3
-- ("Behaviours the specs must cover" 4 and 5) on the host build of the real
-- worker Lua (spec/support/worker_harness.lua), with provider replies in the
-- shapes the providers' API references give: zero-argument calls without
-- `arguments` (OpenRouter), content part arrays (Mistral Magistral), an
-- OpenAI refusal, finish_reason length and content_filter, DeepSeek's
-- reasoning_content and Gemini's extra_content replayed within the turn,
-- dropped (never cut) over their bounds, and never stored in history.json.
local W = require "worker_harness"

if not W.available() then
  describe("the worker with real providers' replies", function()
    pending("build/worker/sbxw.so is not built (make)")
  end)
  return
end

local worker = W.worker()
local text = require "text"

local dirs = {}
local function workspace()
  local dir = W.tmpdir()
  dirs[#dirs + 1] = dir
  return dir
end
after_each(function()
  for _, d in ipairs(dirs) do W.rmdir(d) end
  dirs = {}
end)

local function turn(script, over, dir)
  dir = dir or workspace()
  local broker, log = W.scripted(script)
  local reply, status, err = worker.run_turn(W.turn(over), { workspace = dir, broker = broker })
  return { reply = reply, status = status, err = err, log = log, dir = dir }
end

local function requests(r) return W.model_requests(r.log) end

local function assistant(msgs)
  for i = #msgs, 1, -1 do
    if msgs[i].role == "assistant" then return msgs[i] end
  end
end

-- A reply whose first choice is `message` (a JSON text) with finish_reason.
local function reply(message, finish)
  return '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":' .. message
    .. ',"finish_reason":' .. (finish and ('"' .. finish .. '"') or "null") .. '}]}'
end

local CLOCK_TOOL = W.arr { W.tool_spec("clock", "The time.", W.obj({ "type", "properties" },
  { type = "object", properties = W.obj({}, {}) })) }

describe("reading the answer (providers.md 3, item 5)", function()
  it("runs a call without arguments, with null or with \"\" as {} and replays it as \"{}\"", function()
    local seen = {}
    local calls = '[{"id":"a","type":"function","function":{"name":"host_clock"}},'
      .. '{"id":"b","type":"function","function":{"name":"host_clock","arguments":null}},'
      .. '{"id":"c","type":"function","function":{"name":"host_clock","arguments":""}}]'
    local r = turn({
      model = { reply('{"role":"assistant","content":null,"tool_calls":' .. calls .. '}', "tool_calls"),
                reply('{"role":"assistant","content":"It is noon."}', "stop") },
      tools = { clock = function(body) seen[#seen + 1] = body return 200, '{"text":"12:00"}' end },
    }, { tools = CLOCK_TOOL })
    assert.is_true(r.reply.ok, r.err)
    assert.equal("It is noon.", r.reply.text)
    assert.same({ "{}", "{}", "{}" }, seen)
    local a = assistant(requests(r)[2].messages)
    for i = 1, 3 do assert.equal("{}", a.tool_calls[i]["function"].arguments) end
    for _, m in ipairs(requests(r)[2].messages) do
      if m.role == "tool" then assert.equal('{"text":"12:00"}', m.content) end
    end
  end)

  it("still refuses a non-string, non-null arguments", function()
    local r = turn({
      model = { reply('{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function",'
        .. '"function":{"name":"host_clock","arguments":{"x":1}}}]}', "tool_calls") },
      tools = { clock = function() error("must not run") end },
    }, { tools = CLOCK_TOOL })
    assert.is_true(r.reply.ok)
    local tool = requests(r)[2].messages
    assert.equal("Tool call refused or failed.", tool[#tool].content)
  end)

  it("joins the text parts of a content array, ignoring thinking and image parts", function()
    local r = turn({ model = { reply('{"role":"assistant","content":['
      .. '{"type":"thinking","thinking":[{"type":"text","text":"hidden reasoning"}]},'
      .. '{"type":"text","text":"Paris is "},{"type":"image_url","image_url":{"url":"https://x.example/a.png"}},'
      .. '{"type":"text","text":"the capital."}]}', "stop") } })
    assert.is_true(r.reply.ok, r.err)
    assert.equal("Paris is the capital.", r.reply.text)
  end)

  it("counts a content array without a text part as no text", function()
    local r = turn({ model = { reply('{"role":"assistant","content":[{"type":"thinking","thinking":"x"}]}', "stop") } })
    assert.is_false(r.reply.ok)
    assert.equal("model returned no final text", r.err)
    assert.equal("model_no_text", r.reply.reason)
  end)

  it("delivers the model's own refusal when the content gives no text", function()
    local r = turn({ model = { reply('{"role":"assistant","content":null,'
      .. '"refusal":"I can\'t help with that request.","annotations":[]}', "stop") } })
    assert.is_true(r.reply.ok, r.err)
    assert.equal("I can't help with that request.", r.reply.text)
    assert.equal('{"ok":true,"text":"I can\'t help with that request."}', worker.encode_reply(r.reply))
  end)

  it("marks a reply cut at the length limit, and says so on stdout", function()
    local r = turn({ model = { reply('{"role":"assistant","content":"The list goes on and"}', "length") } })
    assert.is_true(r.reply.ok, r.err)
    assert.equal("The list goes on and\n[The reply was cut short: the model reached its output limit.]", r.reply.text)
    assert.is_nil(r.reply.text:find("memory_get", 1, true))
    assert.is_true(r.reply.truncated)
    assert.equal('{"ok":true,"text":' .. W.encode("The list goes on and" .. text.CUT_MARKER) .. ',"truncated":true}',
      worker.encode_reply(r.reply))
  end)

  it("keeps a cut reply within the 100,000-character bound, marker included", function()
    local long = string.rep("é", 100000)
    local r = turn({ model = { reply(W.encode(W.obj({ "role", "content" }, { role = "assistant", content = long })), "length") } })
    assert.is_true(r.reply.ok, r.err)
    assert.equal(100000, utf8.len(r.reply.text))
    assert.equal(text.CUT_MARKER, r.reply.text:sub(-#text.CUT_MARKER))
  end)

  it("fails with `model output was filtered` (model_filtered) on content_filter without text", function()
    local r = turn({ model = { reply('{"role":"assistant","content":null}', "content_filter") } })
    assert.is_false(r.reply.ok)
    assert.equal("model output was filtered", r.err)
    assert.same({ ok = false, text = "The sandbox worker failed.", reason = "model_filtered" }, r.reply)
    assert.equal(1, r.status)
    assert.equal('{"ok":false,"text":"The sandbox worker failed.","reason":"model_filtered"}', worker.encode_reply(r.reply))
    -- with text, content_filter is ignored (the provider only trimmed part)
    r = turn({ model = { reply('{"role":"assistant","content":"Partial."}', "content_filter") } })
    assert.equal("Partial.", r.reply.text)
  end)

  it("ignores any other finish_reason, or none", function()
    for _, f in ipairs { "stop", "tool_calls", "end_turn", "eos" } do
      local r = turn({ model = { reply('{"role":"assistant","content":"Hi."}', f) } })
      assert.same({ ok = true, text = "Hi." }, r.reply)
    end
  end)
end)

describe("provider state replayed within a turn (providers.md 2, item 4)", function()
  local function two_steps(message, final)
    return {
      model = { reply(message, "tool_calls"), reply(final or '{"role":"assistant","content":"Done."}', "stop") },
      tools = { clock = function() return 200, '{"text":"12:00"}' end },
    }
  end
  local CALL = '{"id":"call_1","type":"function","function":{"name":"host_clock","arguments":"{}"}}'

  it("sends content null for a tool-only message, with reasoning_content and reasoning kept", function()
    local r = turn(two_steps('{"role":"assistant","content":"","reasoning_content":"The user wants the time.",'
      .. '"reasoning":"same","tool_calls":[' .. CALL .. ']}'), { tools = CLOCK_TOOL })
    assert.is_true(r.reply.ok, r.err)
    local body = r.log[#r.log].body
    assert.truthy(body:find('{"role":"assistant","content":null,"reasoning_content":"The user wants the time.",'
      .. '"reasoning":"same","tool_calls":[{"id":"call_1","type":"function","function":{"name":"host_clock",'
      .. '"arguments":"{}"}}]}', 1, true), body)
  end)

  it("keeps each call's extra_content object (Gemini's thought signature)", function()
    local call = '{"id":"g1","type":"function","function":{"name":"host_clock","arguments":"{}"},'
      .. '"extra_content":{"google":{"thought_signature":"EjQKMgG+Pvb7"}}}'
    local r = turn(two_steps('{"role":"assistant","content":null,"tool_calls":[' .. call .. ']}'), { tools = CLOCK_TOOL })
    local a = assistant(requests(r)[2].messages)
    assert.equal("EjQKMgG+Pvb7", a.tool_calls[1].extra_content.google.thought_signature)
    assert.equal('{"id":"g1","type":"function","function":{"name":"host_clock","arguments":"{}"},'
      .. '"extra_content":{"google":{"thought_signature":"EjQKMgG+Pvb7"}}}', W.encode(a.tool_calls[1]))
  end)

  it("drops, never cuts, a reasoning string or an extra_content object over its bound", function()
    local big = string.rep("r", 65536 - 1)          -- 65,537 bytes as a JSON string
    local fits = string.rep("r", 65536 - 2)
    local sig = string.rep("s", 16384)
    local calls = '[{"id":"a","type":"function","function":{"name":"host_clock","arguments":"{}"},'
      .. '"extra_content":{"x":"' .. sig .. '"}},'
      .. '{"id":"b","type":"function","function":{"name":"host_clock","arguments":"{}"},"extra_content":"text"}]'
    local r = turn(two_steps('{"role":"assistant","content":null,"reasoning_content":"' .. big .. '",'
      .. '"reasoning":"' .. fits .. '","tool_calls":' .. calls .. '}'), { tools = CLOCK_TOOL })
    assert.is_true(r.reply.ok, r.err)
    local a = assistant(requests(r)[2].messages)
    assert.is_nil(a.reasoning_content)
    assert.equal(fits, a.reasoning)
    assert.is_nil(a.tool_calls[1].extra_content)
    assert.is_nil(a.tool_calls[2].extra_content)
  end)

  it("never writes reasoning or extra_content to history.json", function()
    local dir = workspace()
    local call = '{"id":"g1","type":"function","function":{"name":"host_clock","arguments":"{}"},'
      .. '"extra_content":{"google":{"thought_signature":"SIGNATURE-XYZ"}}}'
    local r = turn(two_steps('{"role":"assistant","content":null,"reasoning_content":"THINKING-ABC",'
      .. '"tool_calls":[' .. call .. ']}', '{"role":"assistant","content":"Done.","reasoning_content":"MORE-THINKING"}'),
      { tools = CLOCK_TOOL }, dir)
    assert.is_true(r.reply.ok, r.err)
    local history = W.read(dir .. "/history.json")
    assert.is_nil(history:find("THINKING", 1, true))
    assert.is_nil(history:find("SIGNATURE", 1, true))
    assert.same({ "user", "assistant" }, { W.decode(history)[1].role, W.decode(history)[2].role })
    -- and the next turn does not send them back either
    local r2 = turn({ model = { reply('{"role":"assistant","content":"Hello again."}', "stop") } }, nil, dir)
    assert.is_nil(r2.log[1].body:find("THINKING", 1, true))
    assert.is_nil(r2.log[1].body:find("SIGNATURE", 1, true))
  end)
end)
