# worker/worker.mk: the sealed worker (spec/worker.md sections 1, 1.1) and its
# image, included by the top Makefile (which gives B, CC, CFLAGS, HARDEN,
# WARN, DEPFLAGS, lists `worker` in `all` and includes WORKER_DEPS).
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
# core/json.c and core/reflect.c are compiled in (strict JSON is the core's),
# with the core helpers they use (core/aux.c: no libuv) and sbx_strerror
# (core/strerror.c); they need Lua, libc and SSE2, nothing of the loop. The
# module exports luaopen_sbxw alone, so its copy of the core's symbols never
# meets sandbox.core's in one host process.
# The static objects drop sanitizer flags (a static binary cannot carry
# ASan); the module keeps them, so the ASan spec run loads an instrumented one.

WORKER_LUA_INC := $(shell pkg-config --cflags lua5.4 2>/dev/null)
WORKER_BASE_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(HARDEN) $(WORKER_LUA_INC) -iquote worker -iquote core
WORKER_STATIC_CFLAGS := $(WORKER_BASE_CFLAGS) -ffunction-sections -fdata-sections \
  $(filter-out -fsanitize% -fno-sanitize%,$(CFLAGS))
WORKER_MODULE_CFLAGS := $(WORKER_BASE_CFLAGS) -fPIC -fvisibility=hidden -DSBXW_MODULE $(CFLAGS)

WORKER_PRIM_SRC := worker/sbxw.c worker/waux.c worker/stdio.c worker/fs.c worker/utf8.c \
  worker/localtime.c worker/broker_client.c core/aux.c core/strerror.c core/json.c core/reflect.c
WORKER_STATIC_OBJ := $(patsubst %.c,$(B)/worker/obj/static/%.o,$(WORKER_PRIM_SRC))
WORKER_MODULE_OBJ := $(patsubst %.c,$(B)/worker/obj/module/%.o,$(WORKER_PRIM_SRC))
WORKER_STATIC_LIBS := -l:liblua5.4-cjson.a -l:liblua5.4.a -lm

WORKER_MAIN_OBJ := $(B)/worker/obj/main-image.o $(B)/worker/obj/main-host.o $(B)/worker/obj/main-probe.o
WORKER_DEPS := $(WORKER_STATIC_OBJ:.o=.d) $(WORKER_MODULE_OBJ:.o=.d) $(WORKER_MAIN_OBJ:.o=.d) \
  $(B)/worker/sbxw-test-peer.d

.PHONY: worker-gen
worker: $(B)/worker/sbx-worker $(B)/worker/sbxw.so $(B)/worker/sbx-worker-host \
  $(B)/worker/sbx-worker-probe $(B)/worker/sbxw-test-peer

$(B)/worker/obj/static/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(B)/worker/obj/module/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_MODULE_CFLAGS) $(DEPFLAGS) -c $< -o $@

# main.c once per Lua directory.
$(B)/worker/obj/main-image.o: worker/main.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) $(DEPFLAGS) -c $< -o $@
$(B)/worker/obj/main-host.o: worker/main.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) $(DEPFLAGS) '-DSBXW_LUA_DIR="worker/lua"' -c $< -o $@
$(B)/worker/obj/main-probe.o: worker/main.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_STATIC_CFLAGS) $(DEPFLAGS) '-DSBXW_LUA_DIR="spec/fixtures/sbxw_probe"' -c $< -o $@

$(B)/worker/sbx-worker: $(B)/worker/obj/main-image.o $(WORKER_STATIC_OBJ)
	$(CC) -static -s -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)
$(B)/worker/sbx-worker-host: $(B)/worker/obj/main-host.o $(WORKER_STATIC_OBJ)
	$(CC) -static -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)
$(B)/worker/sbx-worker-probe: $(B)/worker/obj/main-probe.o $(WORKER_STATIC_OBJ)
	$(CC) -static -Wl,--gc-sections -o $@ $^ $(WORKER_STATIC_LIBS)

# Spec-only fake broker for the client's framing tests (worker/test_peer.c).
$(B)/worker/sbxw-test-peer: worker/test_peer.c
	@mkdir -p $(@D)
	$(CC) $(WORKER_BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) -MF $@.d -o $@ $<

# Not linked with liblua: the host interpreter provides the Lua API.
$(B)/worker/sbxw.so: $(WORKER_MODULE_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $^ -lm

# The lowercase table is committed; `make worker-gen` regenerates it.
worker-gen:
	python3 worker/gen/gen_lowercase.py > worker/lowercase_table.h

image: $(B)/worker/sbx-worker
	@bash worker/image.sh $(B)
