-- commands.lua: `require "sandbox.commands"`, the module name spec/runtime.md
-- section 10 gives trusted host code for the owner commands; they live with
-- the rest of the channel subsystem in channels/commands.lua.
return require "sandbox.channels.commands"
