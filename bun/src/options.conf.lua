-- options.conf.lua: the config script the Bun bridge runs when sandbox() gets
-- no `config` path. The engine calls it with the decoded options_json; it
-- returns the sandbox{} options the TypeScript caller gave (JSON values only:
-- host tools and MCP keys need a Lua config of their own), which the engine
-- checks with sandbox{} exactly as it checks an operator's config.
local opts = ...
local given = type(opts) == "table" and opts.sandbox or nil
return require("sandbox")(type(given) == "table" and given or {})
