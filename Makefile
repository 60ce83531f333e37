# Makefile: the one entry point. `make` builds libsbx.so, libsbx.a, the sbx CLI,
# the Lua C module, the embedding shim and the worker; `make deps` bootstraps
# the machine; `make check` runs every suite; `make fuzz`, `make bench`,
# `make demo` as the README says; `make install` / `make uninstall`
# (scripts/install.mk: PREFIX, DESTDIR).
# Variables: B (build dir), CFLAGS (optimisation/sanitizers), CC.
#
# Every object is compiled with -MMD -MP and the generated $(B)/**/*.d files
# are included (Redis's src/Makefile), so a header change rebuilds exactly the
# objects that include it. Every output lives under $(B): `make check-asan`
# is this Makefile again with B=build-asan and sanitizer CFLAGS.

CC       ?= cc
B        ?= build
CFLAGS   ?= -O2 -g
HARDEN   ?= -D_FORTIFY_SOURCE=2 -fstack-protector-strong
WARN     := -Wall -Wextra -Werror -Wmissing-prototypes
DEPFLAGS := -MMD -MP
PKGS     := lua5.4 libuv libcurl libcrypto zlib libbrotlidec libutf8proc
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser
SBX_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -fPIC $(HARDEN) $(PKG_CFLAGS) $(CFLAGS)
ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

LIB_SRC  := $(filter-out core/main.c,$(wildcard core/*.c))
LIB_OBJ  := $(patsubst core/%.c,$(B)/obj/%.o,$(LIB_SRC))

# The release (one VERSION file: sbx_version(), `sbx --version`, sbx.pc, the
# rockspec, the Bun package) and the ABI's SONAME. libsbx.so exports only the
# public headers' functions (core/libsbx.map); the Lua C module core.so,
# built from the same objects, only luaopen_sandbox_core
# (core/sandbox_core.map), and does not link liblua: the interpreter that
# loads it provides the Lua API (as Debian's Lua C modules do).
VERSION  := $(shell cat VERSION)
SONAME   := libsbx.so.0
MOD_LIBS := $(shell pkg-config --libs $(filter-out lua5.4,$(PKGS)) 2>/dev/null) -lhttp_parser

# The C drivers of the public C APIs (spec/c/): the embedding ABI (sbx_ffi.h)
# against libsbx.so and through the shim Bun loads, and safe fetch
# (sbx_fetch.h, with the archive). check.sh runs them as the service account and counts their
# "ok"/"FAIL" lines: `$(B)/ffi_test spec/c/ffi`, `$(B)/fetch_test`.
C_TESTS  := $(B)/ffi_test $(B)/ffi_test_shim $(B)/fetch_test
TEST_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -iquote core -iquote spec/c $(PKG_CFLAGS) -pthread $(CFLAGS)

.PHONY: all worker deps check check-asan c-tests fuzz fuzz-check bench bench-bins demo image \
  image-pi print-pkgs clean

BUN_OPTIONS := $(if $(wildcard bun/src/index.ts),bun/src/options.generated.ts)
all: $(B)/libsbx.so $(B)/$(SONAME) $(B)/libsbx.a $(B)/sbx $(B)/lua/sandbox/core.so $(B)/libsbx_ffi.so worker \
  $(BUN_OPTIONS)

# The Bun bridge's option list and types, generated from the one Lua
# declaration (issue 21 item 6; pure Lua, no engine module needed). Committed
# too, so a package built without make has it; spec/bun_options_spec.lua
# regenerates and compares.
$(BUN_OPTIONS): lua/sandbox/rich/_option_table.lua lua/sandbox/runtime/_option_table.lua scripts/gen_bun_options.lua
	lua5.4 scripts/gen_bun_options.lua $@

$(B)/obj/%.o: core/%.c
	@mkdir -p $(@D)
	$(CC) $(SBX_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(B)/obj/constants.o: SBX_CFLAGS += -DSBX_VERSION='"$(VERSION)"'
$(B)/obj/constants.o: VERSION

$(B)/libsbx.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/libsbx.so: $(LIB_OBJ) core/libsbx.map
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=core/libsbx.map \
	  -Wl,--no-undefined -o $@ $(LIB_OBJ) $(PKG_LIBS)

# The SONAME beside it, so what links -L$(B) -lsbx runs from $(B) ($$ORIGIN).
$(B)/$(SONAME): | $(B)/libsbx.so
	ln -sf libsbx.so $@

# The module Lua's require finds as sandbox.core.
$(B)/lua/sandbox/core.so: $(LIB_OBJ) core/sandbox_core.map
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -Wl,--version-script=core/sandbox_core.map -o $@ $(LIB_OBJ) $(MOD_LIBS)

$(B)/sbx: $(B)/obj/main.o $(B)/libsbx.a
	$(CC) $(CFLAGS) -o $@ $^ $(PKG_LIBS) -lm -ldl

# What a JavaScript runtime (Bun) loads: it forwards the ABI to libsbx.so
# opened with RTLD_DEEPBIND, so Bun's own exported uv_* stubs never replace
# libuv inside the engine (core/ffi_shim/).
$(B)/libsbx_ffi.so: core/ffi_shim/sbx_ffi_shim.c $(B)/libsbx.so
	@mkdir -p $(B)/obj/ffi_shim
	$(CC) $(SBX_CFLAGS) -MMD -MP -MF $(B)/obj/ffi_shim/sbx_ffi_shim.d -shared -o $@ $< -ldl -pthread

# ---- the C drivers (spec/c/) ----------------------------------------------------
c-tests: $(C_TESTS)

$(B)/ffi_test: spec/c/ffi/ffi_test.c $(B)/libsbx.so $(B)/$(SONAME)
	$(CC) $(TEST_CFLAGS) $(DEPFLAGS) -MF $@.d -o $@ $< -L$(B) -lsbx -Wl,-rpath,'$$ORIGIN'
$(B)/ffi_test_shim: spec/c/ffi/ffi_test.c $(B)/libsbx_ffi.so
	$(CC) $(TEST_CFLAGS) $(DEPFLAGS) -MF $@.d -o $@ $< -L$(B) -lsbx_ffi -Wl,-rpath,'$$ORIGIN'
# fetch_test also checks internals of the pin (sbx__pin_*, fetch_internal.h),
# which libsbx.so does not export: it links the archive.
$(B)/fetch_test: spec/c/fetch/fetch_test.c $(B)/libsbx.a
	$(CC) $(TEST_CFLAGS) $(DEPFLAGS) -MF $@.d -o $@ $< $(B)/libsbx.a $(PKG_LIBS) -lm -ldl

# RUNSC=1: `make deps` also installs Debian's runsc (gVisor) and crun and
# registers them with the Docker daemon (shared/spec/warm-turns.md 4). CI
# (CI=true) sets it, so `make check` there runs the Docker specs under runsc
# too; elsewhere that second pass runs only where runsc is registered.
RUNSC    ?= $(if $(filter true,$(CI)),1,)

deps:
	@RUNSC="$(RUNSC)" bash scripts/deps.sh

check: deps
	@bash scripts/check.sh

# The product and the C drivers again as a sanitizer build in build-asan/
# (check.sh runs the specs and the drivers against it; the shim is not run
# there: ASan cannot load under RTLD_DEEPBIND).
check-asan:
	@$(MAKE) --no-print-directory B=build-asan HARDEN= CFLAGS="$(ASAN_CFLAGS)" \
	  all build-asan/ffi_test build-asan/fetch_test

# The fuzzers link the same libraries as the core: PKGS is passed down.
fuzz:
	@SBX_PKGS="$(PKGS)" bash scripts/fuzz.sh $${FUZZ_SECONDS:-60}

fuzz-check:
	@SBX_PKGS="$(PKGS)" bash scripts/fuzz.sh $${FUZZ_SECONDS:-10}

bench: all
	@bash scripts/bench.sh

# Benchmark programs: bench/<name>.c -> $(B)/bench/<name>, linked with libsbx.a.
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC))
bench-bins: $(BENCH_BIN)
$(B)/bench/%: bench/%.c $(B)/libsbx.a
	@mkdir -p $(@D)
	$(CC) $(SBX_CFLAGS) $(DEPFLAGS) -MF $@.d -iquote core -o $@ $< $(B)/libsbx.a $(PKG_LIBS) -lm -ldl

# Two sealed turns against the built-in scripted model (see `sbx demo --help`).
# The product refuses root, so as root the demo runs as the service account
# `sbx` that `make deps` creates (in the docker group); otherwise as yourself.
demo:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory image
	@if [ "$$(id -u)" = 0 ]; then \
	  if ! runuser -u sbx -- test -r "$(CURDIR)/lua/sandbox/cli/init.lua"; then \
	    echo "make demo: the sbx account cannot read $(CURDIR); make the checkout world-readable or clone it where sbx can read it" >&2; exit 1; \
	  fi; \
	  cd / && runuser -u sbx -- env -u TMPDIR HOME="$$(getent passwd sbx | cut -d: -f6)" \
	    SBX_LUA_DIR="$(CURDIR)/lua" "$(CURDIR)/$(B)/sbx" demo; \
	else \
	  SBX_LUA_DIR="$(CURDIR)/lua" "$(CURDIR)/$(B)/sbx" demo; \
	fi

print-pkgs:
	@echo $(PKGS)

clean:
	rm -rf build build-asan build-fuzz

# The in-container worker and its image (worker/worker.mk owns these rules),
# and the rich-mode (Pi) worker images (worker/pi/pi.mk: make image-pi).
include worker/worker.mk
-include worker/pi/pi.mk
-include worker/precheck/precheck.mk
# make install / uninstall, the rockspec's build (scripts/install.mk).
include scripts/install.mk

# Generated header dependencies of everything compiled above.
-include $(LIB_OBJ:.o=.d) $(B)/obj/main.d $(B)/obj/ffi_shim/sbx_ffi_shim.d \
  $(addsuffix .d,$(C_TESTS) $(BENCH_BIN)) $(WORKER_DEPS)
