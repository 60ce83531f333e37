# worker/worker.mk: the sealed worker (spec/worker.md sections 1, 1.1) and its
# image, included by the top Makefile (which gives B, CC, CFLAGS, HARDEN).
#
#   $(B)/worker/sbx-worker       static binary for the image (Lua dir
#                                /app/worker/lua), stripped
#   $(B)/worker/sbxw.so          the same primitives as a loadable Lua module
#                                for host specs (SBXW_MODULE: adds set_socket)
#   $(B)/worker/sbx-worker-host  test build: Lua dir ./worker/lua (relative,
#                                so specs run it from the repo root)
#   $(B)/worker/sbx-worker-probe test build: Lua dir ./spec/fixtures/sbxw_probe
#   $(B)/worker/sbxw-test-peer   spec-only fake broker (worker/test_peer.c)
#   make image                   pi-roundtable-sandbox:local (worker/image.sh)
#
# core/json.c and core/reflect.c are compiled in (strict JSON is the core's);
# they need Lua, libc, SSE2 and sbx_strerror (core/strerror.c); sbx_internal.h
# includes <uv.h> for types only. The module exports luaopen_sbxw alone, so its
# copy of the core's symbols never meets sandbox.core's in one host process.
# The static objects drop sanitizer flags (a static binary cannot carry
# ASan); the module keeps them, so the ASan spec run loads an instrumented one.

WORKER_LUA_INC := $(shell pkg-config --cflags lua5.4 2>/dev/null)
WORKER_UV_INC  := $(shell pkg-config --cflags libuv 2>/dev/null)
WORKER_BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror $(HARDEN) \
  $(WORKER_LUA_INC) $(WORKER_UV_INC) -Iworker -Icore
WORKER_STATIC_CFLAGS := $(WORKER_BASE_CFLAGS) -ffunction-sections -fdata-sections \
  $(filter-out -fsanitize% -fno-sanitize%,$(CFLAGS))
WORKER_MODULE_CFLAGS := $(WORKER_BASE_CFLAGS) -fPIC -fvisibility=hidden -DSBXW_MODULE $(CFLAGS)

WORKER_PRIM_SRC := worker/sbxw.c worker/fs.c worker/utf8.c worker/localtime.c \
  worker/broker_client.c core/strerror.c core/json.c core/reflect.c
WORKER_HDRS := $(wildcard worker/*.h) core/sbx.h core/sbx_internal.h core/sbx_limits.h
WORKER_STATIC_OBJ := $(patsubst %.c,$(B)/worker/obj/static/%.o,$(WORKER_PRIM_SRC))
WORKER_MODULE_OBJ := $(patsubst %.c,$(B)/worker/obj/module/%.o,$(WORKER_PRIM_SRC))
WORKER_STATIC_LIBS := -l:liblua5.4-cjson.a -l:liblua5.4.a -lm

.PHONY: worker worker-gen
worker: $(B)/worker/sbx-worker $(B)/worker/sbxw.so $(B)/worker/sbx-worker-host \
  $(B)/worker/sbx-worker-probe $(B)/worker/sbxw-test-peer
all: worker

$(B)/worker/obj/static/%.o: %.c $(WORKER_HDRS)
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) -c $< -o $@

$(B)/worker/obj/module/%.o: %.c $(WORKER_HDRS)
	@mkdir -p $(@D)
	$(CC) $(WORKER_MODULE_CFLAGS) -c $< -o $@

# main.c once per Lua directory.
$(B)/worker/obj/main-image.o: worker/main.c $(WORKER_HDRS)
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) -c $< -o $@
$(B)/worker/obj/main-host.o: worker/main.c $(WORKER_HDRS)
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) '-DSBXW_LUA_DIR="worker/lua"' -c $< -o $@
$(B)/worker/obj/main-probe.o: worker/main.c $(WORKER_HDRS)
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) '-DSBXW_LUA_DIR="spec/fixtures/sbxw_probe"' -c $< -o $@

$(B)/worker/sbx-worker: $(B)/worker/obj/main-image.o $(WORKER_STATIC_OBJ)
	$(CC) -static -s -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)
$(B)/worker/sbx-worker-host: $(B)/worker/obj/main-host.o $(WORKER_STATIC_OBJ)
	$(CC) -static -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)
$(B)/worker/sbx-worker-probe: $(B)/worker/obj/main-probe.o $(WORKER_STATIC_OBJ)
	$(CC) -static -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)

# Spec-only fake broker for the client's framing tests (worker/test_peer.c).
$(B)/worker/sbxw-test-peer: worker/test_peer.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_BASE_CFLAGS) $(CFLAGS) -o $@ $<

# Not linked with liblua: the host interpreter provides the Lua API.
$(B)/worker/sbxw.so: $(WORKER_MODULE_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $^ -lm

# The lowercase table is committed; `make worker-gen` regenerates it.
worker-gen:
	python3 worker/gen/gen_lowercase.py > worker/lowercase_table.h

image: $(B)/worker/sbx-worker
	@bash worker/image.sh $(B)
