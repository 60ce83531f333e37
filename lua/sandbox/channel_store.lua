-- channel_store.lua: `require "sandbox.channel_store"`, the module name
-- spec/runtime.md section 10 gives trusted host code for the channel store;
-- the store itself lives in channels/init.lua.
return require "sandbox.channels"
