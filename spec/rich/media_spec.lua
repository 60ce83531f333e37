-- rich/media_spec.lua: the turn-image and reply-file bounds (spec/rich-mode.md
-- 16.1-16.2; behaviours 122 and 123) as runTurn and the broker's result
-- packet apply them (rich/_media.lua).
local json = require "sandbox.json"
local media = require "sandbox.rich._media"

local PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
local function arr(t) return json.array(t) end
local function file(name, data) return json.object({ "name", "data" }, { name = name, data = data }) end
local function image(data, mime) return json.object({ "data", "mimeType" }, { data = data, mimeType = mime }) end

describe("rich media bounds (16.1, 16.2)", function()
  it("B122: nine images, bad base64 and a text/plain image are refused; eight good ones pass", function()
    local eight = {}
    for i = 1, 8 do eight[i] = image(PNG, "image/png") end
    assert.is_true(media.check_images(arr(eight)))
    local nine = { table.unpack(eight) }
    nine[9] = image(PNG, "image/png")
    assert.same({ nil, "Too many images" }, { media.check_images(arr(nine)) })
    assert.same({ nil, "Invalid or oversized image" }, { media.check_images(arr { image("abc$", "image/png") }) })
    assert.same({ nil, "Invalid or oversized image" }, { media.check_images(arr { image("abc", "image/png") }) })
    assert.same({ nil, "Invalid or oversized image" }, { media.check_images(arr { image(PNG, "text/plain") }) })
    assert.same({ nil, "Image budget exceeded" }, { media.check_images(arr { image("", "image/png") }) })
  end)

  it("B123: reply files named ../owner, with bad base64, eleven of them, or one over 10 MiB are refused", function()
    assert.is_true(media.check_files(arr { file("art.png", "YWJj") }))
    assert.same({ nil, "Invalid reply file" }, { media.check_files(arr { file("../owner", "YWJj") }) })
    assert.same({ nil, "Invalid reply file" }, { media.check_files(arr { file("a\\b", "YWJj") }) })
    assert.same({ nil, "Invalid reply file" }, { media.check_files(arr { file("a.txt", "YWJ!") }) })
    assert.same({ nil, "Invalid reply file" }, { media.check_files(arr { file("a.txt", "") }) })
    local eleven = {}
    for i = 1, 11 do eleven[i] = file("f" .. i, "YWJj") end
    assert.same({ nil, "Too many reply files" }, { media.check_files(arr(eleven)) })
    local over = string.rep("A", (10 * 1024 * 1024 // 3 + 1) * 4)       -- 10 MiB + 2 bytes decoded
    assert.same({ nil, "Reply file budget exceeded" }, { media.check_files(arr { file("big.bin", over) }) })
    local decoded = assert(media.decode_files(arr { file("art.png", "YWJj") }))
    assert.equal("abc", decoded[1].data)
  end)
end)
