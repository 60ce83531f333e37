-- scrub.lua: scrub_diagnostic(text, max), a failure reason that is safe to
-- deliver into a guest channel (spec fetch-and-delegation.md section 2).
--
-- Design: the text is first made valid UTF-8 (each invalid byte becomes
-- U+FFFD) and cut to max(4 * max, 4096) code points. Every masking rule then
-- scans that text once, left to right, and records byte intervals to hide;
-- no rule rewrites the text, so a later rule sees the original bytes and an
-- earlier mask never splits a later one's value (no `]]`, no surviving tail).
-- The intervals are merged and each merged run becomes one `[redacted]`.
-- Every scanner moves forward only and looks at each byte a bounded number of
-- times, so the whole pass is linear: no pattern that can backtrack.
local M = {}

M.DEFAULT_MAX = 600
M.MASK = "[redacted]"
M.E_LIMIT = "Invalid diagnostic limit"

local byte, sub, find, lower = string.byte, string.sub, string.find, string.lower
local concat = table.concat

local REPLACEMENT = "\239\191\189" -- U+FFFD
local ELLIPSIS = "\226\128\166"    -- U+2026

-- Byte classes ---------------------------------------------------------------

local ALNUM, WORD, TOKEN, B64URL, NAME, SPACE = {}, {}, {}, {}, {}, {}
for c = byte "0", byte "9" do ALNUM[c] = true end
for c = byte "A", byte "Z" do ALNUM[c] = true end
for c = byte "a", byte "z" do ALNUM[c] = true end
for c in pairs(ALNUM) do WORD[c] = true; TOKEN[c] = true; B64URL[c] = true; NAME[c] = true end
WORD[byte "_"] = true
for ch in ("-._~+/="):gmatch(".") do TOKEN[byte(ch)] = true end
for ch in ("-_"):gmatch(".") do B64URL[byte(ch)] = true end
for ch in ("-_."):gmatch(".") do NAME[ch:byte()] = true end
for ch in (" \t\r\n\f\v"):gmatch(".") do SPACE[byte(ch)] = true end

local B_NL, B_CR, B_SP, B_TAB = 10, 13, 32, 9
local B_COLON, B_EQ, B_AT = byte ":", byte "=", byte "@"
local B_DQ, B_SQ, B_BSL = byte '"', byte "'", byte "\\"

local function is_digit(c) return c and c >= 48 and c <= 57 end
local function is_lower(c) return c and c >= 97 and c <= 122 end
local function is_upper(c) return c and c >= 65 and c <= 90 end

-- UTF-8 -----------------------------------------------------------------------

-- The first `limit` code points of s (math.huge: all), every invalid byte
-- replaced by U+FFFD. Linear: utf8.len stops at the first invalid byte.
local function sanitize(s, limit)
  if limit ~= math.huge and #s > 4 * limit then s = sub(s, 1, 4 * limit) end
  local parts, n, i, len = {}, 0, 1, #s
  while i <= len do
    local count, bad = utf8.len(s, i)
    if count then
      parts[#parts + 1] = sub(s, i); n = n + count; break
    end
    if bad > i then
      parts[#parts + 1] = sub(s, i, bad - 1); n = n + utf8.len(s, i, bad - 1)
    end
    parts[#parts + 1] = REPLACEMENT; n = n + 1
    i = bad + 1
  end
  local out = concat(parts)
  if n > limit then out = sub(out, 1, utf8.offset(out, limit + 1) - 1) end
  return out
end

-- White space for trimming (spec 3.2): U+0009..U+000D, U+0020, U+00A0,
-- U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF.
local function is_trim_space(cp)
  return (cp >= 9 and cp <= 13) or cp == 32 or cp == 0xA0 or cp == 0x1680
    or (cp >= 0x2000 and cp <= 0x200A) or cp == 0x2028 or cp == 0x2029
    or cp == 0x202F or cp == 0x205F or cp == 0x3000 or cp == 0xFEFF
end
M.is_trim_space = is_trim_space

-- Trims valid UTF-8 text of that white space at both ends.
local function trim(s)
  local i, j = 1, #s
  while i <= j do
    local cp = utf8.codepoint(s, i)
    if not is_trim_space(cp) then break end
    i = utf8.offset(s, 2, i)
  end
  while j >= i do
    local start = j
    while start > i do
      local b = byte(s, start)
      if b < 0x80 or b >= 0xC0 then break end
      start = start - 1
    end
    if not is_trim_space(utf8.codepoint(s, start)) then break end
    j = start - 1
  end
  return sub(s, i, j)
end
M.trim = trim

-- Masking rules (spec 2, steps 2 and 3) -----------------------------------------
-- Each adds [from, to] byte intervals of s (valid UTF-8) to `marks`.

local function mark(marks, from, to)
  if to >= from then marks[#marks + 1] = { from, to } end
end

local function line_end(s, i)
  local len = #s
  while i <= len do
    local c = byte(s, i)
    if c == B_NL or c == B_CR then return i - 1 end
    i = i + 1
  end
  return len
end

local function skip_blanks(s, i)
  local c = byte(s, i)
  while c == B_SP or c == B_TAB do i = i + 1; c = byte(s, i) end
  return i
end

-- URL userinfo: after `://`, up to the last `@` of the authority (which ends
-- at `/`, `?`, `#`, white space or the end). Authorities of successive `://`
-- never overlap (the next one's `/` ends this one), so this is linear.
local AUTH_END = { [byte "/"] = true, [byte "?"] = true, [byte "#"] = true }
local function mask_userinfo(s, marks)
  local init = 1
  while true do
    local p = find(s, "://", init, true)
    if not p then return end
    local i, len, last_at = p + 3, #s, nil
    while i <= len do
      local c = byte(s, i)
      if AUTH_END[c] or SPACE[c] then break end
      if c == B_AT then last_at = i end
      i = i + 1
    end
    if last_at then mark(marks, p + 3, last_at - 1) end
    init = p + 3
  end
end

-- `authorization` / `proxy-authorization` then `:` or `=`: the rest of the
-- line (after the separator).
local function mask_authorization(s, ls, marks)
  local init = 1
  while true do
    local p, q = find(ls, "authorization", init, true)
    if not p then return end
    local i = skip_blanks(s, q + 1)
    local c = byte(s, i)
    if c == B_COLON or c == B_EQ then
      local from = skip_blanks(s, i + 1)
      local to = line_end(s, from)
      mark(marks, from, to)
      init = to + 1
    else
      init = q + 1
    end
  end
end

-- Header lines: cookie, set-cookie, x-api-key, x-auth-token, x-access-token
-- at the start of a line (or after white space), then `:`: the value to the
-- end of the line. Not after `/` or a word byte, so `https://x-access-token:`
-- in a URL is left to the userinfo rule and the text after it survives.
local HEADERS = { "set-cookie", "cookie", "x-api-key", "x-auth-token", "x-access-token" }
local function mask_headers(s, ls, marks)
  for _, name in ipairs(HEADERS) do
    local init = 1
    while true do
      local p, q = find(ls, name, init, true)
      if not p then break end
      init = q + 1
      local before = byte(s, p - 1)
      if before == nil or SPACE[before] or before == B_DQ or before == B_SQ then
        local i = skip_blanks(s, q + 1)
        if byte(s, i) == B_COLON then
          local from = skip_blanks(s, i + 1)
          local to = line_end(s, from)
          mark(marks, from, to)
          init = to + 1
        end
      end
    end
  end
end

-- Does the run s[from..to] (token characters) look like a credential?
local CRED_PUNCT = { [byte "+"] = true, [byte "/"] = true, [byte "="] = true, [byte "_"] = true, [byte "~"] = true }
local function looks_like_credential(s, from, to)
  if to - from + 1 >= 32 then return true end
  local prev
  for i = from, to do
    local c = byte(s, i)
    if is_digit(c) or CRED_PUNCT[c] then return true end
    if is_upper(c) and is_lower(prev) then return true end
    prev = c
  end
  return false
end

local function token_run_end(s, i)
  local len = #s
  while i <= len and TOKEN[byte(s, i)] do i = i + 1 end
  return i - 1
end

-- `bearer`, `basic`, `token` as a word, white space, then a run of at least 8
-- token characters that looks like a credential.
local SCHEMES = { "bearer", "basic", "token" }
local function mask_schemes(s, ls, marks)
  for _, word in ipairs(SCHEMES) do
    local init = 1
    while true do
      local p, q = find(ls, word, init, true)
      if not p then break end
      init = q + 1
      if not WORD[byte(s, p - 1) or 0] and not WORD[byte(s, q + 1) or 0] then
        local i = q + 1
        local c = byte(s, i)
        if c and SPACE[c] then
          while c and SPACE[c] do i = i + 1; c = byte(s, i) end
          local e = token_run_end(s, i)
          if e - i + 1 >= 8 and looks_like_credential(s, i, e) then
            mark(marks, i, e)
            init = e + 1
          end
        end
      end
    end
  end
end

-- Well-known token prefixes (case as issued): the whole run of token
-- characters, when the prefix starts a word.
local PREFIXES = {
  { "ghp_", 1 }, { "gho_", 1 }, { "ghu_", 1 }, { "ghs_", 1 }, { "ghr_", 1 },
  { "github_pat_", 1 }, { "glpat-", 1 }, { "sk-", 1 }, { "xoxa-", 1 }, { "xoxb-", 1 },
  { "xoxp-", 1 }, { "xoxr-", 1 }, { "xoxs-", 1 }, { "AKIA", 4 }, { "AIza", 4 },
}
local function mask_prefixes(s, marks)
  for _, pf in ipairs(PREFIXES) do
    local prefix, min_tail = pf[1], pf[2]
    local init = 1
    while true do
      local p, q = find(s, prefix, init, true)
      if not p then break end
      init = q + 1
      if not ALNUM[byte(s, p - 1) or 0] then
        local e = token_run_end(s, q + 1)
        if e - q >= min_tail then
          mark(marks, p, e)
          init = e + 1
        end
      end
    end
  end
end

-- JWT: `eyJ` + base64url, `.`, base64url, `.`, base64url (the last may be
-- empty), at the start of a run.
local B_DOT = byte "."
local function b64_end(s, i)
  local len = #s
  while i <= len and B64URL[byte(s, i)] do i = i + 1 end
  return i - 1
end
local function mask_jwts(s, marks)
  local init = 1
  while true do
    local p = find(s, "eyJ", init, true)
    if not p then return end
    init = p + 3
    local before = byte(s, p - 1)
    if not (before and (B64URL[before] or before == B_DOT)) then
      local e1 = b64_end(s, p + 3)
      if byte(s, e1 + 1) == B_DOT then
        local e2 = b64_end(s, e1 + 2)
        if e2 > e1 + 1 and byte(s, e2 + 1) == B_DOT then
          local e3 = b64_end(s, e2 + 2)
          mark(marks, p, e3)
          init = e3 + 1
        end
      end
    end
  end
end

-- PEM private keys: `-----BEGIN … PRIVATE KEY-----` through the matching
-- END line, or to the end of the text.
local function mask_pem(s, marks)
  local init = 1
  while true do
    local p, q = find(s, "-----BEGIN ", init, true)
    if not p then return end
    init = q + 1
    local dash = find(s, "-----", q + 1, true)
    if not dash then return end
    local label = sub(s, q + 1, dash - 1)
    if not find(label, "[\r\n]") then
      if sub(label, -11) == "PRIVATE KEY" then
        local endline = "-----END " .. label .. "-----"
        local _, eq = find(s, endline, dash + 5, true)
        local to = eq and eq or #s
        mark(marks, p, to)
        init = to + 1
      end
    end
  end
end

-- Step 3: secret-named assignments.
local KEYWORDS = { "token", "secret", "password", "passwd", "api_key", "api-key", "apikey", "credential" }
local SUFFIXES = {
  "policy", "rules", "length", "count", "limit", "max", "min", "type", "format", "expir", "ttl",
  "lifetime", "required", "enabled", "strategy", "file", "path", "url", "name", "field", "prompt",
  "hint", "window", "budget", "usage",
}
local SEP = { [byte "_"] = true, [byte "-"] = true, [byte "."] = true }

-- nil (not secret), "token" (secret only through `token`) or "secret".
local function name_kind(lname)
  local kind
  for _, kw in ipairs(KEYWORDS) do
    local init = 1
    while true do
      local p, q = find(lname, kw, init, true)
      if not p then break end
      init = q + 1
      local ok = true
      if kw == "token" and byte(lname, q + 1) == byte "s" then ok = false end
      if ok then
        local i = q + 1
        while SEP[byte(lname, i) or 0] do i = i + 1 end
        for _, suffix in ipairs(SUFFIXES) do
          if sub(lname, i, i + #suffix - 1) == suffix then ok = false; break end
        end
      end
      if ok then
        if kw ~= "token" then return "secret" end
        kind = "token"
      end
    end
  end
  return kind
end

local VALUE_END = {
  [byte '"'] = true, [byte "'"] = true, [byte ","] = true, [byte "&"] = true,
  [byte ";"] = true, [byte "}"] = true, [byte "]"] = true,
}

local function mask_assignments(s, ls, marks)
  local len, i = #s, 1
  while i <= len do
    local c = byte(s, i)
    if NAME[c] then
      local from = i
      while i <= len and NAME[byte(s, i)] do i = i + 1 end
      local to = i - 1
      -- `"name"` or `'name'`, then blanks, then `:` or `=`, then blanks.
      local j = i
      local open = byte(s, from - 1)
      if (open == B_DQ or open == B_SQ) and byte(s, j) == open then j = j + 1 end
      j = skip_blanks(s, j)
      local sep = byte(s, j)
      if sep == B_COLON or sep == B_EQ then
        local kind = name_kind(sub(ls, from, to))
        if kind then
          local v = skip_blanks(s, j + 1)
          local q = byte(s, v)
          local vfrom, vto
          if q == B_DQ or q == B_SQ then
            vfrom = v + 1
            local k = vfrom
            while k <= len do
              local b = byte(s, k)
              if b == B_BSL then k = k + 2
              elseif b == q then break
              else k = k + 1 end
            end
            vto = math.min(k, len + 1) - 1
            i = vto + 2
          else
            vfrom = v
            local k = v
            while k <= len do
              local b = byte(s, k)
              if SPACE[b] or VALUE_END[b] then break end
              k = k + 1
            end
            vto = k - 1
            i = k
          end
          local digits = vto >= vfrom and not find(sub(s, vfrom, vto), "%D")
          if not (kind == "token" and digits) then mark(marks, vfrom, vto) end
        end
      end
    else
      i = i + 1
    end
  end
end

-- Replaces each merged run of marked bytes with one MASK.
local function apply(s, marks)
  if #marks == 0 then return s end
  table.sort(marks, function(a, b) return a[1] < b[1] end)
  local out, pos = {}, 1
  local cur_from, cur_to = marks[1][1], marks[1][2]
  local function flush()
    out[#out + 1] = sub(s, pos, cur_from - 1)
    out[#out + 1] = M.MASK
    pos = cur_to + 1
  end
  for k = 2, #marks do
    local m = marks[k]
    if m[1] <= cur_to + 1 then
      if m[2] > cur_to then cur_to = m[2] end
    else
      flush()
      cur_from, cur_to = m[1], m[2]
    end
  end
  flush()
  out[#out + 1] = sub(s, pos)
  return concat(out)
end

-- The limit check shared with the delegator: an integral value >= 1, or
-- math.huge.
function M.valid_limit(v)
  if math.type(v) == "integer" then return v >= 1 end
  if math.type(v) ~= "float" then return false end
  if v == math.huge then return true end
  return v >= 1 and v == math.floor(v) and v < math.huge
end

-- scrub_diagnostic(text, max): see the top of this file and spec section 2.
function M.scrub_diagnostic(text, max)
  if max == nil then max = M.DEFAULT_MAX end
  if not M.valid_limit(max) then error(M.E_LIMIT, 0) end
  if max ~= math.huge then max = math.tointeger(max) or max end
  if type(text) ~= "string" then text = tostring(text) end

  -- 1. Valid UTF-8, cut to max(4 * max, 4096) code points.
  local keep = max == math.huge and math.huge or math.max(4 * max, 4096)
  local s = sanitize(text, keep)

  -- 2 and 3. Mask credential shapes and secret-named assignments.
  local ls = lower(s)
  local marks = {}
  mask_userinfo(s, marks)
  mask_authorization(s, ls, marks)
  mask_headers(s, ls, marks)
  mask_schemes(s, ls, marks)
  mask_prefixes(s, marks)
  mask_jwts(s, marks)
  mask_pem(s, marks)
  mask_assignments(s, ls, marks)
  s = apply(s, marks)

  -- 4. C0 controls but tab and LF, and DEL, become spaces; trim.
  s = s:gsub("[\0-\8\11-\31\127]", " ")
  s = trim(s)

  -- 5. Bound to max code points, ending in an ellipsis when cut.
  if max ~= math.huge and utf8.len(s) > max then
    s = sub(s, 1, utf8.offset(s, max) - 1) .. ELLIPSIS
  end
  return s
end

return M
