-- body_attack.lua: hostile request bodies against a measured host process of
-- rich brokers (spec/support/body_host.lua), for spec/rich/hostile_bodies_spec.lua
-- and bench/body_memory_bench.lua (issue 21 item 2). The attacker is
-- spec/support/body_send.lua, one process per request, so the host's peak
-- memory holds only what the host built.
--
--   local A = require "body_attack"
--   A.body(route, fill, size) -> the JSON text (route: result_unknown, result_known,
--        model_metadata, model_messages, compact_kept, compact_unknown; fill: an A.FILLS
--        key, or "mixed": the worst body the decode budget still accepts)
--   A.run{ tree = dir|nil, kinds = {...}, attacks = {{i=, route=, file=}, ...}, dir = tmp }
--     -> report {rss0_kb, hwm_kb, bystander, results}, answers {[n] = {status, body}}
local spec_fs = require "spec_fs"

local M = {}

M.MiB = 1024 * 1024
-- Each route's body limit (spec/rich-mode.md 9 step 12, 10.5, 15.3's default).
M.LIMITS = { result = 72 * M.MiB, model = 96 * M.MiB, compact = 32 * M.MiB,
  sealed = 256 * 1024, precheck = 64 * 1024 }

-- One element of a filler array, each a worst shape for Lua tables.
M.FILLS = {
  objects = "{}",
  arrays = "[]",
  deep = ("["):rep(60) .. ("]"):rep(60),
  strings = '"a"',
  names = '{"' .. ("n"):rep(200) .. '":0}',
  members = '{"a":{},"b":[]}',
}

local HEADS = {
  result_unknown = { '{"turnId":"T","result":{"ok":true,"text":"done","files":[]},"junk":[', "]}" },
  result_known = { '{"turnId":"T","result":{"ok":true,"files":[],"text":[', "]}}" },
  model_metadata = { '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"metadata":[', "]}" },
  model_messages = { '{"max_tokens":5,"messages":[', "]}" },
  compact_kept = { '{"reason":"manual","tokensBefore":1,"firstKeptEntryId":"e1","isSplitTurn":false,'
    .. '"messagesToSummarize":[],"turnPrefixMessages":[],"readFiles":[],"modifiedFiles":[],"keptMessages":[', "]}" },
  sealed_junk = { '{"messages":[{"role":"user","content":"hi"}],"junk":[', "]}" },
  precheck_junk = { '{"jsonrpc":"2.0","id":1,"method":"tools/call","junk":[', "]}" },
  compact_unknown = { '{"reason":"manual","tokensBefore":1,"firstKeptEntryId":"e1","isSplitTurn":false,'
    .. '"messagesToSummarize":[],"turnPrefixMessages":[],"keptMessages":[],"readFiles":[],"modifiedFiles":[],"junk":[', "]}" },
}

function M.limit_of(route) return M.LIMITS[route:match("^(%a+)_")] end

-- The body of `route` filled with `fill` up to at most `size` bytes; the
-- result packet's turnId is `turn_id`.
function M.body(route, fill, size, turn_id)
  if fill == "mixed" then return M.body_mixed(route, size, 3.05, turn_id) end
  local h = HEADS[route]
  local head = h[1]:gsub('"T"', '"' .. (turn_id or "t1") .. '"')
  local el = M.FILLS[fill]
  local n = (size - #head - #h[2] + 1) // (#el + 1)
  return head .. (el .. ","):rep(n - 1) .. el .. h[2]
end

-- The worst body the budget still lets through: one long string and enough
-- empty objects that the scan's estimate comes to about `factor` x the body
-- (a string costs about its bytes; "{}," about 80 per byte).
function M.body_mixed(route, size, factor, turn_id)
  local h = HEADS[route]
  local head = h[1]:gsub('"T"', '"' .. (turn_id or "t1") .. '"')
  local room = size - #head - #h[2] - 4
  local q = math.floor(room * (factor - 1) / (80 - 1 + factor - 1))
  local n = q // 3
  return head .. '"' .. ("x"):rep(room - 3 * n) .. '",' .. ("{},"):rep(n - 1) .. "{}" .. h[2]
end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

local read = spec_fs.read
M.write = spec_fs.write

local PATHS = { result = "/worker/result", model = "/anthropic/v1/messages", compact = "/compaction/compact",
  sealed = "/model", precheck = "/model" }

-- Starts the host on `tree` (nil: this checkout), runs every attack at once,
-- and returns the host's report and each attack's answer.
function M.run(o)
  local json = require "sandbox.json"
  local tree = o.tree or "."
  local dir = o.dir
  local support = o.support or "spec/support"
  local env = ("LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' LUA_CPATH='%s/build/lua/?.so;;' BODY_HOST_SUPPORT='%s'"):format(
    tree, tree, tree, support)
  if o.compact_max then env = env .. " BODY_HOST_COMPACT_MAX=" .. o.compact_max end
  -- (an ASan pass preloads its runtime: the measured host and the attacker go without)
  os.execute(("env -u LD_PRELOAD %s lua5.4 %s/body_host.lua %s %s >%s/host.log 2>&1 &"):format(env, support, dir,
    table.concat(o.kinds, " "), dir))
  for _ = 1, 600 do
    if read(dir .. "/ready") then break end
    os.execute("sleep 0.05")
  end
  assert(read(dir .. "/ready"), "the host did not start: " .. (read(dir .. "/host.log") or ""))
  -- The attacker: spec/support/body_send.lua in processes of their own, on
  -- this checkout's tree (whatever tree the host runs).
  local send = ("env -u LD_PRELOAD LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='build/lua/?.so;;' "
    .. "BODY_HOST_SUPPORT='%s' lua5.4 %s/body_send.lua"):format(support, support)
  local cmds = {}
  for n, a in ipairs(o.attacks) do
    local kind = a.route:match("^(%a+)_")
    local host = (kind == "sealed" or kind == "precheck") and "broker" or "localhost"     -- core/http_head.h
    cmds[#cmds + 1] = ("%s %s/%d.sock %s %s %s %s/a%d %s %s/go &"):format(send, dir, a.i, host, PATHS[kind], a.file, dir, n,
      kind == "result" and "/worker/next" or "-", dir)
  end
  -- every head sent before any body (body_send.lua), then all bodies at once
  local waiter = ("for n in $(seq %d); do for t in $(seq 2400); do [ -e %s/a$n.head ] && break; sleep 0.05; done; done; : >%s/go")
    :format(#o.attacks, dir, dir)
  sh(table.concat(cmds, "\n") .. "\n" .. waiter .. "\nwait")
  if o.settle_ms then os.execute(("sleep %.2f"):format(o.settle_ms / 1000)) end
  M.write(dir .. "/done", "")
  local report
  for _ = 1, 600 do
    report = read(dir .. "/report")
    if report then break end
    os.execute("sleep 0.05")
  end
  assert(report, "the host did not report: " .. (read(dir .. "/host.log") or ""))
  local answers = {}
  for n = 1, #o.attacks do
    answers[n] = { status = tonumber(read(("%s/a%d.status"):format(dir, n)) or ""), body = read(("%s/a%d.body"):format(dir, n)) }
  end
  return json.decode(report), answers
end

return M
