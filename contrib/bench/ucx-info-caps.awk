# ucx-info-caps.awk: the operation sizes of one device in `ucx_info -d`.
#
#   ucx_info -d -t TL | awk -v dev=DEVICE -f ucx-info-caps.awk
#
# prints one line per operation of DEVICE: "OP MIN MAX" in bytes (atomics:
# "atomic_fadd 0 8").  ucx_info (tools/info/tl_info.c, the same in UCX
# 1.13 to 1.22) prints a size limit in one of these forms:
#   unlimited          min 0, max SIZE_MAX
#   <= N               min 0
#   MIN..MAX           a minimum, e.g. get_zcopy "8K..256M"
# where a size is a number with an optional K/M/G/T/P/E suffix (powers of
# 1024), or "inf" / "auto" (SIZE_MAX, SIZE_MAX - 1).  Sizes beyond 2^62
# (tcp's put_zcopy "<= 18446744073709551590") are printed as 2^62: bash
# integers are signed 64-bit.  An operation line whose value is none of
# these prints "OP - -", so that the caller stops instead of guessing.
#
# The device's section starts at its "Device:" line and ends at the next
# "Transport:", "Device:", "Memory domain:" or "Component:" line, so that
# the next memory domain's lines (allocate, register) never count.

function bytes(s,   n, u, m) {
    if (s == "inf" || s == "auto")
        return BIG
    if (s !~ /^[0-9]+[KMGTPE]?$/)
        return ""
    n = s; u = s
    sub(/[KMGTPE]$/, "", n); sub(/^[0-9]+/, "", u)
    # index(s, "") is 1 in mawk: no suffix must be tested for first
    m = (u == "") ? 0 : index("KMGTPE", u)
    n += 0
    while (m-- > 0)
        n *= 1024
    return n > BIG ? BIG : n
}

function emit(op, lo, hi) {
    if (lo == "" || hi == "")
        print op, "-", "-"
    else
        printf "%s %.0f %.0f\n", op, lo, hi
}

BEGIN { BIG = 4611686018427387904; indev = 0 }

/^#[ \t]+(Transport|Memory domain|Component):/ { indev = 0; next }
/^#[ \t]+Device:/ { indev = ($3 == dev); next }

indev && /^#[ \t]+[a-z_0-9]+: / {
    op = $2; sub(/:$/, "", op)
    # only sizes of operations; other lines (latency, bandwidth,
    # priorities, addresses) have other forms
    if (op !~ /_(short|bcopy|zcopy)$/ && op !~ /^atomic_/)
        next
    v = $0
    sub(/^#[ \t]+[a-z_0-9]+:[ \t]+/, "", v)
    sub(/,[ \t]+up to .*$/, "", v)      # zcopy: ", up to N iov"
    if (op ~ /^atomic_/) {
        if (v ~ /^(32|64|32, 64) bit$/) print op, 0, 8
        else print op, "-", "-"
    } else if (v == "unlimited") {
        emit(op, 0, BIG)
    } else if (v ~ /^<= /) {
        emit(op, 0, bytes(substr(v, 4)))
    } else if (v ~ /^[^.]+\.\.[^.]+$/) {
        split(v, r, /\.\./)
        emit(op, bytes(r[1]), bytes(r[2]))
    } else {
        print op, "-", "-"
    }
}
