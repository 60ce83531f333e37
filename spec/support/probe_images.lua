-- probe_images.lua: what the real-Docker specs share about their hostile
-- test images (spec/docker/): the prerequisites they assert (Linux, a
-- non-root account, a daemon that answers, the worker image), and images
-- built FROM scratch from one static C program, one ENTRYPOINT mode each,
-- removed with their containers when the spec ends.
--
--   local P = require "probe_images"
--   P.require_docker(image)                      asserts, naming the fix
--   local worker = P.worker(dir, "name:" .. tag) the real worker image of this
--                                                tree under the spec's own name
--   local images = P.build(dir, "spec/fixtures/hostile/probe.c", modes,
--                          function(mode) return "name:" .. tag end)
--   P.remove(images)                             containers first, then images
--   P.remove_containers_of(image)                the containers made from
--                                                exactly that image name
local assert = require "luassert"
local core = require "sandbox.core"
local spec_fs = require "spec_fs"

local M = {}

local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

function M.require_docker(image)
  assert.equal("Linux", sh("uname -s"))
  assert.is_not.equal(0, (core.getuid()), "run the Docker specs as the non-root sbx account")
  local _, rc = sh("docker info")
  assert.equal(0, rc, "the Docker daemon does not answer (make deps starts it)")
  if image then
    _, rc = sh("docker image inspect " .. image)
    assert.equal(0, rc, "make image first (" .. image .. ")")
  end
end

-- The real worker image built from this tree's build (worker/image.sh, the
-- `make image` recipe) under `name`, so another checkout's `make image`
-- retagging pi-roundtable-sandbox:local meanwhile cannot swap the worker
-- under test; SBX_TEST_IMAGE names a prebuilt image instead. Returns the
-- image and the list P.remove takes ({} for SBX_TEST_IMAGE's).
function M.worker(dir, name)
  local given = os.getenv("SBX_TEST_IMAGE")
  if given and given ~= "" then
    M.require_docker(given)
    return given, {}
  end
  M.require_docker()
  local build = package.cpath:match("(build[%w%-]*)/lua/%?%.so") or "build"
  local out, rc = sh("SBX_IMAGE=" .. q(name) .. " SBX_IMAGE_CONTEXT=" .. q(dir .. "/worker-ctx")
    .. " bash worker/image.sh " .. q(build))
  assert.equal(0, rc, "the worker image recipe (worker/image.sh) failed: " .. out)
  return name, { name }
end

-- Compiles src statically into dir/ctx and builds one image per mode;
-- returns {mode = image name}.
function M.build(dir, src, modes, name_of)
  local ctx = dir .. "/ctx"
  os.execute("mkdir -p " .. q(ctx))
  local out, rc = sh("cc -static -O2 -o " .. q(ctx .. "/probe") .. " " .. q(src))
  assert.equal(0, rc, out)
  local images = {}
  for _, mode in ipairs(modes) do
    local f = assert(io.open(ctx .. "/Dockerfile", "w"))
    f:write("FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT [\"/probe\", \"" .. mode .. "\"]\n")
    f:close()
    images[mode] = name_of(mode)
    out, rc = sh("docker build -q -t " .. images[mode] .. " " .. q(ctx))
    assert.equal(0, rc, out)
  end
  return images
end

-- Removes the containers created from exactly this image name, and no
-- other: not `--filter ancestor=`, which matches every container whose image
-- has the same ID or descends from it. A spec's own tag of the worker image
-- shares the ID of pi-roundtable-sandbox:local, so that filter also removed
-- the operator's (or another checkout's) live sandboxes on the same daemon.
-- Bounded: a daemon that hangs on removals cannot hang the spec.
function M.remove_containers_of(image)
  local out = sh("docker ps -a --no-trunc --format '{{.ID}} {{.Image}}'")
  local ids = {}
  for id, name in out:gmatch("(%x+) (%S+)") do
    if name == image then ids[#ids + 1] = id end
  end
  if #ids > 0 then sh("timeout 120 docker rm -f " .. table.concat(ids, " ")) end
end

-- Containers first (they hold the image), then the image: a shared ID is
-- only untagged.
function M.remove(images)
  for _, image in pairs(images) do
    M.remove_containers_of(image)
    sh("timeout 120 docker image rm " .. q(image))
  end
end

-- This process's peak resident growth (bytes) while fn runs: the peak
-- (VmHWM) is reset to the current size first (clear_refs 5).
function M.peak_growth(fn)
  local function kib(field)
    local f = assert(io.open("/proc/self/status"))
    local s = f:read("a")
    f:close()
    return tonumber(s:match(field .. ":%s+(%d+) kB"))
  end
  collectgarbage()
  collectgarbage()
  local f = assert(io.open("/proc/self/clear_refs", "w"), "cannot reset VmHWM")
  f:write("5")
  f:close()
  local rss0 = kib("VmRSS")
  local res = table.pack(fn())
  return (kib("VmHWM") - rss0) * 1024, table.unpack(res, 1, res.n)
end

return M
