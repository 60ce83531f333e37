-- gc_mode.lua: busted's helper (.busted): specs run under the collector the
-- product's own host processes use (sandbox.cli.GC_MODE), so what they
-- exercise is what runs.
collectgarbage(require("sandbox.cli").GC_MODE)
