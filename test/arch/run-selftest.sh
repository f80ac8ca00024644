#!/bin/bash
#
# run-selftest.sh - the self-test of contrib/check-layers.py: a few tiny C
# files and headers (lib/ the library, uct/ the module) compiled in a
# temporary directory, with a tiny map and API header.  The checker must
# pass the correct set and fail, with the right message, on each deliberate
# violation.  Exit status 0 only if every case did what it should.
#
# usage: test/arch/run-selftest.sh [path/to/check-layers.py]
#   CC       the C compiler (default: cc)
#   PYTHON   the Python 3 that runs the checker (default: python3)
#
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
checker=${1:-$here/../../contrib/check-layers.py}
cc=${CC:-cc}
python=${PYTHON:-python3}
[ -r "$checker" ] || { echo "selftest: no checker $checker" >&2; exit 1; }
checker=$(cd "$(dirname "$checker")" && pwd)/$(basename "$checker")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-layers-selftest.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
mkdir lib uct || exit 1

# ------------------------------------------------------------ the tiny tree
# The includes are read textually (an #ifdef does not hide one): a case of
# rule f gets a copy of the tree with one include added (see bad_tree).
cat >lib/api.h <<'H'
/* the public API */
#pragma GCC visibility push(default)
int  hca_api_open(int flags);          /* a comment with hca_fake(x) */
void hca_api_close(void);
typedef int (*hca_cb_t)(int);
#pragma GCC visibility pop
H
cat >lib/base.h <<'H'
int low_fn(void);
H
cat >lib/top.h <<'H'
#include "base.h"
int high_fn(void);
H
cat >uct/uct_int.h <<'H'
#include <api.h>    /* as the module includes hca_dev.h */
#include <stddef.h>
H
cat >layers.map <<'M'
# the self-test's map
layer 0 base    low.c
header 0        api.h base.h
layer 1 fabric  fab_*.c
fabric x        fab_*.c
order           fab_top.c fab_core.c   # fab_top.c calls down into fab_core.c
entry x hca_fabric_x_ops   reg.c       # only the registry may use it
marker x HCA_X_MARK        reg.c       # how a message says fabric x
layer 2 top     reg.c \
                high.c
header 2        top.h
uct             uct_ep.c
header uct      uct_*.h
M
cat >lib/low.c <<'C'
int low_fn(void) { return 1; }
#ifdef BAD_UP
int high_fn(void);
int low_up(void) { return high_fn(); }      /* layer 0 -> layer 2 */
#endif
C
cat >lib/fab_core.c <<'C'
#include "base.h"
int fab_private(void) { return low_fn(); }
const struct { int (*fn)(void); } hca_fabric_x_ops = { fab_private };
#ifdef BAD_API_HOME
void hca_api_close(void) { }                /* the API inside a fabric */
#endif
#ifdef BAD_ORDER
int fab_top_fn(void);
int fab_back(void) { return fab_top_fn(); } /* up the order: a circle */
#endif
C
cat >lib/fab_top.c <<'C'
int fab_private(void);
int fab_top_fn(void) { return fab_private() + 1; }   /* down: allowed */
C
cat >lib/reg.c <<'C'
extern const struct { int (*fn)(void); } hca_fabric_x_ops;
const void *fabric_get(void) { return &hca_fabric_x_ops; }
C
cat >lib/high.c <<'C'
#include "api.h"
#include "top.h"
const void *fabric_get(void);
int high_fn(void) { return low_fn(); }
int hca_internal_fn(void) { return fabric_get() != 0; }
int hca_api_open(int flags) { return flags + high_fn() + hca_internal_fn(); }
#ifndef BAD_API_HOME
void hca_api_close(void) { }
#endif
#ifdef BAD_FABRIC
int fab_private(void);
int high_peek(void) { return fab_private(); }   /* fabric-private */
#endif
#ifdef BAD_ENTRY
extern const struct { int (*fn)(void); } hca_fabric_x_ops;
const void *high_ops(void) { return &hca_fabric_x_ops; } /* not the registry */
#endif
C
cat >uct/uct_ep.c <<'C'
#include "uct_int.h"
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
    for f in lib/low lib/fab_core lib/fab_top lib/reg lib/high uct/uct_ep; do
        "$cc" -c -fPIC -Ilib -Iuct "$@" "$f.c" -o "$dir/${f#*/}.o" ||
            { echo "selftest: cannot compile $f.c" >&2; exit 1; }
    done
}
# bad_tree <dir> <file> <line>: a copy of the sources with <line> added at
# the top of <file> (lib/... or uct/...)
bad_tree() {
    mkdir -p "$1" && cp -R lib uct "$1"/ &&
        { printf '%s\n' "$3"; cat "$1/$2"; } >"$1/$2.new" &&
        mv "$1/$2.new" "$1/$2" || exit 1
}
variant good -fvisibility=hidden
variant up -DBAD_UP
variant fabric -DBAD_FABRIC
variant entry -DBAD_ENTRY
variant api -DBAD_API
variant apihome -DBAD_API_HOME
variant order -DBAD_ORDER
"$cc" -shared good/low.o good/fab_core.o good/fab_top.o good/reg.o \
    good/high.o \
    -o good/libtiny.so || exit 1
variant exported
"$cc" -shared exported/low.o exported/fab_core.o exported/fab_top.o \
    exported/reg.o exported/high.o -o exported/libtiny.so || exit 1

failures=0
# check <name> <expected status> <expected output (grep -E)> <dir> [args]
# A failing case must report exactly one violation (HCA_SELFTEST_COUNT
# otherwise): the one it was built for, and nothing else.  The includes
# are read from the sources under HCA_SELFTEST_TREE (default: the tiny
# tree itself).
check() {
    local name=$1 want=$2 pattern=$3 dir=$4 rc out; shift 4
    local count=${HCA_SELFTEST_COUNT:-1} tree=${HCA_SELFTEST_TREE:-.}
    out=$(HCA_LAYERS=strict "$python" "$checker" --map layers.map \
          --api-header lib/api.h \
          --lib-srcdir "$tree/lib" --uct-srcdir "$tree/uct" \
          --lib-obj "$dir/low.o" --lib-obj "$dir/fab_core.o" \
          --lib-obj "$dir/fab_top.o" \
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
    '^check-layers: OK: 6 files, 3 layers, [0-9]+ references' good
check "correct includes pass" 0 \
    ', 4 headers, 6 includes checked$' good
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
check "API function defined inside a fabric fails" 1 \
    'error: fab_core\.c \(layer 1 fabric, fabric x\): hca_api_close of api\.h.s API is defined inside fabric x \(the core.s entry point dispatches to a fabric op\)$' apihome
check "a call up a file order fails" 1 \
    '^check-layers: error: fab_core\.c \(layer 1 fabric, fabric x\) -> fab_top_fn in fab_top\.c \(layer 1 fabric, fabric x\): against the order of the map.s line [0-9]+ \(a file calls only files after it\)$' order
HCA_SELFTEST_COUNT=2 \
check "unassigned source fails (and unbuilt)" 1 \
    'error: new_file\.c: no layer in the map' good \
    --lib-sources "low.c fab_core.c fab_top.c reg.c high.c new_file.c"
HCA_SELFTEST_COUNT=7 \
check "exported internals fail" 1 \
    'exports hca_internal_fn .*not in api\.h.s API$' exported \
    --lib-so exported/libtiny.so
bad_tree badinc lib/low.c '#include "top.h"'
HCA_SELFTEST_TREE=badinc \
check "upward include fails" 1 \
    '^check-layers: error: low\.c:1 \(layer 0 base\) includes top\.h \(layer 2 top\): upward include$' good
bad_tree badhdr lib/base.h '#include "top.h"'
HCA_SELFTEST_TREE=badhdr \
check "upward include from a header fails" 1 \
    'error: base\.h:1 \(layer 0 base\) includes top\.h \(layer 2 top\): upward include$' good
bad_tree badinc_uct uct/uct_ep.c '#include "base.h"'
HCA_SELFTEST_TREE=badinc_uct \
check "uct including an internal header fails" 1 \
    'error: uct_ep\.c:1 \(uct\) includes base\.h \(layer 0 base\): the UCT module may include only api\.h and its own headers$' good
bad_tree badnew lib/low.c '#include "new.h"'
: >badnew/lib/new.h
HCA_SELFTEST_TREE=badnew \
check "unmapped header fails" 1 \
    'error: new\.h: no layer in the map \(every header needs a header line\)$' good
bad_tree badmark lib/high.c '/* HCA_X_MARK: a comment may name it */ int hca_x_seen = HCA_X_MARK;'
HCA_SELFTEST_TREE=badmark \
check "a fabric's marker outside the fabric and its registry fails" 1 \
    '^check-layers: error: high\.c:1: HCA_X_MARK, the marker of fabric x: ask the message.s fabric \(hca_fabric_of_msg\) instead$' good
bad_tree okmark lib/reg.c 'int hca_x_decoded = HCA_X_MARK; /* the registry decodes it */'
HCA_SELFTEST_TREE=okmark \
check "the marker in its registry passes" 0 '^check-layers: OK' good
check "warn mode reports but passes" 0 'warning: .*upward reference' up --warn

if [ $failures -ne 0 ]; then
    echo "selftest: $failures case(s) failed"
    exit 1
fi
echo "selftest: OK: check-layers passed every case"
