#!/bin/bash
#
# run-gtest.sh BINARY [ARGS...] - run a googletest binary with its output on
# the terminal, and exit with its status.
#
#   GTEST_FILTER        test filter (read by googletest itself)
#   HCA_GTEST_TIMEOUT   seconds before the run is killed (default 1800)
#   HCA_GTEST_RUNNER    command prefix, e.g. libtool --mode=execute valgrind
#
set -u

bin=$1
shift
timeout=${HCA_GTEST_TIMEOUT:-1800}
runner=${HCA_GTEST_RUNNER:-}

echo "run-gtest: ${runner:+$runner }$bin $*${GTEST_FILTER:+ (GTEST_FILTER=$GTEST_FILTER)}"
# shellcheck disable=SC2086  # the runner is a list of words
timeout -k 30 "$timeout" $runner "$bin" "$@"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "run-gtest: $bin killed after ${timeout}s (timeout)"
elif [ $rc -ne 0 ]; then
    echo "run-gtest: $bin failed (exit status $rc)"
fi
exit $rc
