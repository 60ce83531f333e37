# Makefile: the one entry point. `make` builds libsbx.so, libsbx.a, the sbx CLI
# and the Lua C module; `make deps` bootstraps the machine; `make check` runs
# every suite; `make fuzz`, `make bench`, `make demo` as the README says.
# Variables: B (build dir), CFLAGS (optimisation/sanitizers), CC.

CC       ?= cc
B        ?= build
CFLAGS   ?= -O2 -g
HARDEN   ?= -D_FORTIFY_SOURCE=2 -fstack-protector-strong
PKGS     := lua5.4 libuv libcurl libcrypto zlib libbrotlidec
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser
SBX_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fPIC $(HARDEN) $(PKG_CFLAGS) $(CFLAGS)

LIB_SRC  := $(filter-out core/main.c,$(wildcard core/*.c))
LIB_OBJ  := $(patsubst core/%.c,$(B)/obj/%.o,$(LIB_SRC))
HDRS     := $(wildcard core/*.h)

.PHONY: all deps check check-asan fuzz fuzz-check bench bench-bins demo image print-pkgs clean

all: $(B)/libsbx.so $(B)/libsbx.a $(B)/sbx $(B)/lua/sandbox/core.so

$(B)/obj/%.o: core/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(SBX_CFLAGS) -c $< -o $@

$(B)/libsbx.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/libsbx.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(PKG_LIBS)

# The same library under the name Lua's require expects (sandbox.core).
$(B)/lua/sandbox/core.so: $(B)/libsbx.so
	@mkdir -p $(@D)
	cp $< $@

$(B)/sbx: $(B)/obj/main.o $(B)/libsbx.a
	$(CC) $(CFLAGS) -o $@ $^ $(PKG_LIBS) -lm -ldl

$(B)/obj/main.o: core/main.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(SBX_CFLAGS) -c $< -o $@

deps:
	@bash scripts/deps.sh

check: deps
	@bash scripts/check.sh

# The specs again against a sanitizer build of the core (run by check.sh).
check-asan:
	@$(MAKE) --no-print-directory B=build-asan HARDEN= \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all

# The fuzzers link the same libraries as the core: PKGS is passed down.
fuzz:
	@SBX_PKGS="$(PKGS)" bash scripts/fuzz.sh $${FUZZ_SECONDS:-60}

fuzz-check:
	@SBX_PKGS="$(PKGS)" bash scripts/fuzz.sh $${FUZZ_SECONDS:-10}

bench: all
	@bash scripts/bench.sh

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

# Benchmark programs: bench/<name>.c -> $(B)/bench/<name>, linked with libsbx.a.
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC))
bench-bins: $(BENCH_BIN)
$(B)/bench/%: bench/%.c $(B)/libsbx.a $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(SBX_CFLAGS) -iquote core -o $@ $< $(B)/libsbx.a $(PKG_LIBS) -lm -ldl

# The in-container worker and its image (worker/worker.mk owns these rules).
-include worker/worker.mk
-include worker/pi/pi.mk

# ---- FFI embedding ABI (core/sbx_ffi.h): loader shim, C driver test, ASan variant ----
# $(B)/libsbx_ffi.so: what a JavaScript runtime (Bun) loads. It forwards the
# ABI to $(B)/libsbx.so opened with RTLD_DEEPBIND, so Bun's own exported
# uv_* stubs never replace libuv inside the engine (core/ffi_shim/).
# build/ffi_test links build/libsbx.so, build/ffi_test_shim the shim,
# build-asan/ffi_test the sanitizer build (make check-asan). All run as a
# non-root user (check.sh runs them as the service account):
# `build/ffi_test tests/ffi`.
FFI_TEST_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Icore -g -pthread
.PHONY: ffi-test ffi-test-asan
all: $(B)/libsbx_ffi.so
$(B)/libsbx_ffi.so: core/ffi_shim/sbx_ffi_shim.c core/sbx_ffi.h $(B)/libsbx.so
	$(CC) $(SBX_CFLAGS) -shared -o $@ $< -ldl -pthread
ffi-test: build/ffi_test build/ffi_test_shim
ffi-test-asan: build-asan/ffi_test
build/ffi_test: tests/ffi/ffi_test.c core/sbx_ffi.h build/libsbx.so
	$(CC) $(FFI_TEST_CFLAGS) -O2 -o $@ $< -Lbuild -lsbx -Wl,-rpath,'$$ORIGIN'
build/ffi_test_shim: tests/ffi/ffi_test.c core/sbx_ffi.h build/libsbx_ffi.so
	$(CC) $(FFI_TEST_CFLAGS) -O2 -o $@ $< -Lbuild -lsbx_ffi -Wl,-rpath,'$$ORIGIN'
build-asan/ffi_test: tests/ffi/ffi_test.c core/sbx_ffi.h build-asan/libsbx.so
	$(CC) $(FFI_TEST_CFLAGS) -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
	  -o $@ $< -Lbuild-asan -lsbx -Wl,-rpath,'$$ORIGIN'
# ---- end FFI block ----

# ---- safe fetch C API test (core/sbx_fetch.h) ----
# build/fetch_test drives sbx_fetch_start on a libuv loop against a loopback
# server it runs itself; build-asan/fetch_test is the sanitizer variant (make
# check-asan first). check.sh runs both and counts their "ok"/"FAIL" lines.
.PHONY: fetch-test
FETCH_TEST_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Icore -g $(PKG_CFLAGS)
fetch-test: build/fetch_test
build/fetch_test: tests/fetch/fetch_test.c core/sbx_fetch.h core/fetch_internal.h build/libsbx.so
	$(CC) $(FETCH_TEST_CFLAGS) -O2 -o $@ $< -Lbuild -lsbx -luv -lm -Wl,-rpath,'$$ORIGIN'
build-asan/fetch_test: tests/fetch/fetch_test.c core/sbx_fetch.h core/fetch_internal.h build-asan/libsbx.so
	$(CC) $(FETCH_TEST_CFLAGS) -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
	  -o $@ $< -Lbuild-asan -lsbx -luv -lm -Wl,-rpath,'$$ORIGIN'
# ---- end safe fetch block ----
