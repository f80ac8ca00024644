#!/bin/bash
#
# ucx-build.sh - build a UCX release from its source (a tarball or an unpacked
# tree) into a cached prefix, for building and testing hca against it.
#
# usage: contrib/ucx-build.sh prefix|build  TARBALL|DIR
#        contrib/ucx-build.sh version TARBALL|DIR
#
#   build    unpack (a tarball), autogen, configure, make, install into
#            $HCA_UCX_CACHE/ucx-<version>-<key>/prefix with only ucs, ucm,
#            uct, ucp, ucx_info and ucx_perftest (no verbs, rdmacm, CUDA,
#            ROCm, ...), and the development headers (uct/base, the ones the
#            module needs); prints the prefix as its last line. Skipped when
#            that prefix was built already.
#   prefix   the prefix "build" uses for this source (built or not)
#   version  the UCX version of a source (from configure.ac)
#
# The key is the sha256 of the tarball (of the path, for a tree) and of the
# configure flags, so one machine keeps one prefix per source and flags, and a
# fresh clone of hca reuses it: a UCX build takes 6-8 minutes on 2 cores.
# The unpacked source tree stays beside the prefix (<cache>/.../src): hca's
# configure needs it (--with-ucx-src) for UCX's internal headers.
#
# Environment:
#   HCA_UCX_CACHE   where prefixes are kept (default:
#                   ${XDG_CACHE_HOME:-$HOME/.cache}/hca/ucx)
#   HCA_MAKE_JOBS   parallel make jobs (default: number of CPUs)
#
set -euo pipefail

cache=${HCA_UCX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hca/ucx}
jobs=${HCA_MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}

log() { echo "ucx-build: $*" >&2; }
die() { echo "ucx-build: error: $*" >&2; exit 1; }

# Only what hca and its tests use; everything that needs hardware or a
# vendor library is off, so the build is the same on every machine.
# --enable-mt as Debian builds it (hca's tests use UCS_THREAD_MODE_MULTI).
configure_flags=(
    --disable-doxygen-doc --disable-examples --disable-static
    --enable-devel-headers --enable-cma --enable-mt
    --without-verbs --without-rdmacm --without-mlx5-dv --without-mad
    --without-cuda --without-rocm --without-hip --without-ze
    --without-gdrcopy --without-knem --without-xpmem --without-ugni
    --without-fuse3 --without-java --without-go --without-mpi
)

# The version in a UCX configure.ac: define([ucx_ver_major], 1) ...
version_of_configure_ac() {  # file
    awk -F'[][(), ]+' '
        /^define\(\[ucx_ver_major\]/ { ma = $3 }
        /^define\(\[ucx_ver_minor\]/ { mi = $3 }
        /^define\(\[ucx_ver_patch\]/ { pa = $3 }
        END { if (ma != "" && mi != "") print ma "." mi "." (pa == "" ? 0 : pa) }
    ' "$1"
}

source_version() {  # tarball|dir
    local src=$1 v member
    if [ -d "$src" ]; then
        [ -f "$src/configure.ac" ] || die "$src: no configure.ac (not a UCX tree)"
        v=$(version_of_configure_ac "$src/configure.ac")
    elif [ -f "$src" ]; then
        member=$(tar -tf "$src" 2>/dev/null | grep -E '^[^/]+/configure\.ac$' |
                 head -n 1 || true)
        [ -n "$member" ] || die "$src: no <top>/configure.ac in the tarball"
        v=$(tar -xOf "$src" "$member" | version_of_configure_ac /dev/stdin)
    else
        die "$src: no such file or directory"
    fi
    [ -n "$v" ] || die "$src: cannot read the UCX version from configure.ac"
    echo "$v"
}

source_key() {  # tarball|dir
    local src=$1 id
    if [ -d "$src" ]; then
        id="tree:$(cd "$src" && pwd -P)"
    else
        id="tarball:$(sha256sum "$src" | cut -d' ' -f1)"
    fi
    printf '%s\n%s\n' "$id" "${configure_flags[*]}" | sha256sum | cut -c1-12
}

base_of() {  # tarball|dir
    echo "$cache/ucx-$(source_version "$1")-$(source_key "$1")"
}

do_build() {  # tarball|dir
    local src=$1 ver base prefix stamp tree t0 top
    ver=$(source_version "$src")
    base=$(base_of "$src")
    prefix=$base/prefix
    stamp=$prefix/.hca-ucx-built
    if [ -f "$stamp" ] && [ -x "$prefix/bin/ucx_info" ]; then
        log "ucx $ver already built: $prefix ($(cat "$stamp"))"
        echo "$prefix"
        return 0
    fi
    mkdir -p "$base"
    # one builder at a time per prefix (two CI jobs on one machine)
    exec 9>"$base/.lock"
    flock 9
    if [ -f "$stamp" ]; then
        echo "$prefix"
        return 0
    fi
    t0=$(date +%s)
    if [ -d "$src" ]; then
        tree=$(cd "$src" && pwd -P)
    else
        log "unpacking $src"
        rm -rf "$base/src" "$base/unpack"
        mkdir -p "$base/unpack"
        tar -xf "$src" -C "$base/unpack"
        top=$(ls "$base/unpack")
        [ "$(echo "$top" | wc -l)" = 1 ] || die "$src: more than one top directory"
        mv "$base/unpack/$top" "$base/src"
        rmdir "$base/unpack"
        tree=$base/src
    fi
    # UCX's configure records the git revision of its tree: keep git from
    # finding a repository the cache may sit in
    export GIT_CEILING_DIRECTORIES=$base
    if [ ! -x "$tree/configure" ]; then
        log "autogen (ucx $ver)"
        (cd "$tree" && ./autogen.sh) >"$base/autogen.log" 2>&1 ||
            { tail -n 30 "$base/autogen.log" >&2; die "ucx autogen failed"; }
    fi
    rm -rf "$base/obj" "$prefix"
    mkdir -p "$base/obj"
    log "configure ucx $ver --prefix=$prefix"
    (cd "$base/obj" && "$tree/configure" --prefix="$prefix" \
        "${configure_flags[@]}") >"$base/configure.log" 2>&1 ||
        { tail -n 30 "$base/configure.log" >&2; die "ucx configure failed"; }
    log "make -j$jobs (ucx $ver; log: $base/make.log)"
    make -C "$base/obj" -j"$jobs" >"$base/make.log" 2>&1 ||
        { tail -n 40 "$base/make.log" >&2; die "ucx make failed"; }
    make -C "$base/obj" install >"$base/install.log" 2>&1 ||
        { tail -n 30 "$base/install.log" >&2; die "ucx make install failed"; }
    # hca's configure finds the source tree from the prefix
    ln -sfn "$tree" "$base/src-tree"
    echo "source $src, built in $(( $(date +%s) - t0 )) s with -j$jobs" >"$stamp"
    log "ucx $ver installed: $prefix ($(( $(date +%s) - t0 )) s)"
    echo "$prefix"
}

[ $# -eq 2 ] || die "usage: $0 build|prefix|version TARBALL|DIR"
case $1 in
build)   do_build "$2" ;;
prefix)  echo "$(base_of "$2")/prefix" ;;
version) source_version "$2" ;;
*)       die "unknown command '$1' (build, prefix or version)" ;;
esac
