#!/bin/bash
#
# run-selftest.sh - the self-test of contrib/check-layers.sh: a few tiny C
# files compiled in a temporary directory, with a tiny map and API header.
# The checker must pass the correct set and fail, with the right message,
# on each deliberate violation.  Exit status 0 only if every case did what
# it should.
#
# usage: test/arch/run-selftest.sh [path/to/check-layers.sh]
#   CC   the C compiler (default: cc)
#
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
checker=${1:-$here/../../contrib/check-layers.sh}
cc=${CC:-cc}
[ -r "$checker" ] || { echo "selftest: no checker $checker" >&2; exit 1; }
checker=$(cd "$(dirname "$checker")" && pwd)/$(basename "$checker")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-layers-selftest.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# ------------------------------------------------------------ the tiny tree
cat >api.h <<'H'
/* the public API */
#pragma GCC visibility push(default)
int  hca_api_open(int flags);          /* a comment with hca_fake(x) */
void hca_api_close(void);
typedef int (*hca_cb_t)(int);
#pragma GCC visibility pop
H
cat >layers.map <<'M'
# the self-test's map
layer 0 base    low.c
layer 1 fabric  fab_*.c
fabric x        fab_*.c
entry x hca_fabric_x_ops   reg.c       # only the registry may use it
layer 2 top     reg.c \
                high.c
uct             uct_ep.c
M
cat >low.c <<'C'
int low_fn(void) { return 1; }
#ifdef BAD_UP
int high_fn(void);
int low_up(void) { return high_fn(); }      /* layer 0 -> layer 2 */
#endif
C
cat >fab_core.c <<'C'
int low_fn(void);
int fab_private(void) { return low_fn(); }
const struct { int (*fn)(void); } hca_fabric_x_ops = { fab_private };
C
cat >reg.c <<'C'
extern const struct { int (*fn)(void); } hca_fabric_x_ops;
const void *fabric_get(void) { return &hca_fabric_x_ops; }
C
cat >high.c <<'C'
#include "api.h"
int low_fn(void);
const void *fabric_get(void);
int high_fn(void) { return low_fn(); }
int hca_internal_fn(void) { return fabric_get() != 0; }
int hca_api_open(int flags) { return flags + high_fn() + hca_internal_fn(); }
void hca_api_close(void) { }
#ifdef BAD_FABRIC
int fab_private(void);
int high_peek(void) { return fab_private(); }   /* fabric-private */
#endif
#ifdef BAD_ENTRY
extern const struct { int (*fn)(void); } hca_fabric_x_ops;
const void *high_ops(void) { return &hca_fabric_x_ops; } /* not the registry */
#endif
C
cat >uct_ep.c <<'C'
#include "api.h"
int uct_ep_create(void) { return hca_api_open(0); }
#ifdef BAD_API
int hca_internal_fn(void);
int uct_ep_peek(void) { return hca_internal_fn(); }  /* not in api.h */
#endif
C

# variant <dir> <cflags>: every object, compiled into <dir>
variant() {
    local dir=$1 f; shift
    mkdir -p "$dir"
    for f in low fab_core reg high uct_ep; do
        "$cc" -c -fPIC -I. "$@" "$f.c" -o "$dir/$f.o" ||
            { echo "selftest: cannot compile $f.c" >&2; exit 1; }
    done
}
variant good -fvisibility=hidden
variant up -DBAD_UP
variant fabric -DBAD_FABRIC
variant entry -DBAD_ENTRY
variant api -DBAD_API
"$cc" -shared good/low.o good/fab_core.o good/reg.o good/high.o \
    -o good/libtiny.so || exit 1
variant exported
"$cc" -shared exported/low.o exported/fab_core.o exported/reg.o \
    exported/high.o -o exported/libtiny.so || exit 1

failures=0
# check <name> <expected status> <expected output (grep -E)> <dir> [args]
# A failing case must report exactly one violation (HCA_SELFTEST_COUNT
# otherwise): the one it was built for, and nothing else.
check() {
    local name=$1 want=$2 pattern=$3 dir=$4 rc out; shift 4
    local count=${HCA_SELFTEST_COUNT:-1}
    out=$(HCA_LAYERS=strict bash "$checker" --map layers.map --api-header api.h \
          --lib-obj "$dir/low.o" --lib-obj "$dir/fab_core.o" \
          --lib-obj "$dir/reg.o" --lib-obj "$dir/high.o" \
          --uct-obj "$dir/uct_ep.o" "$@" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && ! printf '%s\n' "$out" |
            grep -q "^check-layers: $count violations\{0,1\} "; then
        rc="$rc, not $count violation(s)"
    fi
    if [ "$rc" = "$want" ] && printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
        echo "selftest: PASS $name"
    else
        echo "selftest: FAIL $name: exit $rc (want $want), output:"
        printf '%s\n' "$out" | sed 's/^/    /'
        failures=$((failures + 1))
    fi
}

check "correct set passes" 0 \
    '^check-layers: OK: 5 files, 3 layers, [0-9]+ references' good
check "correct exports pass" 0 'exports checked' good \
    --lib-so good/libtiny.so
check "upward reference fails" 1 \
    '^check-layers: error: low\.c \(layer 0 base\) -> high_fn in high\.c \(layer 2 top\): upward reference$' up
check "fabric-private reference fails" 1 \
    'error: high\.c \(layer 2 top\) -> fab_private in fab_core\.c \(layer 1 fabric, fabric x\): private to fabric x$' fabric
check "fabric entry outside the registry fails" 1 \
    'error: high\.c .* -> hca_fabric_x_ops in fab_core\.c .*: entry of fabric x for its registry only$' entry
check "non-API reference from uct fails" 1 \
    'error: uct_ep\.c \(uct\) -> hca_internal_fn in high\.c \(layer 2 top\): not in api\.h.s API$' api
HCA_SELFTEST_COUNT=2 \
check "unassigned source fails (and unbuilt)" 1 \
    'error: new_file\.c: no layer in the map' good \
    --lib-sources "low.c fab_core.c reg.c high.c new_file.c"
HCA_SELFTEST_COUNT=6 \
check "exported internals fail" 1 \
    'exports hca_internal_fn .*not in api\.h.s API$' exported \
    --lib-so exported/libtiny.so
check "warn mode reports but passes" 0 'warning: .*upward reference' up --warn

if [ $failures -ne 0 ]; then
    echo "selftest: $failures case(s) failed"
    exit 1
fi
echo "selftest: OK: check-layers passed every case"
