-- claim.lua: `require "sandbox.claim"`, the module name spec/runtime.md
-- section 10 gives trusted host code for the claim and its admission
-- predicate; the claim lives with the rest of the channel subsystem in
-- channels/claim.lua.
return require "sandbox.channels.claim"
