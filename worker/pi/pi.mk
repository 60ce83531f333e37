# worker/pi/pi.mk: the rich-mode (Pi) worker images (spec/rich-mode.md 17.1),
# included by the top Makefile. `make image-pi` builds the dependency image
# and the runtime image with worker/pi/image.sh; `make image` does not.
# Knobs: PI_DEPS_IMAGE, PI_IMAGE (tags), PI_RELEASE (the release tree).
.PHONY: image-pi
image-pi:
	@bash worker/pi/image.sh $(B)
