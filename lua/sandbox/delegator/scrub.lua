-- delegator/scrub.lua: scrub_diagnostic(text, max), a failure reason that is safe to
-- deliver into a guest channel (spec fetch-and-delegation.md section 2).
--
-- The scan lives in C (core/scrub.c, sbx_scrub_diagnostic, fuzzed by
-- fuzz/scrub_fuzz.c); this module only names it for init.lua and the
-- delegator. The trimming white space (spec 3.2) and the limit rule are the
-- C ones too, so there is one implementation of each.
local core = require "sandbox.core"

local M = {}

M.DEFAULT_MAX = 600
M.MASK = "[redacted]"
M.E_LIMIT = require("sandbox.errors").DIAGNOSTIC_LIMIT

-- scrub_diagnostic(text, max): max nil (600), an integral value >= 1 or
-- math.huge; anything else raises M.E_LIMIT. A non-string text goes through
-- tostring.
M.scrub_diagnostic = core.scrub_diagnostic

-- Trims valid UTF-8 text of the spec 3.2 white space at both ends.
M.trim = core.scrub_trim

-- The limit check shared with the delegator: an integral value >= 1, or
-- math.huge.
M.valid_limit = core.scrub_valid_limit

-- True when code point cp is spec 3.2 white space.
function M.is_trim_space(cp)
  return core.scrub_trim(utf8.char(cp)) == ""
end

return M
