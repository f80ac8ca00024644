#!/bin/bash
#
# ucx-debian.sh - get a UCX version from Debian's archive and build it into a
# prefix, without touching the system's apt configuration.
#
# usage: contrib/ucx-debian.sh versions
#        contrib/ucx-debian.sh source SUITE|VERSION [DEST]
#        contrib/ucx-debian.sh build  SUITE|VERSION
#        contrib/ucx-debian.sh binary SUITE|VERSION
#
#   versions  the ucx source versions of the suites below
#   source    download (signature-checked) and unpack Debian's ucx source
#             package, Debian's patches applied, into DEST (default:
#             <build>/ucx-<upstream>/src-tree)
#   build     source + configure + make + install into
#             <build>/ucx-<upstream>/prefix, with only ucs, ucm, uct, ucp,
#             ucx_info and ucx_perftest (no verbs, rdmacm, CUDA, ROCm, ...);
#             skipped when that prefix was built already (delete its
#             .hca-ucx-built stamp to rebuild)
#   binary    unpack Debian's binary packages (libucx0, libucx-dev,
#             ucx-utils) of that version into <build>/ucx-<upstream>/debian-root
#             with the libc6 of the same suite and a runner script
#             (debian-root/run PROGRAM ARGS...), so that ucx_info of a newer
#             Debian release can be run here: for inspection (ucx_info -b,
#             -y, -d); a module cannot be built against it (no internal headers)
#
# SUITE is one of $UCX_DEBIAN_SUITES (default: "bookworm trixie sid"); a
# VERSION is an upstream version (1.18.1) or a Debian one (1.18.1+ds-2).
#
# apt runs with its own state under <build>/ucx-apt: a sources list with only
# deb.debian.org entries for those suites, its own lists and cache; nothing
# under /etc or /var/lib/apt changes. Release files are checked against
# /usr/share/keyrings/debian-archive-keyring.gpg.
#
# Environment:
#   HCA_BUILD_DIR       build area (default: <repo>/build)
#   UCX_DEBIAN_REFRESH  1: run apt-get update even if the lists are less
#                       than a day old
#   HCA_MAKE_JOBS       parallel make jobs (default: number of CPUs)
#   UCX_DEBIAN_SUITES   suites to look in
#   UCX_DEBIAN_MIRROR   default: http://deb.debian.org/debian
#
set -euo pipefail

topdir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
builddir=${HCA_BUILD_DIR:-$topdir/build}
case $builddir in /*) ;; *) builddir=$PWD/$builddir ;; esac
jobs=${HCA_MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}
suites=${UCX_DEBIAN_SUITES:-bookworm trixie sid}
mirror=${UCX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
aptdir=$builddir/ucx-apt

log() { echo "ucx-debian: $*"; }
die() { echo "ucx-debian: error: $*" >&2; exit 1; }

# ------------------------------------------------------------ private apt

# apt-get/apt-cache with the private state of kind $1 (src: deb-src
# entries, bin: deb entries for amd64).
apt_private() {  # kind command args...
    local kind=$1 dir; shift
    dir=$aptdir/$kind
    "$@" -q \
        -o Dir::Etc::SourceList="$dir/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::Etc::Preferences=/dev/null \
        -o Dir::Etc::PreferencesParts=/dev/null \
        -o Dir::State::Lists="$dir/lists" \
        -o Dir::Cache="$dir/cache" \
        -o Dir::State::extended_states="$dir/extended_states" \
        -o Acquire::Languages=none \
        -o APT::Sandbox::User=root
}

# Write the sources list of kind $1 and update its lists once per run.
declare -A apt_updated=()
apt_private_update() {  # kind
    local kind=$1 dir type s
    [ -n "${apt_updated[$kind]:-}" ] && return 0
    [ -r "$keyring" ] || die "$keyring missing (package debian-archive-keyring)"
    dir=$aptdir/$kind
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    case $kind in src) type=deb-src ;; *) type=deb ;; esac
    for s in $suites; do
        echo "$type [signed-by=$keyring] $mirror $s main"
    done >"$dir/sources.list.new"
    # lists of the same suites fetched within a day are used as they are
    # (UCX_DEBIAN_REFRESH=1 fetches anyway)
    if cmp -s "$dir/sources.list.new" "$dir/sources.list" &&
       [ "${UCX_DEBIAN_REFRESH:-0}" != 1 ] &&
       [ -n "$(find "$dir/lists" -maxdepth 1 -name '*_Sources*' -mtime -1 \
                   -o -maxdepth 1 -name '*_Packages*' -mtime -1)" ]; then
        rm -f "$dir/sources.list.new"
        apt_updated[$kind]=1
        return 0
    fi
    mv "$dir/sources.list.new" "$dir/sources.list"
    log "apt-get update ($type: $suites)"
    apt_private "$kind" apt-get update >"$dir/update.log" 2>&1 ||
        { cat "$dir/update.log" >&2; die "apt-get update failed"; }
    if grep -E '^(E|W):' "$dir/update.log" >&2; then
        log "warning: apt-get update reported the problems above"
    fi
    apt_updated[$kind]=1
}

# Every "suite debian-version" pair of a package in the private lists.
apt_versions() {  # kind package
    apt_private "$1" apt-cache madison "$2" |
        awk -F'|' -v want="$([ "$1" = src ] && echo Sources || echo Packages)" '
            index($3, want) {
                gsub(/ /, "", $2); split($3, u, " ")
                suite = u[2]; sub(/\/.*/, "", suite)
                print suite, $2
            }'
}

upstream_version() {  # debian version -> 1.18.1
    local v=${1#*:}
    v=${v%-*}
    echo "${v%%[+~]*}"
}

# Debian version of package $2 for SUITE|VERSION $3, from the lists of $1.
resolve_version() {  # kind package what
    local kind=$1 pkg=$2 what=$3 suite ver
    while read -r suite ver; do
        if [ "$what" = "$suite" ] || [ "$what" = "$ver" ] ||
           [ "$what" = "$(upstream_version "$ver")" ]; then
            echo "$ver"
            return 0
        fi
    done < <(apt_versions "$kind" "$pkg")
    return 1
}

do_versions() {
    apt_private_update src
    echo "suite ucx-source-version"
    apt_versions src ucx
}

# ------------------------------------------------------------ source

first_match() {
    local f
    for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done
    true
}

fetch_source() {  # what dest
    local what=$1 dest=${2:-} debver upver dl orig top deb p
    apt_private_update src
    debver=$(resolve_version src ucx "$what") ||
        die "no ucx source for '$what' in: $suites (see: $0 versions)"
    upver=$(upstream_version "$debver")
    dest=${dest:-$builddir/ucx-$upver/src-tree}
    if [ -f "$dest/.hca-ucx-source" ] &&
       [ "$(cat "$dest/.hca-ucx-source")" = "$debver" ]; then
        log "ucx $debver source present: $dest"
        return 0
    fi
    dl=$builddir/ucx-$upver/download
    rm -rf "$dl"
    mkdir -p "$dl"
    log "apt-get source --download-only ucx=$debver"
    (cd "$dl" && apt_private src apt-get source --download-only \
        "ucx=$debver") || die "apt-get source ucx=$debver failed"
    orig=$(first_match "$dl"/ucx_*.orig.tar.*)
    [ -n "$orig" ] || die "no ucx_*.orig.tar.* in $dl"
    top=$(tar -tf "$orig" | head -n 1 || true)
    top=${top%%/*}
    [ -n "$top" ] || die "cannot read $orig"
    rm -rf "${dl:?}/${top:?}" "$dest"
    tar -xf "$orig" -C "$dl"
    deb=$(first_match "$dl"/ucx_*.debian.tar.*)
    if [ -n "$deb" ]; then
        tar -xf "$deb" -C "$dl/$top"
        if [ -f "$dl/$top/debian/patches/series" ]; then
            while read -r p _; do
                case $p in ''|'#'*) continue ;; esac
                log "applying Debian patch $p"
                patch -d "$dl/$top" -p1 -s -f --no-backup-if-mismatch \
                    <"$dl/$top/debian/patches/$p" ||
                    die "Debian patch $p does not apply"
            done <"$dl/$top/debian/patches/series"
        fi
    fi
    mkdir -p "$(dirname "$dest")"
    mv "$dl/$top" "$dest"
    echo "$debver" >"$dest/.hca-ucx-source"
    rm -rf "$dl"
    log "ucx $debver source: $dest"
}

# ------------------------------------------------------------ build

# Only the parts hca needs. Options that an older configure does not know
# are only warned about. Debian's own choices that change UCS's behaviour
# (debian_configure_flags) come after these.
ucx_configure_flags=(
    --disable-doxygen-doc --disable-examples --disable-static
    --enable-devel-headers --enable-cma
    --without-verbs --without-rdmacm --without-mlx5-dv --without-mad
    --without-cuda --without-rocm --without-hip --without-ze
    --without-gdrcopy --without-knem --without-xpmem --without-ugni
    --without-fuse3 --without-java --without-go --without-mpi
)

# The options of Debian's build (debian/rules) that decide UCS's config.h
# the way Debian's binary packages have it: threading, logging level,
# profiling, assertions, parameter checks, statistics, backtraces.
debian_configure_flags() {  # source tree
    local rules=$1/debian/rules
    if [ ! -f "$rules" ]; then
        echo --enable-mt
        return
    fi
    grep -oE -- '--(enable|disable)-(mt|logging|profiling|assertions|params-check|debug-data|stats|backtrace-detail|tuning)(=[a-z_]+)?' \
        "$rules" | sort -u
}

do_build() {  # what
    local what=$1 debver upver base src prefix stamp t0 t1
    apt_private_update src
    debver=$(resolve_version src ucx "$what") ||
        die "no ucx source for '$what' in: $suites (see: $0 versions)"
    upver=$(upstream_version "$debver")
    base=$builddir/ucx-$upver
    src=$base/src-tree
    prefix=$base/prefix
    stamp=$prefix/.hca-ucx-built
    if [ -f "$stamp" ] && [ -x "$prefix/bin/ucx_info" ]; then
        log "ucx $upver already built: $prefix ($(cat "$stamp"))"
        return 0
    fi
    fetch_source "$debver" "$src"
    # UCX's configure records the git revision of its tree: keep git from
    # finding the repository this build area may sit in
    export GIT_CEILING_DIRECTORIES=$base
    t0=$(date +%s)
    cd "$src"
    if [ ! -x configure ]; then
        log "autogen (ucx $upver)"
        ./autogen.sh >"$base/autogen.log" 2>&1 ||
            { tail -n 30 "$base/autogen.log"; die "ucx autogen failed"; }
    fi
    rm -rf "$base/obj" "$prefix"
    mkdir -p "$base/obj"
    cd "$base/obj"
    local -a deb_flags
    mapfile -t deb_flags < <(debian_configure_flags "$src")
    log "configure ucx $upver --prefix=$prefix ${deb_flags[*]}"
    "$src/configure" --prefix="$prefix" "${ucx_configure_flags[@]}" \
        "${deb_flags[@]}" >"$base/configure.log" 2>&1 ||
        { tail -n 30 "$base/configure.log"; die "ucx configure failed"; }
    log "make -j$jobs (ucx $upver)"
    make -j"$jobs" >"$base/make.log" 2>&1 ||
        { tail -n 40 "$base/make.log"; die "ucx make failed"; }
    make install >"$base/install.log" 2>&1 ||
        { tail -n 30 "$base/install.log"; die "ucx make install failed"; }
    t1=$(date +%s)
    echo "debian $debver, built in $((t1 - t0)) s with -j$jobs" >"$stamp"
    log "ucx $upver installed: $prefix ($((t1 - t0)) s)"
    "$prefix/bin/ucx_info" -v | sed 's/^/    /'
}

# ------------------------------------------------------------ binary

do_binary() {  # what
    local what=$1 debver upver root dl libcver p
    apt_private_update bin
    debver=$(resolve_version bin libucx0 "$what") ||
        die "no libucx0 for '$what' in: $suites"
    upver=$(upstream_version "$debver")
    root=$builddir/ucx-$upver/debian-root
    dl=$builddir/ucx-$upver/debs
    # the libc6 of the suite that has this libucx0
    libcver=$(apt_versions bin libucx0 | awk -v v="$debver" '$2 == v {print $1; exit}')
    libcver=$(resolve_version bin libc6 "$libcver") || die "no libc6"
    rm -rf "$dl" "$root"
    mkdir -p "$dl" "$root"
    log "apt-get download libucx0 libucx-dev ucx-utils =$debver, libc6=$libcver"
    (cd "$dl" && apt_private bin apt-get download "libucx0=$debver" \
        "libucx-dev=$debver" "ucx-utils=$debver" "libc6=$libcver") ||
        die "apt-get download failed"
    for p in "$dl"/*.deb; do
        dpkg-deb -x "$p" "$root"
    done
    local libdir=$root/usr/lib/x86_64-linux-gnu
    cat >"$root/run" <<EOF
#!/bin/sh
# Run a program of Debian's UCX $debver (unpacked, not installed) with the
# libc6 $libcver it was built for; PROGRAM is looked up in its usr/bin.
p=\$1; shift
case \$p in */*) ;; *) p=$root/usr/bin/\$p ;; esac
exec $libdir/ld-linux-x86-64.so.2 \\
    --library-path $libdir:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu "\$p" "\$@"
EOF
    chmod +x "$root/run"
    rm -rf "$dl"
    log "unpacked: $root; try: $root/run ucx_info -v"
    "$root/run" ucx_info -v | sed 's/^/    /'
}

cmd=${1:-versions}
case $cmd in
versions) do_versions ;;
source)   [ $# -ge 2 ] || die "usage: $0 source SUITE|VERSION [DEST]"
          fetch_source "$2" "${3:-}" ;;
build)    [ $# -eq 2 ] || die "usage: $0 build SUITE|VERSION"
          do_build "$2" ;;
binary)   [ $# -eq 2 ] || die "usage: $0 binary SUITE|VERSION"
          do_binary "$2" ;;
*)        die "unknown command '$cmd' (versions, source, build, binary)" ;;
esac
