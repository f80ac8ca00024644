# netns.sh - the multi-host tests' namespaces: contrib/hca-netns.sh (sourced).
# shellcheck shell=bash source=../../contrib/hca-netns.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../../contrib" && pwd)/hca-netns.sh"
