-- count_handler.lua: the busted output handler scripts/check.sh runs every
-- busted suite with (-o spec/support/count_handler.lua -Xoutput FILE).
-- Prints one line per test to stdout (the log) and keeps "passed failed
-- skipped state" in FILE, rewritten after every test, so a run that dies
-- midway still tells how far it got. Errors outside an `it` (load errors,
-- hooks) count as failed.
return function(options)
  local busted = require 'busted'
  local handler = require 'busted.outputHandlers.base'()
  local counts_file = options.arguments and options.arguments[1]
  local passed, failed, skipped = 0, 0, 0
  local failures = {}

  local function save(state)
    if not counts_file then return end
    local f = io.open(counts_file, 'w')
    if f then f:write(string.format('%d %d %d %s\n', passed, failed, skipped, state)); f:close() end
  end
  local function out(s) io.stdout:write(s, '\n'); io.stdout:flush() end
  local function where(element)
    local t = element and element.trace
    if t and t.short_src then return t.short_src .. ':' .. tostring(t.currentline) end
    return '?'
  end
  local function text(message)
    if message == nil then return 'nil error' end
    if type(message) ~= 'string' then
      local ok, pretty = pcall(require, 'pl.pretty')
      return ok and pretty.write(message) or tostring(message)
    end
    return message
  end
  local function add_failure(kind, name, element, message)
    failed = failed + 1
    failures[#failures + 1] = string.format('%s %s (%s)\n    %s', kind, name, where(element),
      (text(message):gsub('\n', '\n    ')))
    out(string.format('%s %s (%s)', kind, name, where(element)))
  end

  handler.testStart = function(element)
    out('.... ' .. handler.getFullName(element))
    return nil, true
  end

  handler.testEnd = function(element, parent, status)
    local name = handler.getFullName(element)
    if status == 'success' then
      passed = passed + 1
      out('ok   ' .. name)
    elseif status == 'pending' then
      skipped = skipped + 1
      local p = handler.pendings[#handler.pendings]
      local msg = p and p.message
      out('SKIP ' .. name .. ((msg and msg ~= '') and (': ' .. text(msg)) or ''))
    elseif status == 'failure' then
      local f = handler.failures[#handler.failures]
      add_failure('FAIL', name, element, f and f.message)
    else
      local e = handler.errors[#handler.errors]
      add_failure('ERR ', name, element, e and e.message)
    end
    save('running')
    return nil, true
  end

  -- Failures and errors not inside an `it`: a file that does not load, a
  -- describe that raises, a failing setup/before_each/after_each.
  local function outside_it(element, parent, message)
    if element.descriptor ~= 'it' then
      add_failure('ERR ', (element.descriptor or '?') .. ' ' .. handler.getFullName(element), element, message)
      save('running')
    end
    return nil, true
  end

  handler.suiteEnd = function()
    if #failures > 0 then
      out('')
      out('Failures and errors (' .. #failures .. '):')
      for i = 1, #failures do out(string.format('%d) %s', i, failures[i])) end
    end
    out(string.format('busted: %d passed, %d failed, %d skipped', passed, failed, skipped))
    save('done')
    return nil, true
  end

  save('running')
  busted.subscribe({ 'test', 'start' }, handler.testStart)
  busted.subscribe({ 'test', 'end' }, handler.testEnd)
  busted.subscribe({ 'error' }, outside_it)
  busted.subscribe({ 'failure' }, outside_it)
  busted.subscribe({ 'suite', 'end' }, handler.suiteEnd)
  return handler
end
