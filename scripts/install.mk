# scripts/install.mk: `make install` / `make uninstall` (spec operations.md 6)
# and the two targets the rockspec drives (`luarocks make`). Included by the
# top Makefile, which gives B, VERSION, SONAME, PKGS and the build rules.
#
#   make install [PREFIX=/usr/local] [DESTDIR=]        (uninstall: the same)
#     BINDIR/sbx                          the CLI (libsbx.a linked in)
#     LIBDIR/libsbx.so.0 (SONAME), libsbx.so -> libsbx.so.0, libsbx.a
#     INCLUDEDIR/sbx/                     the public headers only: sbx.h,
#                                         sbx_ffi.h, sbx_fetch.h, sbx_scrub.h
#     LIBDIR/pkgconfig/sbx.pc             `pkg-config --cflags --libs sbx`
#     LUADIR/sandbox/**.lua               PREFIX/share/lua/5.4 and
#     LUACDIR/sandbox/core.so             PREFIX/lib/lua/5.4: where Debian's
#                                         lua5.4 looks under /usr/local and /usr
#     IMAGEDIR/                           the worker image's build context:
#                                         Dockerfile, seccomp.json, sbx-worker,
#                                         lua/**, image_lib.sh, and build-image
#                                         (worker/image.sh), which
#                                         builds pi-roundtable-sandbox:local;
#                                         pi/seccomp.json, precheck/seccomp.json:
#                                         the rich and precheck images' profiles
#     DOCDIR/                             README.md, LICENSE, docs/*.md, the systemd example
# Nothing records the prefix inside a binary: the installed sbx finds
# PREFIX/share/lua/5.4 from its own path, libsbx.so.0 the same tree from its
# own (core/main.c, core/ffi.c), so a DESTDIR tree runs where it lies.
# As root with an empty DESTDIR, ldconfig refreshes the loader's cache so
# dlopen("libsbx.so.0") (the Bun package's last resort) finds the library.
#
#   luarocks make (pi-roundtable-sandbox-VERSION-1.rockspec, build type make):
#     make rock B=build/rock              sandbox.core against the system's
#                                         libraries (LUA_INCDIR from luarocks)
#     make install-rock ROCK_LUADIR=… ROCK_LIBDIR=…   the modules into the rock
#                                         (and the seccomp profiles beside them:
#                                         sandbox/seccomp.json, seccomp-pi.json,
#                                         seccomp-precheck.json; no image context)

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    ?= $(PREFIX)/share
LUADIR     ?= $(DATADIR)/lua/5.4
LUACDIR    ?= $(LIBDIR)/lua/5.4
IMAGEDIR   ?= $(DATADIR)/pi-roundtable-sandbox
DOCDIR     ?= $(DATADIR)/doc/pi-roundtable-sandbox

PUBLIC_HEADERS := core/sbx.h core/sbx_ffi.h core/sbx_fetch.h core/sbx_scrub.h
DOCS       := README.md LICENSE $(wildcard docs/*.md) $(wildcard examples/systemd/*.service)
HOST_LUA   := $(shell find lua/sandbox -name '*.lua' 2>/dev/null | LC_ALL=C sort)
WORKER_LUA := $(shell cd worker/lua 2>/dev/null && find . -name '*.lua' | LC_ALL=C sort)

.PHONY: install uninstall rock install-rock

# copy_tree SRC_ROOT DEST FILES...: each file below SRC_ROOT to DEST, layout kept.
define copy_tree
	@for f in $(3); do \
	  install -D -m 0644 "$(1)/$$f" "$(2)/$$f" || exit 1; \
	done
endef

# A directory under PREFIX as ${prefix}/..., so `pkg-config --define-prefix`
# relocates a moved tree (PKG_CONFIG_SYSROOT_DIR serves a DESTDIR one).
under_prefix = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))

$(B)/sbx.pc: core/sbx.pc.in VERSION
	@mkdir -p $(@D)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(call under_prefix,$(LIBDIR))|g' \
	  -e 's|@INCLUDEDIR@|$(call under_prefix,$(INCLUDEDIR))|g' -e 's|@LUADIR@|$(call under_prefix,$(LUADIR))|g' \
	  -e 's|@LUACDIR@|$(call under_prefix,$(LUACDIR))|g' -e 's|@IMAGEDIR@|$(call under_prefix,$(IMAGEDIR))|g' \
	  -e 's|@VERSION@|$(VERSION)|g' $< >$@

# sbx.pc records the prefix: regenerate it for every install.
.PHONY: $(B)/sbx.pc

install: all $(B)/sbx.pc
	@if [ -z "$(PREFIX)" ] || [ "$${PREFIX#/}" = "$(PREFIX)" ]; then \
	  echo "make install: PREFIX must be an absolute path (got '$(PREFIX)')" >&2; exit 1; fi
	install -D -m 0755 $(B)/sbx "$(DESTDIR)$(BINDIR)/sbx"
	install -D -m 0755 $(B)/libsbx.so "$(DESTDIR)$(LIBDIR)/$(SONAME)"
	ln -sfn $(SONAME) "$(DESTDIR)$(LIBDIR)/libsbx.so"
	install -D -m 0644 $(B)/libsbx.a "$(DESTDIR)$(LIBDIR)/libsbx.a"
	install -d -m 0755 "$(DESTDIR)$(INCLUDEDIR)/sbx"
	install -m 0644 $(PUBLIC_HEADERS) "$(DESTDIR)$(INCLUDEDIR)/sbx/"
	install -D -m 0644 $(B)/sbx.pc "$(DESTDIR)$(LIBDIR)/pkgconfig/sbx.pc"
	$(call copy_tree,lua,$(DESTDIR)$(LUADIR),$(HOST_LUA:lua/%=%))
	install -D -m 0755 $(B)/lua/sandbox/core.so "$(DESTDIR)$(LUACDIR)/sandbox/core.so"
	install -D -m 0644 worker/Dockerfile "$(DESTDIR)$(IMAGEDIR)/Dockerfile"
	install -D -m 0644 worker/seccomp.json "$(DESTDIR)$(IMAGEDIR)/seccomp.json"
	install -D -m 0644 worker/pi/seccomp.json "$(DESTDIR)$(IMAGEDIR)/pi/seccomp.json"
	install -D -m 0644 worker/precheck/seccomp.json "$(DESTDIR)$(IMAGEDIR)/precheck/seccomp.json"
	install -D -m 0755 $(B)/worker/sbx-worker "$(DESTDIR)$(IMAGEDIR)/sbx-worker"
	install -D -m 0755 worker/image.sh "$(DESTDIR)$(IMAGEDIR)/build-image"
	install -D -m 0644 scripts/image_lib.sh "$(DESTDIR)$(IMAGEDIR)/image_lib.sh"
	$(call copy_tree,worker/lua,$(DESTDIR)$(IMAGEDIR)/lua,$(WORKER_LUA))
	install -d -m 0755 "$(DESTDIR)$(DOCDIR)"
	install -m 0644 $(DOCS) "$(DESTDIR)$(DOCDIR)/"
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi
	@echo "make install: $(VERSION) in $(DESTDIR)$(PREFIX); build the worker image with $(IMAGEDIR)/build-image"

# Removes what install wrote. The sandbox/ module directories, include/sbx,
# IMAGEDIR and DOCDIR are this project's own namespaces and go whole.
uninstall:
	@if [ -z "$(PREFIX)" ] || [ "$${PREFIX#/}" = "$(PREFIX)" ]; then \
	  echo "make uninstall: PREFIX must be an absolute path (got '$(PREFIX)')" >&2; exit 1; fi
	rm -f "$(DESTDIR)$(BINDIR)/sbx" "$(DESTDIR)$(LIBDIR)/$(SONAME)" "$(DESTDIR)$(LIBDIR)/libsbx.so" \
	  "$(DESTDIR)$(LIBDIR)/libsbx.a" "$(DESTDIR)$(LIBDIR)/pkgconfig/sbx.pc"
	rm -rf "$(DESTDIR)$(INCLUDEDIR)/sbx" "$(DESTDIR)$(LUADIR)/sandbox" "$(DESTDIR)$(LUACDIR)/sandbox" \
	  "$(DESTDIR)$(IMAGEDIR)" "$(DESTDIR)$(DOCDIR)"
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

# ---- the rockspec's build (luarocks make) ----------------------------------
rock: SBX_CFLAGS += $(if $(LUA_INCDIR),-I$(LUA_INCDIR))
rock: $(B)/lua/sandbox/core.so

install-rock: rock
	@if [ -z "$(ROCK_LUADIR)" ] || [ -z "$(ROCK_LIBDIR)" ]; then \
	  echo "make install-rock: ROCK_LUADIR and ROCK_LIBDIR are luarocks' (luarocks make)" >&2; exit 1; fi
	$(call copy_tree,lua,$(ROCK_LUADIR),$(HOST_LUA:lua/%=%))
	install -D -m 0644 worker/seccomp.json "$(ROCK_LUADIR)/sandbox/seccomp.json"
	install -D -m 0644 worker/pi/seccomp.json "$(ROCK_LUADIR)/sandbox/seccomp-pi.json"
	install -D -m 0644 worker/precheck/seccomp.json "$(ROCK_LUADIR)/sandbox/seccomp-precheck.json"
	install -D -m 0755 $(B)/lua/sandbox/core.so "$(ROCK_LIBDIR)/sandbox/core.so"
