#!/bin/sh
# Generate configure and the Makefile.in files (needs autoconf, automake,
# libtool and pkg-config).
set -e
cd "$(dirname "$0")"
mkdir -p m4
autoreconf -fi "$@"
