-- research.lua: `require "sandbox.research"`, the module name
-- spec/fetch-and-delegation.md section 4 gives the research worker; it lives
-- with the rest of the delegation subsystem in delegator/research.lua.
return require "sandbox.delegator.research"
