#!/bin/bash
#
# run-quick.sh BUILDDIR [PART...] - the quick tier of the tests: a few
# minutes on 2 cores, for a first check after a build and between commits.
# `make check-quick` runs it with every part, after building the programs.
#
#   hca    gtest_hca, both fabrics, sizes up to 4 KiB, the tests that take
#          seconds each left out (test/gtest: check-quick-hca)
#   uct    gtest_uct, both fabrics, the same cut (check-quick-uct)
#   apps   the MPI program p2p, quick mode, 2 ranks (test/apps: check-quick)
#
# Every part runs, whatever the earlier ones did; each part's result and
# duration are listed at the end; the exit status is 1 if any part failed.
# `make check` (and contrib/hca-setup.sh test) still runs everything.
#
set -u

if [ $# -lt 1 ] || [ ! -f "$1/Makefile" ]; then
    echo "usage: $0 BUILDDIR [hca|uct|apps]..." >&2
    exit 2
fi
builddir=$1
shift
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(hca uct apps)

results=()
failed=0
for part in "${parts[@]}"; do
    case $part in
    hca)  name="gtest_hca (shm and tcp, short sizes)"
          cmd=(make -s --no-print-directory -C "$builddir/test/gtest" check-quick-hca) ;;
    uct)  name="gtest_uct (shm and tcp, short sizes)"
          cmd=(make -s --no-print-directory -C "$builddir/test/gtest" check-quick-uct) ;;
    apps) name="MPI p2p, 2 ranks, -q"
          cmd=(make -s --no-print-directory -C "$builddir/test/apps" check-quick) ;;
    *)    echo "$0: unknown part '$part' (hca, uct, apps)" >&2
          exit 2 ;;
    esac
    echo "==== quick: $name"
    t0=$(date +%s.%N)
    "${cmd[@]}"
    rc=$?
    t=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}')
    if [ $rc -eq 0 ]; then
        results+=("$(printf '%-40s PASS  %6s s' "$name" "$t")")
    else
        results+=("$(printf '%-40s FAIL  %6s s  (exit status %d)' "$name" "$t" $rc)")
        failed=1
    fi
done

echo "==== quick tier (result, duration):"
for r in "${results[@]}"; do
    echo "  $r"
done
exit $failed
