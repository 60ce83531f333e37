# worker/precheck/precheck.mk: the precheck image (shared/spec/precheck.md 6.2),
# included by the top Makefile. `make image` builds it beside the sealed
# worker's image; `make precheck-image` builds it alone.
.PHONY: precheck-image
image: precheck-image
precheck-image:
	@bash worker/precheck/image.sh $(B)
