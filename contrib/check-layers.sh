#!/bin/bash
#
# check-layers.sh - the layering of libhcadev and of the UCT module, checked
# on the built objects (binutils nm: who defines and who references which
# symbol), against the layer map docs/layers.map (its syntax is described
# at its top).
#
# Rules, each violation one line naming the file, the symbol and both layers:
#   a. an object of a lower layer references a symbol defined by an object
#      of a higher layer (upward reference);
#   b. an object outside a fabric references a symbol defined inside it
#      that the map does not list as an entry of that fabric (or lists, but
#      only for other files: the fabric registry);
#   c. the UCT module references an hca_* symbol that is not a function
#      declared in hca_dev.h (the public API);
#   d. a source file of libhcadev (src/hca_dev/Makefile.am's SOURCES) or of
#      the UCT module has no layer in the map (or was not built);
#   e. libhcadev.so exports (dynamic symbols) exactly hca_dev.h's functions,
#      and the UCT module exports nothing beyond the map's uct-export list.
#
# usage: contrib/check-layers.sh [options]
#   --top-srcdir DIR    source tree (default: this script's ..)
#   --top-builddir DIR  build tree (default: <top-srcdir>/build)
#   --map FILE          layer map (default: <top-srcdir>/docs/layers.map)
#   --api-header FILE   public API (default: <top-srcdir>/src/hca_dev/hca_dev.h)
#   --lib-obj FILE      an object of the library (repeatable); given, the
#                       build tree is not looked at for the library: the
#                       sources are the objects' (lib<x>_la-)<name>.c
#                       unless --lib-sources says otherwise, and rule e
#                       checks only a --lib-so that is given
#   --uct-obj FILE      an object of the UCT module (repeatable), likewise
#   --lib-sources LIST  the library's source files (blank-separated)
#   --lib-so FILE       the shared library for rule e
#   --uct-so FILE       the UCT module for rule e
#   --warn              report violations as warnings and exit 0
#                       (environment: HCA_LAYERS=warn does the same)
#   -v                  also list every file with its layer
#
# Exit status: 0 clean (or --warn), 1 violations, 2 usage/map/build errors.
#
# Needs bash, a POSIX awk (mawk is fine) and binutils nm; nothing else.
#
set -u

prog=check-layers
die() { echo "$prog: $*" >&2; exit 2; }

top_srcdir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
top_builddir=
map=
api_header=
lib_objs=()
uct_objs=()
lib_sources=
lib_sources_set=no
lib_so=
uct_so=
mode=${HCA_LAYERS:-strict}
verbose=0

while [ $# -gt 0 ]; do
    case $1 in
    --top-srcdir)   top_srcdir=${2:?}; shift ;;
    --top-builddir) top_builddir=${2:?}; shift ;;
    --map)          map=${2:?}; shift ;;
    --api-header)   api_header=${2:?}; shift ;;
    --lib-obj)      lib_objs+=("${2:?}"); shift ;;
    --uct-obj)      uct_objs+=("${2:?}"); shift ;;
    --lib-sources)  lib_sources=${2?}; lib_sources_set=yes; shift ;;
    --lib-so)       lib_so=${2:?}; shift ;;
    --uct-so)       uct_so=${2:?}; shift ;;
    --warn)         mode=warn ;;
    --strict)       mode=strict ;;
    -v)             verbose=1 ;;
    -h|--help)      sed -n '2,/^# Needs/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
                    exit 0 ;;
    *)              die "unknown argument '$1' (--help)" ;;
    esac
    shift
done
case $mode in
strict|warn) ;;
*) die "HCA_LAYERS must be 'strict' or 'warn', not '$mode'" ;;
esac

: "${top_builddir:=$top_srcdir/build}"
: "${map:=$top_srcdir/docs/layers.map}"
: "${api_header:=$top_srcdir/src/hca_dev/hca_dev.h}"
[ -r "$map" ] || die "no layer map $map"
[ -r "$api_header" ] || die "no API header $api_header"
command -v nm >/dev/null 2>&1 || die "nm (binutils) not found"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-layers.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$tmp"' EXIT

# The .c files of every *_SOURCES variable of a Makefile.am (with its
# continuation lines), as paths relative to the Makefile.am's directory.
am_sources() {
    awk '
        cont || /^[ \t]*(nodist_|dist_)?[A-Za-z0-9_]+_SOURCES[ \t]*\+?=/ {
            line = $0
            if (!cont) sub(/^[^=]*=/, "", line)
            cont = (line ~ /\\[ \t]*$/)
            sub(/\\[ \t]*$/, "", line)
            n = split(line, w, /[ \t]+/)
            for (i = 1; i <= n; i++)
                if (w[i] ~ /\.c$/) print w[i]
        }' "$1"
}

# The object of source file src (relative to dir), built by libtool: the
# PIC object its .lo names (<name>.lo, or <target>-<name>.lo with per-target
# flags); failing a .lo, a .o that looks like it.
find_object() {
    local dir=$1 src=$2 d b lo o pic nonpic
    d=$(dirname "$src"); b=$(basename "$src" .c)
    [ "$d" = . ] && d=$dir || d=$dir/$d
    for lo in "$d/$b.lo" "$d"/*_la-"$b.lo"; do
        [ -f "$lo" ] || continue
        pic=$(sed -n "s/^pic_object='\(.*\)'$/\1/p" "$lo")
        nonpic=$(sed -n "s/^non_pic_object='\(.*\)'$/\1/p" "$lo")
        for o in "$pic" "$nonpic"; do
            [ -n "$o" ] && [ "$o" != none ] && [ -f "$d/$o" ] &&
                { echo "$d/$o"; return 0; }
        done
    done
    for o in "$d/.libs/$b.o" "$d"/.libs/*_la-"$b.o" "$d/$b.o" \
             "$d"/*_la-"$b.o"; do
        [ -f "$o" ] && { echo "$o"; return 0; }
    done
    return 1
}

# The shared object a libtool .la names (dlname, in .libs/).
find_so() {
    local la=$1 dl
    [ -f "$la" ] || return 1
    dl=$(sed -n "s/^dlname='\(.*\)'$/\1/p" "$la")
    [ -n "$dl" ] && [ -f "$(dirname "$la")/.libs/$dl" ] &&
        echo "$(dirname "$la")/.libs/$dl"
}

# Source file name of an object given on the command line.
obj_source() {
    local b
    b=$(basename "$1" .o)
    echo "${b#*_la-}.c"
}

# "SRC <unit> <file>" and "OBJ <unit> <file> <object>" records; an object
# that is not there is reported by the awk program (rule d).
: >"$tmp/units"
collect_unit() {
    local unit=$1 dir=$2 am=$3 src o
    [ -r "$am" ] || die "no $am"
    for src in $(am_sources "$am"); do
        echo "SRC $unit $(basename "$src")"
        o=$(find_object "$dir" "$src") &&
            echo "OBJ $unit $(basename "$src") $o"
    done >>"$tmp/units"
}

if [ ${#lib_objs[@]} -gt 0 ]; then
    for o in "${lib_objs[@]}"; do
        [ -f "$o" ] || die "no object $o"
        [ $lib_sources_set = yes ] || echo "SRC lib $(obj_source "$o")"
        echo "OBJ lib $(obj_source "$o") $o"
    done >>"$tmp/units"
else
    collect_unit lib "$top_builddir/src/hca_dev" \
        "$top_srcdir/src/hca_dev/Makefile.am"
    [ -n "$lib_so" ] ||
        lib_so=$(find_so "$top_builddir/src/hca_dev/libhcadev.la") ||
        die "libhcadev.la not built in $top_builddir/src/hca_dev"
fi
if [ $lib_sources_set = yes ]; then
    for src in $lib_sources; do echo "SRC lib $src"; done >>"$tmp/units"
fi
if [ ${#uct_objs[@]} -gt 0 ]; then
    for o in "${uct_objs[@]}"; do
        [ -f "$o" ] || die "no object $o"
        echo "SRC uct $(obj_source "$o")"
        echo "OBJ uct $(obj_source "$o") $o"
    done >>"$tmp/units"
elif [ ${#lib_objs[@]} -eq 0 ]; then
    collect_unit uct "$top_builddir/src/uct/hca" \
        "$top_srcdir/src/uct/hca/Makefile.am"
    [ -n "$uct_so" ] ||
        uct_so=$(find_so "$top_builddir/src/uct/hca/libuct_hca.la") ||
        die "libuct_hca.la not built in $top_builddir/src/uct/hca"
fi

# Symbols: "SYM <unit> <file> D|U <name>".  Global definitions only (a
# static function of one file does not satisfy another's reference).
while read -r tag unit file obj; do
    [ "$tag" = OBJ ] || continue
    nm -P "$obj" >"$tmp/nm" 2>"$tmp/nm.err" ||
        die "nm $obj: $(head -1 "$tmp/nm.err")"
    awk -v u="$unit" -v f="$file" '
        { name = $1; sub(/@.*/, "", name) }
        $2 == "U" { print "SYM", u, f, "U", name; next }
        $2 ~ /^[ABCDGIRSTVWiu]$/ { print "SYM", u, f, "D", name }
    ' "$tmp/nm"
done <"$tmp/units" >"$tmp/syms"

# Dynamic exports: "EXP <unit> <name>".
exports() {
    local unit=$1 so=$2
    [ -n "$so" ] || return 0
    [ -f "$so" ] || die "no shared object $so"
    echo "SO $unit $so"
    nm -D -P --defined-only "$so" | awk -v u="$unit" '
        { name = $1; sub(/@.*/, "", name) }
        $2 ~ /^[ABCDGIRSTVWiu]$/ { print "EXP", u, name }'
}
{ exports lib "$lib_so"; exports uct "$uct_so"; } >"$tmp/exports" || exit 2

# The API: every hca_* identifier followed by "(" in hca_dev.h, comments
# and preprocessor lines removed (not a function pointer's "(*name)(", not
# a *_t type name).
awk '
    {
        line = $0; out = ""
        while (line != "") {
            if (incomment) {
                i = index(line, "*/")
                if (i == 0) { line = ""; break }
                line = substr(line, i + 2); incomment = 0
                out = out " "
                continue
            }
            i = index(line, "/*"); j = index(line, "//")
            if (j > 0 && (i == 0 || j < i)) {
                out = out substr(line, 1, j - 1); break
            }
            if (i == 0) { out = out line; break }
            out = out substr(line, 1, i - 1) " "
            line = substr(line, i + 2); incomment = 1
        }
        if (out ~ /^[ \t]*#/) next
        while (match(out, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
            name = substr(out, RSTART, RLENGTH); sub(/[ \t]*\($/, "", name)
            pre = substr(out, 1, RSTART - 1)
            out = substr(out, RSTART + RLENGTH)
            if (name ~ /^hca_/ && name !~ /_t$/ && pre !~ /\(\*?[ \t]*$/)
                print "API", name
        }
    }' "$api_header" >"$tmp/api"
[ -s "$tmp/api" ] || die "no hca_* function found in $api_header"

awk '{ print "MAP", NR, $0 }' "$map" >"$tmp/map"

cat "$tmp/map" "$tmp/api" "$tmp/units" "$tmp/syms" "$tmp/exports" |
awk -v mode="$mode" -v verbose="$verbose" -v mapfile="$map" \
    -v header="$(basename "$api_header")" '
function maperr(msg) {
    printf "%s:%d: %s\n", mapfile, mapline, msg > "/dev/stderr"
    bad_map = 1
}
# A basename glob (*, ?, [...]) as an anchored regular expression.
function glob2re(g,    re, c, i) {
    re = "^"
    for (i = 1; i <= length(g); i++) {
        c = substr(g, i, 1)
        if (c == "*") re = re "[^/]*"
        else if (c == "?") re = re "[^/]"
        else if (c == "[") re = re "["
        else if (c == "]") re = re "]"
        else if (c ~ /[.+^$(){}|\\]/) re = re "\\" c
        else re = re c
    }
    return re "$"
}
function violation(msg) {
    nviol++
    print "check-layers: " (mode == "warn" ? "warning" : "error") ": " msg
}
function where(key,    f) {
    f = substr(key, index(key, ":") + 1)
    if (key ~ /^uct:/) return f " (uct)"
    if (!(key in layer_of)) return f " (no layer)"
    return f " (layer " layer_of[key] " " lname[layer_of[key]] \
        (fabric_of[key] != "" ? ", fabric " fabric_of[key] : "") ")"
}

# ---------------------------------------------------------------- the map
$1 == "MAP" {
    mapline = $2
    line = $0; sub(/^MAP [0-9]+ ?/, "", line); sub(/#.*/, "", line)
    if (cont != "") { line = cont " " line; mapline = contline }
    if (line ~ /\\[ \t]*$/) {
        sub(/\\[ \t]*$/, "", line)
        if (cont == "") contline = mapline
        cont = line; next
    }
    cont = ""
    n = split(line, w, /[ \t]+/)
    # split() with a leading blank gives an empty first field
    k = 0
    for (i = 1; i <= n; i++) if (w[i] != "") v[++k] = w[i]
    if (k == 0) next
    if (v[1] == "layer") {
        if (k < 4 || v[2] !~ /^[0-9]+$/)
            { maperr("expected: layer <n> <name> <pattern>..."); next }
        if ((v[2] in lname) && lname[v[2]] != v[3])
            { maperr("layer " v[2] " is named " lname[v[2]]); next }
        lname[v[2]] = v[3]
        for (i = 4; i <= k; i++) {
            npat++; pat_re[npat] = glob2re(v[i]); pat_layer[npat] = v[2]
        }
    } else if (v[1] == "fabric") {
        if (k < 3) { maperr("expected: fabric <name> <pattern>..."); next }
        isfabric[v[2]] = 1
        for (i = 3; i <= k; i++) {
            nfpat++; fpat_re[nfpat] = glob2re(v[i]); fpat_name[nfpat] = v[2]
        }
    } else if (v[1] == "entry") {
        if (k < 3) { maperr("expected: entry <fabric> <symbol> [<pattern>...]"); next }
        entry[v[2], v[3]] = 1
        for (i = 4; i <= k; i++) entry_re[v[2], v[3]] = entry_re[v[2], v[3]] \
            (entry_re[v[2], v[3]] == "" ? "" : "|") "(" glob2re(v[i]) ")"
        entry_line[v[2], v[3]] = mapline
    } else if (v[1] == "uct") {
        if (k < 2) { maperr("expected: uct <pattern>..."); next }
        for (i = 2; i <= k; i++) uct_re = uct_re (uct_re == "" ? "" : "|") \
            "(" glob2re(v[i]) ")"
    } else if (v[1] == "uct-export") {
        for (i = 2; i <= k; i++) uct_export[v[i]] = 1
    } else {
        maperr("unknown statement \"" v[1] "\"")
    }
    next
}

$1 == "API" { if (!($2 in api)) { api[$2] = 1; api_list[++napi] = $2 }; next }

# ------------------------------------------------------- sources (rule d)
$1 == "SRC" {
    key = $2 ":" $3
    if (key in seen_src) next
    seen_src[key] = 1
    nsrc++; src[nsrc] = key
    if ($2 == "uct") {
        if (uct_re == "" || $3 !~ uct_re)
            violation($3 " (uct module): no uct line of the map names it")
        next
    }
    for (i = 1; i <= npat; i++)
        if ($3 ~ pat_re[i]) { layer_of[key] = pat_layer[i]; break }
    if (!(key in layer_of))
        violation($3 ": no layer in the map (every source of libhcadev needs one)")
    for (i = 1; i <= nfpat; i++)
        if ($3 ~ fpat_re[i]) { fabric_of[key] = fpat_name[i]; break }
    next
}
$1 == "OBJ" { built[$2 ":" $3] = 1; next }

$1 == "SYM" {
    key = $2 ":" $3
    if ($4 == "D") {
        if (!(($2, $5) in def)) def[$2, $5] = key
    } else {
        nref++; ref_from[nref] = key; ref_sym[nref] = $5
    }
    next
}
$1 == "SO"  { so[$2] = $3; next }
$1 == "EXP" { exported[$2, $3] = 1; exp_unit[++nexp] = $2; exp_name[nexp] = $3; next }

END {
    if (bad_map) exit 2
    for (e in entry) {
        split(e, p, SUBSEP)
        if (!(p[1] in isfabric)) {
            mapline = entry_line[e]; maperr("entry of unknown fabric " p[1])
        }
    }
    if (bad_map) exit 2
    nfiles = 0
    for (i = 1; i <= nsrc; i++) {
        key = src[i]; f = substr(key, index(key, ":") + 1)
        if (!(key in built))
            violation(f ": not built (no object found)")
        else
            nfiles++
        if (verbose) print "  " where(key)
    }
    nchecked = 0
    for (r = 1; r <= nref; r++) {
        from = ref_from[r]; s = ref_sym[r]
        unit = substr(from, 1, index(from, ":") - 1)
        f = substr(from, index(from, ":") + 1)
        if (unit == "uct") {
            # rule c: the module sees only the public API
            if (s !~ /^hca_/) continue
            nchecked++
            if (s in api) continue
            if (("lib", s) in def)
                violation(where(from) " -> " s " in " where(def["lib", s]) \
                    ": not in " header "'"'"'s API")
            else
                violation(where(from) " -> " s \
                    ": not in " header "'"'"'s API (defined nowhere in libhcadev)")
            continue
        }
        if (!((unit, s) in def)) continue       # libc, libnuma, ...
        to = def[unit, s]
        if (to == from) continue
        nchecked++
        if (!(from in layer_of) || !(to in layer_of)) continue  # rule d said
        # rule a: no upward reference
        if (layer_of[from] + 0 < layer_of[to] + 0)
            violation(where(from) " -> " s " in " where(to) ": upward reference")
        # rule b: a fabric is entered by its entries only
        fab = fabric_of[to]
        if (fab != "" && fabric_of[from] != fab) {
            if (!((fab, s) in entry))
                violation(where(from) " -> " s " in " where(to) \
                    ": private to fabric " fab)
            else if (entry_re[fab, s] != "" && f !~ entry_re[fab, s])
                violation(where(from) " -> " s " in " where(to) \
                    ": entry of fabric " fab " for its registry only")
        }
    }
    # rule e: exported dynamic symbols
    if ("lib" in so) {
        for (i = 1; i <= nexp; i++) {
            s = exp_name[i]
            if (exp_unit[i] != "lib" || s ~ /^_/ || (s in api)) continue
            violation(so["lib"] ": exports " s \
                (("lib", s) in def ? " (defined in " where(def["lib", s]) ")" : "") \
                ", not in " header "'"'"'s API")
        }
        for (i = 1; i <= napi; i++) {
            s = api_list[i]
            if (!(("lib", s) in exported))
                violation(so["lib"] ": does not export " s \
                    ", declared in " header)
        }
    }
    if ("uct" in so) {
        for (i = 1; i <= nexp; i++) {
            s = exp_name[i]
            if (exp_unit[i] != "uct" || s ~ /^_/ || (s in uct_export)) continue
            violation(so["uct"] ": exports " s \
                " (not in the map'"'"'s uct-export list)")
        }
    }
    nlayers = 0
    for (l in lname) nlayers++
    if (nviol) {
        printf "check-layers: %d violation%s (%s, %d files, %d references)\n", \
            nviol, nviol == 1 ? "" : "s", mapfile, nfiles, nchecked
        exit (mode == "warn" ? 0 : 1)
    }
    printf "check-layers: OK: %d files, %d layers, %d references checked, " \
        "%d API functions%s\n", nfiles, nlayers, nchecked, napi, \
        ("lib" in so) ? ", exports checked" : ""
}'
