-- rich/hostile_bodies_spec.lua: hostile bodies against real rich brokers over
-- real Unix sockets (issue 21 item 2). The brokers run in a host process of
-- their own (spec/support/body_host.lua) whose peak memory (VmHWM, reset once
-- it listens) is what is bounded; curl, a separate process, is the attacker,
-- sending every body at once from several channels while a bystander
-- channel runs turn after turn (each with a model call) in the same host.
-- Each body is at its route's limit and made of the worst shapes for Lua
-- tables: empty objects and arrays, deep nesting, long member names, many
-- small strings, and the worst mix the decode budget still lets through.
-- Without bounded, shape-first decoding the host takes about 64x each body
-- (bench/results.md): several GB here.
local A = require "body_attack"
local spec_fs = require "spec_fs"

local MiB = A.MiB
-- The rule: at most 4x the bodies in flight, plus what the host's own work
-- (the bystander's turns, the model answers) may take.
local FACTOR, SLACK = 4, 64 * MiB

local function run(attacks, kinds)
  local dirs = {}
  local dir = spec_fs.tmpdir("hb", dirs)
  local total = 0
  for n, a in ipairs(attacks) do
    local body = A.body(a.route, a.fill, A.limit_of(a.route), "t" .. a.i)
    assert(#body <= A.limit_of(a.route))
    a.file = ("%s/b%d.json"):format(dir, n)
    A.write(a.file, body)
    total = total + #body
  end
  local ok, report, answers = pcall(A.run, { dir = dir, kinds = kinds, attacks = attacks, settle_ms = 300 })
  spec_fs.rmdirs(dirs)
  assert(ok, report)
  return report, answers, total
end

describe("rich broker: hostile bodies at their limits from several channels (issue 21) #slow", function()
  it("refuses each hostile call alone, serves the bystander throughout, and stays within 4x the bodies", function()
    local kinds = { "result", "result", "model", "model", "compact", "model", "bystander" }
    local attacks = {
      { i = 1, route = "result_unknown", fill = "objects" },   -- an unknown member full of {}
      { i = 2, route = "result_known", fill = "strings" },     -- a known member: many small strings
      { i = 3, route = "model_metadata", fill = "objects" },   -- metadata full of {}: dropped unread
      { i = 4, route = "model_messages", fill = "deep" },      -- messages of 60-deep arrays
      { i = 5, route = "compact_kept", fill = "names" },       -- long member names
      { i = 6, route = "model_messages", fill = "mixed" },     -- the worst mix the budget accepts
    }
    local report, answers, total = run(attacks, kinds)
    assert.equal(400, answers[1].status)
    assert.equal("Invalid result", answers[1].body)
    assert.equal(400, answers[2].status)
    assert.equal("Invalid result", answers[2].body)
    -- 11.1: metadata is dropped; the rebuilt call is served
    assert.equal(200, answers[3].status)
    assert.equal(400, answers[4].status)
    assert.equal("Invalid input", answers[4].body)
    assert.equal(200, answers[5].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[5].body)
    assert.equal(400, answers[6].status)
    assert.truthy(answers[6].body:find("Invalid message", 1, true))
    -- the result channels' turns are still pending (refused packets resolve nothing)
    assert.equal("pending", report.results[1])
    assert.equal("pending", report.results[2])
    assert.is_true(report.bystander.ok >= 1, "the bystander was not served")
    assert.equal(0, report.bystander.failed)
    local peak = (report.hwm_kb - report.rss0_kb) * 1024
    assert.is_true(peak <= FACTOR * total + SLACK,
      ("host peak %.0f MiB for %.0f MiB of bodies (%.2fx)"):format(peak / MiB, total / MiB, peak / total))
  end)

  it("refuses the same shapes under the budget on every route kind at once, 8 MiB each, several per channel kind", function()
    local kinds = { "result", "model", "compact", "model", "compact", "bystander" }
    local attacks = {
      { i = 1, route = "result_known", fill = "objects" },
      { i = 2, route = "model_messages", fill = "arrays" },
      { i = 3, route = "compact_unknown", fill = "objects" },
      { i = 4, route = "model_messages", fill = "members" },
      { i = 5, route = "compact_kept", fill = "objects" },
    }
    for _, a in ipairs(attacks) do a.limit = 8 * MiB end
    local saved = A.limit_of
    A.limit_of = function() return 8 * MiB end
    local ok, report, answers, total = pcall(run, attacks, kinds)
    A.limit_of = saved
    assert(ok, report)
    assert.equal(400, answers[1].status)
    assert.equal(400, answers[2].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[3].body)
    assert.equal(400, answers[4].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[5].body)
    assert.equal(0, report.bystander.failed)
    assert.is_true(report.bystander.ok >= 1)
    local peak = (report.hwm_kb - report.rss0_kb) * 1024
    assert.is_true(peak <= FACTOR * total + SLACK,
      ("host peak %.0f MiB for %.0f MiB of bodies (%.2fx)"):format(peak / MiB, total / MiB, peak / total))
  end)
end)
