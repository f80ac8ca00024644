#!/bin/bash
#
# hca-setup.sh - install dependencies, fetch the UCX source, build and test hca.
#
# usage: contrib/hca-setup.sh [deps|build|demo|test]     (default: build)
#        contrib/hca-setup.sh test --quick
#        contrib/hca-setup.sh test-ucx-versions
#        contrib/hca-setup.sh ucx SUITE|VERSION
#
# Which UCX: HCA_UCX (below); unset, the system's (Debian's libucx with its
# source from `apt-get source ucx`).
#
#   ucx    build a UCX version from Debian's source package into
#          <build>/ucx-<version>/prefix (e.g. "ucx trixie" for 1.18.1), with
#          apt state of its own; cached: see contrib/ucx-debian.sh
#   deps   install the Debian packages hca needs (only what is missing) and
#          the UCX source tree of the installed UCX version
#   build  deps + autogen + configure (in build/) + make
#   test   build + make check, the libFuzzer harnesses (test/fuzz, 30 s
#          each), the short reliability campaigns (test/reliability), the
#          multi-host tests (test/multihost: two network namespaces, hca's
#          tcp fabric; and make check's test programs across two namespace
#          hosts; root only, a SKIPPED line otherwise; HCA_MULTIHOST=0
#          skips them), then the googletest suites again built with
#          AddressSanitizer (in <build>-asan; HCA_ASAN=0 skips that);
#          all against the system's UCX.  Then the other UCX versions
#          (HCA_UCX_VERSIONS): UCX 1.22.0 built from $HCA_UCX_122_SRC
#          (cached), hca built against it in build-ucx-1.22.0, its
#          gtest_uct (UCT and UCP tests, the module found through
#          UCX_PLUGIN_PATH, no preload), UCX 1.22.0's own uct suites with
#          an hca instance (test/ucx-gtest/ucx-gtest.sh: the binary built
#          once per machine in the UCX cache, ~8 minutes; the set "ci" on
#          both fabrics, ~2 minutes), test/smoke/run-smoke.sh (ucx_info
#          -d with no preload, a ucx_perftest run on the shm and tcp
#          fabrics) and the MPI programs with 2 ranks over hca with that
#          UCX's libraries (hca-run: LD_LIBRARY_PATH).  Prints
#          "UCX version: X.Y.Z" for each UCX built and tested against and
#          at the end every suite's result and duration.
#          With HCA_UCX set: the whole of the above against that UCX only.
#   test --quick
#          build + the quick tier only (test/run-quick.sh, what `make
#          check-quick` runs): gtest_hca and gtest_uct on both fabrics with
#          short sizes, the MPI program p2p with 2 ranks; a few minutes;
#          every part's result and duration at the end
#   test-ucx-versions
#          only the part of `test` for the UCX versions besides the
#          system's (HCA_UCX_VERSIONS: default 1.22.0, all: and 1.18.1)
#   demo   build + show hca working: the device, ucx_info, MPI and
#          OpenSHMEM programs over UCX_TLS=hca,self with the transport
#          proven (hca-run --verbose), the same MPI program across two
#          namespace hosts with its counters by fabric (root only:
#          contrib/hca-hosts.sh), a ucx_perftest comparison with UCX's
#          posix/cma
#
# Environment:
#   HCA_UCX              the UCX to build and run against: an installed
#                        PREFIX (with bin/ucx_info, lib/pkgconfig), or a
#                        UCX release TARBALL or source DIR, which is built
#                        into a cached prefix first (contrib/ucx-build.sh,
#                        $HCA_UCX_CACHE; 4-8 minutes once); unset: the
#                        system's UCX
#   HCA_UCX_VERSIONS     `test` without HCA_UCX: which UCX versions:
#                        "default" (the system's, and 1.22.0), "all"
#                        (also 1.18.1: its gtest_uct), "system" (only it)
#   HCA_UCX_122_SRC      UCX 1.22.0 source tarball or tree (default:
#                        <repo>/../shared/ucx-src/ucx-1.22.0.tar.xz, else
#                        the same beside the repository <repo> was cloned
#                        from; missing: a SKIPPED line)
#   HCA_UCX_118_SRC      the same for 1.18.1 (ucx-1.18.1.tar.xz)
#   HCA_CONFIGURE_FLAGS  extra configure flags (e.g. "--enable-asan");
#                        a change of flags reconfigures and rebuilds build/
#   HCA_BUILD_DIR        build directory (default: <repo>/build; with
#                        HCA_UCX: <repo>/build-ucx-<version>)
#   HCA_MAKE_JOBS        parallel make jobs (default: number of CPUs)
#
set -euo pipefail

topdir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ucx_src_root=$topdir/contrib/ucx-src
jobs=${HCA_MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}
# The UCX to build against: empty = the system's; else an install prefix
# (resolve_ucx fills it in from HCA_UCX).
ucx_prefix=""

# Debian packages needed to build, test and run hca.
packages=(
    build-essential autoconf automake libtool pkg-config dpkg-dev patch xz-utils
    libucx-dev ucx-utils libnuma-dev libsodium-dev googletest libgtest-dev
    openmpi-bin libopenmpi-dev valgrind iproute2 procps
    clang libclang-rt-14-dev util-linux
    python3
)

log() { echo "hca-setup: $*"; }
die() { echo "hca-setup: error: $*" >&2; exit 1; }

# Run a command as root: directly, via sudo, or fail.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run '$*' (not root and sudo is not installed)"
    fi
}

abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

# The version of the UCX installed under a prefix (its pkg-config file).
prefix_version() {  # prefix
    PKG_CONFIG_PATH=$1/lib/pkgconfig pkg-config --modversion ucx
}

# HCA_UCX=PREFIX|TARBALL|DIR: set ucx_prefix, building a tarball or source
# tree first (cached: contrib/ucx-build.sh prints the prefix last).
resolve_ucx() {  # spec
    local spec
    spec=$(abspath "$1")
    if [ -d "$spec" ] && [ -x "$spec/bin/ucx_info" ] &&
       [ -f "$spec/lib/pkgconfig/ucx.pc" ]; then
        ucx_prefix=$(cd "$spec" && pwd)
    elif [ -f "$spec" ] || [ -f "$spec/configure.ac" ]; then
        log "UCX from $spec: contrib/ucx-build.sh build (cached)"
        ucx_prefix=$(HCA_MAKE_JOBS=$jobs "$topdir/contrib/ucx-build.sh" build "$spec" |
                     tail -n 1)
        [ -x "$ucx_prefix/bin/ucx_info" ] || die "building UCX from $spec failed"
    else
        die "HCA_UCX=$1: not a UCX prefix (bin/ucx_info, lib/pkgconfig/ucx.pc), a tarball or a source tree (configure.ac)"
    fi
    log "UCX $(prefix_version "$ucx_prefix") in $ucx_prefix"
}

# A UCX under a prefix for the tools this script and the tests run without
# hca-run (ucx_perftest of the multi-host tests, the reliability helpers):
# its bin first in PATH, its libraries first for every program.
use_ucx_prefix_env() {
    [ -n "$ucx_prefix" ] || return 0
    export PATH=$ucx_prefix/bin:$PATH
    export LD_LIBRARY_PATH=$ucx_prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

if [ -n "${HCA_UCX:-}" ]; then
    case ${1:-build} in
    build|test|demo) resolve_ucx "$HCA_UCX" ;;
    esac
fi
if [ -n "$ucx_prefix" ]; then
    builddir=${HCA_BUILD_DIR:-$topdir/build-ucx-$(prefix_version "$ucx_prefix")}
else
    builddir=${HCA_BUILD_DIR:-$topdir/build}
fi
builddir=$(abspath "$builddir")

apt_updated=no
apt_update() {
    if [ "$apt_updated" = no ]; then
        # One unreachable or source-less repository must not stop us: the
        # following install/source step reports what is really missing.
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
            log "warning: apt-get update reported errors, continuing"
        apt_updated=yes
    fi
}

# Print the first existing path among the arguments (an unmatched glob is
# passed through literally and does not exist).
first_match() {
    local f
    for f in "$@"; do
        [ -e "$f" ] && { echo "$f"; return; }
    done
    true
}

pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = \
      "install ok installed" ]
}

install_packages() {
    local missing=() p
    for p in "${packages[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "all ${#packages[@]} packages are installed"
        return
    fi
    log "installing: ${missing[*]}"
    apt_update
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Print deb-src stanzas derived from the deb822 sources files: every enabled
# stanza whose Types include "deb" and which belongs to this distribution
# (a suite named after the release codename), copied with Types: deb-src.
derive_deb822_src() {
    local codename=$1 f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        [ "$(basename "$f")" = hca-deb-src.sources ] && continue
        awk -v codename="$codename" '
            function flush(   i, n, t, s, keep, has_deb, has_src) {
                if (nlines == 0) return
                n = split(types, t, /[ \t]+/)
                for (i = 1; i <= n; i++) {
                    if (t[i] == "deb") has_deb = 1
                    if (t[i] == "deb-src") has_src = 1
                }
                keep = has_deb && !has_src && tolower(enabled) != "no"
                if (keep && codename != "") {
                    n = split(suites, s, /[ \t]+/)
                    keep = 0
                    for (i = 1; i <= n; i++) {
                        if (s[i] == codename || index(s[i], codename "-") == 1 ||
                            index(s[i], codename "/") == 1) keep = 1
                    }
                }
                if (keep) {
                    print "Types: deb-src"
                    for (i = 1; i <= nlines; i++) print lines[i]
                    print ""
                }
                nlines = 0; types = ""; suites = ""; enabled = ""
            }
            /^[ \t]*$/ { flush(); field = ""; next }
            /^#/ { next }
            /^[ \t]/ { if (field != "types") lines[++nlines] = $0; next }
            {
                field = tolower($0); sub(/:.*/, "", field)
                value = $0; sub(/^[^:]*:[ \t]*/, "", value)
                if (field == "types") { types = value; next }
                if (field == "suites") suites = value
                if (field == "enabled") enabled = value
                lines[++nlines] = $0
            }
            END { flush() }
        ' "$f"
    done
}

# Print deb-src lines derived from the one-line /etc/apt/sources.list.
derive_list_src() {
    local f=/etc/apt/sources.list
    [ -f "$f" ] || return 0
    sed -n 's/^[ \t]*deb[ \t]\+/deb-src /p' "$f"
}

ensure_deb_src() {
    local codename tmp
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    tmp=$(mktemp)
    derive_deb822_src "$codename" >"$tmp"
    if [ -s "$tmp" ] && [ ! -f /etc/apt/sources.list.d/hca-deb-src.sources ]; then
        log "adding deb-src entries: /etc/apt/sources.list.d/hca-deb-src.sources"
        as_root install -m 0644 "$tmp" /etc/apt/sources.list.d/hca-deb-src.sources
    fi
    derive_list_src >"$tmp"
    if [ -s "$tmp" ] && [ ! -f /etc/apt/sources.list.d/hca-deb-src.list ]; then
        log "adding deb-src entries: /etc/apt/sources.list.d/hca-deb-src.list"
        as_root install -m 0644 "$tmp" /etc/apt/sources.list.d/hca-deb-src.list
    fi
    rm -f "$tmp"
}

# Installed UCX version, Debian form (e.g. 1.13.1-1) and upstream (1.13.1).
ucx_deb_version() {
    dpkg-query -W -f='${Version}' libucx0 2>/dev/null ||
        die "libucx0 is not installed (run: $0 deps)"
}
ucx_upstream_version() {
    local v=${1#*:}      # drop epoch
    v=${v%-*}            # drop Debian revision
    echo "${v%%[+~]*}"   # drop +dfsg / ~rc suffixes
}

fetch_ucx_source() {
    local debver upver dest dl orig top
    debver=$(ucx_deb_version)
    upver=$(ucx_upstream_version "$debver")
    dest=$ucx_src_root/ucx-$upver
    if [ -f "$dest/src/uct/base/uct_iface.h" ]; then
        log "UCX source $upver present: $dest"
        return
    fi

    log "fetching the source of ucx $debver"
    dl=$ucx_src_root/download
    rm -rf "$dl"
    mkdir -p "$dl"
    # Root downloads without apt's _apt sandbox user (it cannot write here).
    if ! (cd "$dl" && apt-get -q -o APT::Sandbox::User=root \
              source --download-only "ucx=$debver"); then
        log "no source for ucx=$debver yet: deriving deb-src entries"
        ensure_deb_src
        apt_updated=no
        apt_update
        (cd "$dl" && apt-get -q -o APT::Sandbox::User=root \
             source --download-only "ucx=$debver") ||
            die "apt-get source ucx=$debver failed"
    fi

    orig=$(first_match "$dl"/ucx_*.orig.tar.*)
    [ -n "$orig" ] || die "no ucx_*.orig.tar.* in $dl"
    top=$(tar -tf "$orig" | head -n 1 || true)
    top=${top%%/*}
    [ -n "$top" ] || die "cannot read $orig"

    rm -rf "${dl:?}/${top:?}" "$dest"
    tar -xf "$orig" -C "$dl" "$top/src" "$top/configure.ac"
    apply_debian_patches "$dl" "$dl/$top"
    mv "$dl/$top" "$dest"
    rm -rf "$dl"
    [ -f "$dest/src/uct/base/uct_iface.h" ] ||
        die "extraction failed: $dest/src/uct/base/uct_iface.h missing"
    log "UCX source $upver extracted: $dest ($(du -sh "$dest" | cut -f1))"
}

# Apply the Debian patches that touch src/ or configure.ac, so the headers are
# those Debian built with.
apply_debian_patches() {
    local dl=$1 tree=$2 deb p
    deb=$(first_match "$dl"/ucx_*.debian.tar.*)
    [ -n "$deb" ] || return 0
    tar -xf "$deb" -C "$dl" debian/patches 2>/dev/null || return 0
    [ -f "$dl/debian/patches/series" ] || return 0
    while read -r p _; do
        case $p in ''|'#'*) continue ;; esac
        if grep -qE '^\+\+\+ [^/]+/(src/|configure\.ac)' "$dl/debian/patches/$p"; then
            log "applying Debian patch $p"
            patch -d "$tree" -p1 -s -f --no-backup-if-mismatch \
                <"$dl/debian/patches/$p" ||
                log "warning: Debian patch $p did not apply cleanly"
        fi
    done <"$dl/debian/patches/series"
}

do_deps() {
    install_packages
    # the Debian source of the system's UCX; a prefix UCX has its own
    # (contrib/ucx-build.sh keeps it beside the prefix)
    if [ -z "$ucx_prefix" ]; then
        fetch_ucx_source
    fi
}

do_build() {
    local upver flags stamp
    if [ -n "$ucx_prefix" ]; then
        # the source: <prefix>/../src-tree (configure's default)
        flags="--enable-werror --with-ucx=$ucx_prefix"
    else
        upver=$(ucx_upstream_version "$(ucx_deb_version)")
        flags="--enable-werror --with-ucx-src=$ucx_src_root/ucx-$upver"
    fi
    flags+="${HCA_CONFIGURE_FLAGS:+ $HCA_CONFIGURE_FLAGS}"

    cd "$topdir"
    if [ ! -x configure ] || [ configure.ac -nt configure ]; then
        log "autogen"
        ./autogen.sh
    fi

    mkdir -p "$builddir"
    cd "$builddir"
    stamp=.hca-configure-flags
    if [ ! -f config.status ] || [ "$topdir/configure" -nt config.status ] ||
       [ "$(cat "$stamp" 2>/dev/null)" != "$flags" ]; then
        log "configure $flags"
        # shellcheck disable=SC2086  # flags are words
        "$topdir/configure" $flags
        # Objects built with other flags must not be reused.
        if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$flags" ]; then
            make -s clean
        fi
        echo "$flags" >"$stamp"
    fi
    log "make -j$jobs"
    make -j"$jobs"
}

# ------------------------------------------------------------ test

# Every suite runs, whatever the earlier ones did; each one's result and
# duration are listed at the end and any failure fails the command.
suite_results=()
suites_failed=0

# run_suite NAME COMMAND...: COMMAND in a subshell with set -e (a failing
# step ends that suite only, and `die` ends the subshell).
suite_failures=()
# Each suite's output is also kept (in a temporary file) so that a failed
# suite's failure lines can be repeated at the end: CI shows only the tail
# of a run of an hour.
run_suite() {
    local name=$1 t0=$SECONDS rc slog line
    shift
    log "==== $name"
    slog=$(mktemp "${TMPDIR:-/tmp}/hca-suite.XXXXXX")
    set +e
    ( set -e; "$@" ) 2>&1 | tee "$slog"
    rc=${PIPESTATUS[0]}
    set -e
    if [ $rc -eq 0 ]; then
        suite_results+=("$(printf '%-44s PASS    %5d s' "$name" $((SECONDS - t0)))")
    else
        suite_results+=("$(printf '%-44s FAIL    %5d s  (exit status %d)' "$name" $((SECONDS - t0)) $rc)")
        suites_failed=1
        suite_failures+=("$name:")
        while IFS= read -r line; do
            suite_failures+=("    $line")
        done < <(failure_lines "$slog")
    fi
    rm -f "$slog"
}

# What says why a suite failed: googletest's failed tests, the sanitizers'
# reports, timeouts, and the FAIL lines of the scripts' own summaries (at
# most 20 lines, each cut at 200 characters).
failure_lines() {  # log
    grep -a -E '^\[  FAILED  \]|ERROR: AddressSanitizer|SUMMARY: (Address|Undefined)Sanitizer|^ *#[0-2] 0x[0-9a-f]+ in |runtime error:|killed after [0-9]+s|^FAIL[ :]|FAILED[:]|^ *FAIL |Assertion .* failed|make.*\*\*\* \[' "$1" |
        grep -v -E '^\[  FAILED  \] *[0-9]+ tests?, listed below' |
        awk '!seen[$0]++' | head -n 20 | cut -c1-200
}

suite_skipped() {  # name why
    echo "SKIPPED: $1: $2"
    suite_results+=("$(printf '%-44s SKIPPED         %s' "$1" "$2")")
}

print_suites() {
    local r
    log "suites (result, duration):"
    for r in "${suite_results[@]}"; do
        echo "  $r"
    done
    if [ ${#suite_failures[@]} -gt 0 ]; then
        log "what failed (the failed suites' failure lines, repeated):"
        for r in "${suite_failures[@]}"; do
            echo "  $r"
        done
    fi
}

# The version of the UCX a build tree was configured against.
ucx_version_line() {  # builddir
    local v
    v=$(sed -n 's/^UCX_VERSION = //p' "$1/Makefile" 2>/dev/null | head -n 1)
    echo "UCX version: ${v:-unknown (no $1/Makefile)}"
}

test_make_check() {
    # the test programs across namespace hosts belong to the multi-host
    # tests: HCA_MULTIHOST=0 skips them too
    if [ "${HCA_MULTIHOST:-1}" != 1 ]; then
        export HCA_APPS_HOSTS=0
    fi
    # -k: every suite runs even if an earlier one failed; the status is
    # still non-zero.
    make -k -C "$builddir" check
}

# forged input from other processes: libFuzzer over the ring consumer and
# the responder, HCA_FUZZ_SECONDS each (default 30)
test_fuzz() {
    HCA_FUZZ_BUILD=${builddir}-fuzz \
        "$topdir/test/fuzz/run-fuzz.sh" "${HCA_FUZZ_SECONDS:-30}"
}

# killed peers, churn, other users, a soak: the short campaigns
test_reliability() {
    HCA_BUILD_DIR=$builddir "$topdir/test/reliability/run-all.sh" --short
}

# two "hosts" (network namespaces joined by a veth pair): the ucx_perftest
# matrix and the fault cases over the tcp fabric, under 3 minutes; needs
# root (prints SKIPPED otherwise)
test_multihost() {
    HCA_BUILD_DIR=$builddir "$topdir/test/multihost/run-multihost.sh"
}

# Everything, against the UCX of $builddir (the system's, or HCA_UCX's).
do_test() {
    local what
    what="UCX $(ucx_version_line "$builddir" | sed 's/^UCX version: //')"
    ucx_version_line "$builddir"
    run_suite "$what: make check" test_make_check
    run_suite "libFuzzer harnesses (test/fuzz)" test_fuzz
    run_suite "$what: reliability, short" test_reliability
    if [ "${HCA_MULTIHOST:-1}" = 1 ]; then
        run_suite "$what: multi-host (namespaces)" test_multihost
    fi
    if [ "${HCA_ASAN:-1}" = 1 ]; then
        run_suite "$what: googletest, AddressSanitizer" do_test_asan
    fi
}

# The googletest suites again, built with AddressSanitizer in a second
# build tree (<build>-asan).  gtest_uct runs stock UCX with the module
# loaded by UCX (a scanning UCX: UCX_PLUGIN_PATH) or preloaded, so the ASan
# runtime is preloaded first; leak checking is off there because UCX
# itself keeps allocations until exit.  HCA_ASAN=0 skips.
do_test_asan() {
    local asandir=${builddir}-asan libasan rc=0 load
    log "AddressSanitizer build in $asandir"
    HCA_BUILD_DIR=$asandir \
    HCA_CONFIGURE_FLAGS="--enable-asan${HCA_CONFIGURE_FLAGS:+ $HCA_CONFIGURE_FLAGS}" \
        "$topdir/contrib/hca-setup.sh" build
    make -C "$asandir/test/gtest" -j"$jobs" gtest_hca gtest_uct
    libasan=$(${CC:-gcc} -print-file-name=libasan.so)
    if [ "$(sed -n 's/^UCX_MODULE_LOAD = //p' "$asandir/Makefile")" = scan ]; then
        load="env LD_PRELOAD=$libasan UCX_PLUGIN_PATH=$asandir/src/uct/hca/modules"
    else
        load="env LD_PRELOAD=$libasan:$asandir/src/uct/hca/.libs/libuct_hca.so"
    fi
    log "gtest_hca under AddressSanitizer"
    (cd "$asandir/test/gtest" &&
        "$topdir/test/gtest/run-gtest.sh" ./gtest_hca) || rc=1
    log "gtest_uct under AddressSanitizer"
    (cd "$asandir/test/gtest" &&
        ASAN_OPTIONS=detect_leaks=0 HCA_GTEST_RUNNER="$load" \
        "$topdir/test/gtest/run-gtest.sh" ./gtest_uct) || rc=1
    if [ $rc -ne 0 ]; then
        log "AddressSanitizer suites: FAILED"
        exit 1
    fi
    log "AddressSanitizer suites: all tests passed"
}

# hca built against a UCX prefix in a build tree of its own, and the
# layout check of that build run (configure ran it too).
build_against() {  # prefix builddir
    ucx_prefix=$1
    builddir=$2
    do_build
    make -C "$builddir/contrib" ucx_layout_check
    "$builddir/contrib/ucx_layout_check"
}

# The MPI programs with 2 ranks on this host, over hca with the prefix's
# libraries (hca-run puts them first in LD_LIBRARY_PATH for every rank:
# Debian's Open MPI links libucp.so.0); run-apps.sh checks every rank's hca
# counters.
test_apps_2ranks() {  # builddir
    HCA_APPS_NP=2 make -C "$1/test/apps" check HCA_APPS_HOSTS=0
}

# The tests of one more UCX version, from its source (built once, cached).
#   LEVEL full:  gtest_uct, UCX's own uct suites over hca
#                (test/ucx-gtest/ucx-gtest.sh, set ci), test/smoke
#                (ucx_info -d, ucx_perftest on both fabrics), the MPI
#                programs with 2 ranks
#   LEVEL gtest: gtest_uct
test_ucx_version() {  # label src level
    local label=$1 src=$2 level=$3 prefix bdir
    if [ ! -e "$src" ]; then
        suite_skipped "UCX $label" "$src not found"
        return 0
    fi
    run_suite "UCX $label: UCX build (cached)" \
        env HCA_MAKE_JOBS="$jobs" "$topdir/contrib/ucx-build.sh" build "$src"
    prefix=$("$topdir/contrib/ucx-build.sh" prefix "$src")
    [ -f "$prefix/.hca-ucx-built" ] || return 0   # its failure is listed
    if [ -n "${HCA_BUILD_DIR:-}" ]; then
        bdir=${HCA_BUILD_DIR}-ucx-$label
    else
        bdir=$topdir/build-ucx-$label
    fi
    log "UCX $label: hca build tree $bdir"
    run_suite "UCX $label: build hca, layout check" build_against "$prefix" "$bdir"
    [ -f "$bdir/Makefile" ] || return 0
    ucx_version_line "$bdir"
    run_suite "UCX $label: gtest_uct (UCT and UCP)" \
        make -C "$bdir/test/gtest" check-gtest-uct
    if [ "$level" = full ]; then
        # UCX's own uct suites of that release, with an hca instance
        # (built once per machine beside the UCX prefix)
        run_suite "UCX $label: UCX's own uct suites over hca (ucx-gtest ci)" \
            env HCA_MAKE_JOBS="$jobs" "$topdir/test/ucx-gtest/ucx-gtest.sh" \
                run "$src" "$bdir" ci
        run_suite "UCX $label: ucx_info -d, ucx_perftest smoke" \
            "$topdir/test/smoke/run-smoke.sh" "$bdir"
        if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
            run_suite "UCX $label: MPI test/apps, 2 ranks" test_apps_2ranks "$bdir"
        else
            suite_skipped "UCX $label: MPI test/apps" "mpirun or mpicc not installed"
        fi
    fi
}

# The release tarball of UCX VERSION for the matrix: ucx-VERSION.tar.xz in
# shared/ucx-src beside this tree, else beside the repository this tree was
# cloned from (a CI clone made elsewhere from a local repository); printed
# as the first place when neither has it (reported as not found).
find_ucx_src() {  # version
    local v=$1 origin d
    origin=$(git -C "$topdir" config --get remote.origin.url 2>/dev/null || true)
    origin=${origin#file://}
    for d in "$topdir/.." ${origin:+"$origin/.."}; do
        if [ -f "$d/shared/ucx-src/ucx-$v.tar.xz" ]; then
            echo "$d/shared/ucx-src/ucx-$v.tar.xz"
            return
        fi
    done
    echo "$topdir/../shared/ucx-src/ucx-$v.tar.xz"
}

do_test_matrix() {
    local versions=${HCA_UCX_VERSIONS:-default}
    local src122=${HCA_UCX_122_SRC:-$(find_ucx_src 1.22.0)}
    local src118=${HCA_UCX_118_SRC:-$(find_ucx_src 1.18.1)}
    case $versions in
    system|default|all) ;;
    *) die "HCA_UCX_VERSIONS=$versions: use system, default or all" ;;
    esac
    if [ "${1:-}" != others ]; then
        do_test
    fi
    if [ "$versions" != system ]; then
        test_ucx_version 1.22.0 "$(abspath "$src122")" full
    fi
    if [ "$versions" = all ]; then
        test_ucx_version 1.18.1 "$(abspath "$src118")" gtest
    fi
}

# The quick tier, one suite per part of test/run-quick.sh (so that each
# part's duration is listed), the test programs built first.
quick_programs() {
    make -j"$jobs" -C "$builddir/test/gtest" quick-programs
    make -C "$builddir/test/apps" quick-programs
}

do_test_quick() {
    ucx_version_line "$builddir"
    run_suite "quick: build the test programs" quick_programs
    run_suite "quick: gtest_hca (shm and tcp, short sizes)" \
        "$topdir/test/run-quick.sh" "$builddir" hca
    run_suite "quick: gtest_uct (shm and tcp, short sizes)" \
        "$topdir/test/run-quick.sh" "$builddir" uct
    run_suite "quick: MPI p2p, 2 ranks, -q" \
        "$topdir/test/run-quick.sh" "$builddir" apps
}

finish_test() {
    print_suites
    if [ $suites_failed -ne 0 ]; then
        log "tests: FAILED"
        exit 1
    fi
    log "tests: all suites passed"
}

# ------------------------------------------------------------ demo

section() { printf '\n==== %s\n\n' "$*"; }

# Median of the numbers on stdin.
median() {
    sort -g | awk '{v[NR] = $1} END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# One ucx_perftest client/server pair on this host, through hca-run (the
# module is loaded for every transport alike). Prints the CSV result line
# (iterations,lat50,lat_avg,lat_overall,bw_avg,bw_overall,mr_avg,mr_overall)
# or nothing on failure.
perftest_pair() {  # tl dev test layout size iters
    local tl=$1 dev=$2 test=$3 layout=$4 size=$5 iters=$6
    local port srv out pin_srv=() pin_cli=()
    port=$((41000 + RANDOM % 9000))
    # one CPU each, as contrib/bench/hca-bench.sh does (docs/BENCHMARKS.md)
    if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
        pin_srv=(taskset -c 0)
        pin_cli=(taskset -c 1)
    fi
    # the transport and device for the server too: 1.22's ucx_perftest
    # checks the server's own parameters before taking the client's test
    timeout 120 "${pin_srv[@]}" "$hcarun" ucx_perftest -p "$port" \
        -x "$tl" -d "$dev" >/dev/null 2>&1 &
    srv=$!
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.3
        out=$(timeout 120 "${pin_cli[@]}" "$hcarun" ucx_perftest 127.0.0.1 \
                  -p "$port" \
                  -t "$test" -x "$tl" -d "$dev" -D "$layout" -s "$size" \
                  -n "$iters" -w $((iters / 10)) -v 2>/dev/null) && break
        out=""
        kill -0 "$srv" 2>/dev/null || break
    done
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null || true
    if [ -n "$out" ]; then
        tail -n 1 <<<"$out" | tr -d ' '
    fi
}

demo_perftest() {
    local rounds=3 i value tl dev
    # label | test | layout | size | iterations | other tl | metric field
    local rows=(
        "am_lat short 8 B|am_lat|short|8|20000|posix|2"
        "put_lat short 8 B|put_lat|short|8|20000|posix|2"
        "put_bw zcopy 1 MiB|put_bw|zcopy|1048576|500|cma|6"
        "get zcopy 1 MiB|get|zcopy|1048576|500|cma|6"
    )
    local -a label test layout size iters other col
    local -A res=()
    for i in "${!rows[@]}"; do
        IFS='|' read -r "label[$i]" "test[$i]" "layout[$i]" "size[$i]" \
            "iters[$i]" "other[$i]" "col[$i]" <<<"${rows[$i]}"
    done
    command -v ucx_perftest >/dev/null ||
        { log "ucx_perftest not found: comparison skipped"; return 0; }

    log "ucx_perftest, $rounds rounds, hca and the built-in transport back to back"
    for _ in $(seq 1 $rounds); do
        for i in "${!rows[@]}"; do
            for tl in hca "${other[i]}"; do
                if [ "$tl" = hca ]; then dev=hca0; else dev=memory; fi
                value=$(perftest_pair "$tl" "$dev" "${test[i]}" "${layout[i]}" \
                            "${size[i]}" "${iters[i]}" | cut -d, -f"${col[i]}")
                res[$i,$tl]+="${value:-nan} "
            done
        done
        printf '.'
    done
    echo

    printf '%-20s %15s %15s %9s\n' test hca other hca/other
    for i in "${!rows[@]}"; do
        local h o unit what ratio
        h=$(tr ' ' '\n' <<<"${res[$i,hca]}" | { grep -v '^$\|nan' || true; } | median)
        o=$(tr ' ' '\n' <<<"${res[$i,${other[i]}]}" | { grep -v '^$\|nan' || true; } | median)
        if [ "${col[i]}" = 2 ]; then
            unit=us what="latency, lower is better"
        else
            unit=MB/s what="bandwidth, higher is better"
        fi
        ratio=$(awk -v h="$h" -v o="$o" 'BEGIN {
            if (h + 0 > 0 && o + 0 > 0) printf "%.2f", h / o; else print "-" }')
        printf '%-20s %10s %-4s %10s %-4s %9s  (%s: %s)\n' "${label[i]}" "$h" \
            "$unit" "$o" "$unit" "$ratio" "${other[i]}" "$what"
    done
    echo "(medians of $rounds runs each, hca and ${other[0]}/${other[2]} interleaved)"
}

# The rma program (puts, gets, atomics, flushes) with 2 ranks on each of
# two namespace hosts: the counters by fabric show shm between the ranks
# of a host and tcp between the hosts.
demo_hosts() {
    local apps=$builddir/test/apps
    if [ "$(id -u)" -ne 0 ]; then
        echo "SKIPPED: not root (namespace hosts need root); as root:"
        echo "  contrib/hca-hosts.sh run -- sh -c '$hcarun --verbose mpirun -np 4 \$HCA_HOSTS_MPIRUN_ARGS $apps/rma -q'"
        return 0
    fi
    if ! command -v mpirun >/dev/null || ! make -s -C "$apps" rma; then
        log "mpirun or the MPI programs are missing: skipped"
        return 0
    fi
    local rc=0
    "$topdir/contrib/hca-hosts.sh" run -n 2 --slots 2 -- bash -c '
        set -e
        echo "hosts: $HCA_HOSTS; hostfile $HCA_HOSTFILE:"
        sed "s/^/  /" "$HCA_HOSTFILE"
        echo "where the ranks run ([job,rank]: hostname):"
        # shellcheck disable=SC2086
        mpirun --allow-run-as-root --oversubscribe -np 4 $HCA_HOSTS_MPIRUN_ARGS \
            --tag-output hostname | sort | sed "s/^/  /"
        echo
        # shellcheck disable=SC2086
        "$0" --verbose mpirun --oversubscribe -np 4 $HCA_HOSTS_MPIRUN_ARGS "$1" -q
    ' "$hcarun" "$apps/rma" || rc=$?
    case $rc in
    0) ;;
    3) echo "SKIPPED: network namespaces cannot be made here" ;;
    *) die "rma across two hosts failed (exit status $rc)" ;;
    esac
}

do_demo() {
    local devinfo=$builddir/src/tools/hca_devinfo
    local bench=$builddir/contrib/hca_pingpong_bench
    local apps=$builddir/test/apps
    local t0=$SECONDS
    hcarun=$builddir/contrib/hca-run
    [ -x "$devinfo" ] || die "$devinfo was not built"
    [ -x "$hcarun" ] || die "$hcarun was not built"

    section "1/6 the device: hca_devinfo"
    "$devinfo"

    section "2/6 UCX with the module loaded: hca-run ucx_info -d (the hca part)"
    "$hcarun" ucx_info -d | awk '
        /^# *Memory domain:/ { show = ($NF == "hca") }
        /^# *Connection manager:|^# *</ { show = 0 }
        show'

    section "3/6 MPI over UCX_TLS=hca,self: hca-run --verbose mpirun (2 ranks)"
    if command -v mpirun >/dev/null && command -v mpicc >/dev/null &&
       [ -f "$apps/Makefile" ]; then
        make -s -C "$apps" p2p rma ||
            die "cannot build the MPI test programs"
        "$hcarun" --verbose mpirun --oversubscribe -np 2 "$apps/p2p" ||
            die "p2p over hca failed"
        echo
        "$hcarun" --verbose mpirun --oversubscribe -np 2 "$apps/rma" -q ||
            die "rma over hca failed"
        if command -v oshrun >/dev/null && make -s -C "$apps" shmem 2>/dev/null; then
            echo
            "$hcarun" --verbose oshrun --oversubscribe -np 2 "$apps/shmem" ||
                die "shmem over hca failed"
        fi
    else
        log "mpirun or the MPI programs are missing: MPI part skipped"
    fi

    section "4/6 MPI across two hosts (network namespaces): shm on a host, tcp between hosts"
    demo_hosts

    section "5/6 ucx_perftest: hca against UCX's posix (latency) and cma (bandwidth)"
    demo_perftest

    section "6/6 the machine's state: hca_pingpong_bench (raw_shm = cache-line ping-pong)"
    if [ -x "$bench" ]; then
        "$bench" -n 20000 -w 2000
    fi
    log "demo finished in $((SECONDS - t0)) s"
}

cmd=${1:-build}
case $cmd in
deps)  do_deps ;;
build) do_deps; do_build ;;
test)  do_deps; do_build; use_ucx_prefix_env
       if [ "${2:-}" = --quick ]; then
           do_test_quick
       elif [ -n "${2:-}" ]; then
           die "test: unknown option '$2' (use --quick)"
       elif [ -n "$ucx_prefix" ]; then
           do_test
       else
           do_test_matrix
       fi
       finish_test ;;
demo)  do_deps; do_build; use_ucx_prefix_env; do_demo ;;
test-ucx-versions)
       install_packages; do_test_matrix others; finish_test ;;
ucx)   [ $# -eq 2 ] || die "usage: $0 ucx SUITE|VERSION"
       HCA_BUILD_DIR=$builddir HCA_MAKE_JOBS=$jobs \
           exec "$topdir/contrib/ucx-debian.sh" build "$2" ;;
-h|--help|help)
    sed -n '3,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
*)     die "unknown command '$cmd' (use deps, build, demo, test, test-ucx-versions or ucx)" ;;
esac
