#
# Builds the reliability campaign helpers (the scripts run this make).
#
#   make -C test/reliability -f helpers.mk HCA_BUILD=<build tree> [O=<output dir>]
#
# The UCP programs use the installed UCX (pkg-config ucx); the device-level
# ones link the build tree's libhcadev (rpath to it, so no install is
# needed).
#
SRCDIR    := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
TOPSRC    := $(abspath $(SRCDIR)/../..)
HCA_BUILD ?= $(TOPSRC)/build-rel
O         ?= $(HCA_BUILD)/test/reliability

CC        ?= cc
CFLAGS    ?= -O2 -g
REL_CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror $(CFLAGS)
UCX_CFLAGS := $(shell pkg-config --cflags ucx)
UCX_LIBS   := $(shell pkg-config --libs ucx)
HCADEV_LIBDIR = $(abspath $(HCA_BUILD)/src/hca_dev/.libs)
HCADEV_CFLAGS = -I$(TOPSRC)/src
HCADEV_LIBS   = -L$(HCADEV_LIBDIR) -Wl,-rpath,$(HCADEV_LIBDIR) -lhcadev

UCP_PROGS = ucp_peer ucp_soak ucp_frag_kill ucp_amo_purge
DEV_PROGS = dev_dereg dev_churn dev_open
ALL_PROGS = $(UCP_PROGS) $(DEV_PROGS) squat

all: $(addprefix $(O)/,$(ALL_PROGS))

$(O):
	mkdir -p $@

$(addprefix $(O)/,$(UCP_PROGS)): $(O)/%: $(SRCDIR)/%.c $(SRCDIR)/rel_common.h | $(O)
	$(CC) $(REL_CFLAGS) $(UCX_CFLAGS) -o $@ $< $(UCX_LIBS)

$(addprefix $(O)/,$(DEV_PROGS)): $(O)/%: $(SRCDIR)/%.c $(SRCDIR)/rel_common.h \
		$(HCADEV_LIBDIR)/libhcadev.so | $(O)
	$(CC) $(REL_CFLAGS) $(HCADEV_CFLAGS) -o $@ $< $(HCADEV_LIBS) -lpthread

$(O)/squat: $(SRCDIR)/squat.c $(SRCDIR)/rel_common.h | $(O)
	$(CC) $(REL_CFLAGS) -o $@ $<

clean:
	rm -f $(addprefix $(O)/,$(ALL_PROGS))

.PHONY: all clean
