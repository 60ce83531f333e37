-- cli/check_url.lua: `sbx check-url URL`: assert_public_url from the shell;
-- cli/fetch.lua does the work (one parser, one error format for both).
local fetch = require "sandbox.cli.fetch"

return {
  help = fetch.help_check_url,
  run = function(args) return fetch.run(args, true) end,
}
