-- The luarocks description of the engine's Lua side (spec/operations.md 6):
-- `luarocks --lua-version=5.4 make` in the checkout builds sandbox.core
-- against the system's libraries (Debian: liblua5.4-dev libuv1-dev
-- libcurl4-openssl-dev libssl-dev zlib1g-dev libbrotli-dev libutf8proc-dev
-- libhttp-parser-dev) through the Makefile (make rock, into build/rock/) and
-- installs every sandbox.* module and sandbox/core.so into the rock tree
-- (make install-rock). The sbx CLI, libsbx and the worker image are `make
-- install`'s. The version is the VERSION file's (spec/install checks it).
rockspec_format = "3.0"
package = "pi-roundtable-sandbox"
version = "0.1.0-1"
source = {
  url = "git+file://.",
}
description = {
  summary = "Sealed guest channels for a chat bot: the sandbox engine's host Lua and sandbox.core",
  detailed = [[
Each guest message runs a small tool-using agent in a fresh Docker container
with no network and no real credential; a host-side broker on a Unix socket
is its only way out. This rock is the trusted host side: require "sandbox".]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
external_dependencies = {
  LIBUV = { header = "uv.h", library = "uv" },
  LIBCURL = { library = "curl" },   -- Debian keeps curl/curl.h under the multiarch include dir
  OPENSSL = { header = "openssl/evp.h", library = "crypto" },
  ZLIB = { header = "zlib.h", library = "z" },
  BROTLI = { header = "brotli/decode.h", library = "brotlidec" },
  HTTP_PARSER = { header = "http_parser.h", library = "http_parser" },
  UTF8PROC = { header = "utf8proc.h", library = "utf8proc" },
}
build = {
  type = "make",
  build_target = "rock",
  build_variables = {
    B = "build/rock",
    CFLAGS = "$(CFLAGS)",
    LUA_INCDIR = "$(LUA_INCDIR)",
  },
  install_target = "install-rock",
  install_variables = {
    B = "build/rock",
    ROCK_LUADIR = "$(LUADIR)",
    ROCK_LIBDIR = "$(LIBDIR)",
  },
}
