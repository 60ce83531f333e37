-- claim_spec.lua: the claim's pure parts (spec/runtime.md 9.1-9.3: identity
-- and precedence, admission, composing the turn text, splitting the reply).
-- The same rules run end to end through the app in app_spec.lua (item 56).
local claim = require "sandbox.channels.claim"

local function owns_only(...)
  local set = {}
  for _, k in ipairs { ... } do set[k] = true end
  return function(key) return set[key] == true end
end

local MEMBER = { tier = "member", principalId = "p_alice" }

-- A member's message in guild 9, channel 100, mentioning the bot.
local function msg(over)
  local e = {
    id = "m1", channelId = "100", guildId = "9",
    author = { id = "alice", name = "Alice", bot = false },
    mentionsBot = true, replyToBot = false, text = "hello",
  }
  for k, v in pairs(over or {}) do e[k] = v end
  return e
end

describe("claim identity and precedence (9.1)", function()
  it("is named sandbox with priority 200, above the core agent claim's 100", function()
    assert.equal("sandbox", claim.NAME)
    assert.equal(200, claim.PRIORITY)
    assert.equal(200, claim.decide(msg(), MEMBER, owns_only("discord:100")).priority)
  end)

  it("does not claim a channel that is not sandboxed (normal host routing applies)", function()
    local d = claim.decide(msg(), MEMBER, owns_only("discord:other"))
    assert.is_false(d.claim)
    assert.is_nil(d.action)
  end)

  it("the channel key is <surface>:<channelId>, discord by default", function()
    assert.equal("discord:100", claim.key(msg()))
    assert.equal("fake:guests", claim.key(msg { surface = "fake", channelId = "guests" }))
    assert.equal("discord:42", claim.key(msg { channelId = 42 }))
    assert.is_nil(claim.key(msg { channelId = "" }))
    assert.is_nil(claim.key(msg { surface = "" }))
    assert.is_nil(claim.key("nope"))
  end)

  it("threads are their own keys and inherit nothing from a sandboxed parent", function()
    local thread = msg { channelId = "101", threadParentId = "100" }
    assert.equal("discord:101", claim.key(thread))
    assert.is_false(claim.decide(thread, MEMBER, owns_only("discord:100")).claim)
    -- and a sandboxed thread is sandboxed whatever its parent is
    assert.equal("answer", claim.decide(thread, MEMBER, owns_only("discord:101")).action)
  end)

  it("command events are claimed for the commands module", function()
    local d = claim.decide({ type = "command", channelId = "100", guildId = "9" }, nil, owns_only())
    assert.same({ claim = true, priority = 200, action = "command" }, d)
  end)
end)

describe("admission (9.2): everything not admitted is dropped, never routed", function()
  local owns = owns_only("discord:100")

  it("answers a member's mention and a member's reply to the bot", function()
    assert.same({ claim = true, priority = 200, action = "answer" }, claim.decide(msg(), MEMBER, owns))
    local reply = msg { mentionsBot = false, replyToBot = true }
    assert.equal("answer", claim.decide(reply, MEMBER, owns).action)
    assert.same({ id = "alice", name = "Alice", principalId = "p_alice" }, claim.admit(reply, MEMBER))
  end)

  it("answers the owner too, with the owner's principal", function()
    local e = msg { author = { id = "owner", name = "Ada" } }
    local owner = { tier = "owner", principalId = "owner" }
    assert.equal("answer", claim.decide(e, owner, owns).action)
    assert.same({ id = "owner", name = "Ada", principalId = "owner" }, claim.admit(e, owner))
  end)

  for _, case in ipairs {
    { "a bot author", msg { author = { id = "b", name = "B", bot = true } }, MEMBER },
    { "an integration author", msg { author = { id = "i", name = "I", integration = true } }, MEMBER },
    { "a webhook post", msg { webhookId = "w1" }, MEMBER },
    { "an app post", msg { applicationId = "a1" }, MEMBER },
    { "a direct message (no guild)", (function() local e = msg(); e.guildId = nil; return e end)(), MEMBER },
    { "a direct message (empty guild id)", msg { guildId = "" }, MEMBER },
    { "an unaddressed message", msg { mentionsBot = false }, MEMBER },
    { "a truthy but non-boolean mention", msg { mentionsBot = "yes" }, MEMBER },
    { "an unresolved author (no admission)", msg { author = { id = "mallory", name = "M" } }, nil },
    { "an admission without a tier", msg(), { principalId = "p_alice" } },
    { "an admission with an empty principal", msg(), { tier = "member", principalId = "" } },
    { "an author without an id", msg { author = { name = "X" } }, MEMBER },
    { "a message without an author", msg { author = false }, MEMBER },
  } do
    it("drops " .. case[1] .. " in a sandbox channel", function()
      local d = claim.decide(case[2], case[3], owns)
      assert.same({ claim = true, priority = 200, action = "drop" }, d)
      assert.is_nil(claim.admit(case[2], case[3]))
    end)
  end

  it("reads events decoded from JSON, where absent fields are null", function()
    local json = require "sandbox.json"
    local e = json.decode('{"type":"message","id":"m1","surface":null,"channelId":"100","guildId":"9",'
      .. '"threadParentId":null,"author":{"id":"alice","name":"Alice","bot":false,"integration":null},'
      .. '"webhookId":null,"applicationId":null,"mentionsBot":true,"replyToBot":null,"text":"hi",'
      .. '"quoted":null,"attachments":null}')
    assert.equal("discord:100", claim.key(e))
    assert.equal("answer", claim.decide(e, MEMBER, owns).action)
    assert.equal("hi", claim.compose(e))
    local dm = json.decode('{"channelId":"100","guildId":null,"author":{"id":"alice"},"mentionsBot":true}')
    assert.equal("drop", claim.decide(dm, MEMBER, owns).action)
    local hook = json.decode('{"channelId":"100","guildId":"9","author":{"id":"a"},"mentionsBot":true,"webhookId":"w"}')
    assert.equal("drop", claim.decide(hook, MEMBER, owns).action)
    assert.equal("drop", claim.decide(e, json.null, owns).action)
  end)

  it("takes the display name from the author, falling back to the id", function()
    assert.same({ id = "alice", name = "alice", principalId = "p_alice" },
      claim.admit(msg { author = { id = "alice" } }, MEMBER))
  end)

  it("declares the failure text and the background-turn reason", function()
    assert.equal("sandbox turn failed", claim.ADMISSION_FAILURE)
    assert.equal("Background host turns are refused in sandbox channels.", claim.BACKGROUND_REFUSED)
  end)
end)

describe("the turn text (9.3 step 3)", function()
  it("R57: prefixes a non-empty quoted message and appends the attachments note", function()
    local e = msg { text = "What does it mean?", quoted = "Do not trust me", attachments = { { name = "a.png" } } }
    assert.equal("Quoted message (untrusted): Do not trust me\n\nWhat does it mean?\n"
      .. "[Attachments are not supported in this sandbox.]", claim.compose(e))
  end)

  it("leaves out an empty quote and an empty attachment list", function()
    assert.equal("hi", claim.compose(msg { text = "hi", quoted = "", attachments = {} }))
    assert.equal("hi", claim.compose(msg { text = "hi" }))
  end)

  it("accepts the quote as {text=} and the attachments as a count", function()
    assert.equal("Quoted message (untrusted): q\n\nhi\n[Attachments are not supported in this sandbox.]",
      claim.compose(msg { text = "hi", quoted = { text = "q" }, attachments = 2 }))
  end)
end)

describe("the reply splitter (9.3 step 5)", function()
  local function chars(s) return utf8.len(s) end

  it("keeps a short reply whole and gives no piece for an empty one", function()
    assert.same({ "Sealed." }, claim.split("Sealed."))
    assert.same({}, claim.split(""))
    local exact = string.rep("é", 2000)
    assert.same({ exact }, claim.split(exact))
  end)

  it("breaks on paragraph boundaries into pieces of at most 2,000 characters", function()
    local para = string.rep("word ", 300):sub(1, -2)       -- 1,499 characters
    local pieces = claim.split(para .. "\n\n" .. para .. "\n\n" .. para)
    assert.same({ para, para, para }, pieces)
  end)

  it("hard-cuts a text with no break, on character boundaries", function()
    local text = string.rep("ü", 4500)
    local pieces = claim.split(text)
    assert.equal(3, #pieces)
    for _, p in ipairs(pieces) do
      assert.is_true(chars(p) <= 2000)
      assert.truthy(utf8.len(p))
    end
    assert.equal(text, table.concat(pieces))
  end)

  it("closes a fence cut in the middle and reopens it with its language", function()
    local lines = {}
    for i = 1, 300 do lines[i] = "print(" .. i .. ")   -- line" end
    local text = "Here:\n```lua\n" .. table.concat(lines, "\n") .. "\n```\nDone."
    local pieces = claim.split(text)
    assert.is_true(#pieces >= 2)
    for i, p in ipairs(pieces) do
      assert.is_true(chars(p) <= 2000, "piece " .. i .. " too long")
      local _, fences = p:gsub("```", "")
      assert.equal(0, fences % 2, "piece " .. i .. " leaves a fence open")
    end
    assert.truthy(pieces[1]:find("\n```$"))
    assert.truthy(pieces[2]:find("^```lua\n"))
    assert.truthy(pieces[#pieces]:find("Done.$"))
  end)

  it("honours a smaller limit", function()
    for _, p in ipairs(claim.split(string.rep("abc ", 100), 50)) do
      assert.is_true(#p <= 50)
    end
  end)
end)
