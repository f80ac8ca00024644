#!/usr/bin/env python3
"""hca-bench-summary.py OUTDIR - tables and plots of a hca-bench.sh run.

Reads OUTDIR/{info,rows,results,machine,netpipe,skipped}.tsv written by
hca-bench.sh and the NetPIPE output files, and the matrix the run used
(OUTDIR/hca-bench.matrix, else contrib/bench/hca-bench.matrix: the levels,
table titles, NetPIPE and hca_osc_bench targets), prints one table per level
(hca figure, best built-in figure, ratio hca/built-in, target, PASS/MISS),
writes gnuplot data files and a script, and runs gnuplot for the PNG plots.
Level hosts (between two namespace hosts, hca against UCX's tcp) also
reads OUTDIR/hosts-{netpipe,osc,transports,cpu,iperf}.tsv: the CPU time
of the hosts-cpu rows (s/GB rows) and the iperf3 TCP ceiling, with each
bandwidth row as a fraction of it.
An A/B run (hca-bench.sh --ab-old-build, info.tsv has ab_old) gets the A/B
table instead (old and new build medians, noise, SLOWER flags), also
written to OUTDIR/ab.tsv.
Python 3 standard library only.
"""

import os
import re
import statistics
import subprocess
import sys
from collections import OrderedDict, defaultdict

# Filled from hca-bench.matrix by load_matrix(): the levels, titles,
# targets and rows that the runner and this summary share.
LEVEL_TITLES = OrderedDict()   # level or table -> title of its table
ORDER = []                     # machine_state points, in run order
PERFTEST_LEVELS = []           # levels whose ucx_perftest rows get a table
AB_LEVELS = []                 # levels of the A/B mode
NETPIPE_TARGETS = {}           # netpipe table -> (latency, bandwidth
                               # target, latency row: lat_small or lat_8)
CPU_ROWS = []                  # (hosts row label, label, target) hosts-cpu
# The bandwidth rows of the hosts level's tables, for their fraction of
# the iperf3 ceiling: (table, label, size, hca B/s, tcp B/s)
CEILING_ROWS = []
MIB = float(1 << 20)           # ucx_perftest's "MB/s" is MiB/s (UCS_MBYTE)
OSC_ROWS = []                  # (test, label, size, target) of hca_osc_bench


def matrix_path(outdir):
    """The matrix the run used (its copy in OUTDIR), else this tree's (an
    output directory of a runner older than the matrix)."""
    p = os.path.join(outdir, "hca-bench.matrix")
    if os.path.exists(p):
        return p
    return os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "hca-bench.matrix")


# Columns of each record type after the type (hosts: without or with the
# tcp side), checked so that a matrix of another layout (an output
# directory's copy from an older tree) fails with its line, not a traceback.
MATRIX_COLUMNS = {"level": (2,), "table": (2,), "set": (3,), "sizes": (3,),
                  "uct-builtin": (2,), "ucp-builtin": (2,), "ucp-sides": (5,),
                  "uct": (9,),
                  "ucp": (7,), "netpipe": (3,), "netpipe-target": (3, 4),
                  "hosts": (7, 10), "hosts-mpi": (2,), "osc": (4,),
                  "hosts-cpu": (3,)}


def read_matrix(path):
    """{record type: [columns]} of the matrix, with the runner's rules:
    "#" lines and blank lines skipped, a "#" after a blank ends the line,
    columns split at "|" and trimmed."""
    recs = defaultdict(list)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if re.match(r"[ \t]*(#|$)", line):
                continue
            line = re.sub(r"[ \t]+#.*$", "", line.rstrip("\n"))
            cols = [c.strip() for c in line.split("|")]
            if len(cols) - 1 not in MATRIX_COLUMNS.get(cols[0], ()):
                sys.exit("%s:%d: not a matrix record of this summary: %s" % (
                    path, n, line))
            recs[cols[0]].append(cols[1:])
    return recs


def to_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def load_matrix(outdir):
    recs = read_matrix(matrix_path(outdir))
    LEVEL_TITLES.clear()
    del ORDER[:], PERFTEST_LEVELS[:], AB_LEVELS[:], OSC_ROWS[:], CPU_ROWS[:]
    NETPIPE_TARGETS.clear()
    rowlevels = set(r[0] for r in recs["uct"] + recs["ucp"])
    for name, title in recs["level"] + recs["table"]:
        if title != "-":
            LEVEL_TITLES[name] = title.replace("\\n", "\n")
    for name, _ in recs["level"]:
        ORDER.append(name)
        # hosts has a table of its own after the netpipe one; the levels
        # without a title (sweep) are plots only
        if name in rowlevels and name != "hosts" and name in LEVEL_TITLES:
            PERFTEST_LEVELS.append(name)
    ORDER.append("end")
    for name, default, _ in recs["set"]:
        if name in ("ab_levels", "ab_levels_more"):
            AB_LEVELS.extend(default.split(","))
    for rec in recs["netpipe-target"]:
        table, lat, bw = rec[:3]
        latrow = rec[3] if len(rec) > 3 else "small"
        if latrow not in ("small", "8"):
            sys.exit("netpipe-target %s: latency row '%s' (small or 8)" % (
                table, latrow))
        NETPIPE_TARGETS[table] = (lat if lat != "-" else "",
                                  bw if bw != "-" else "",
                                  "lat_8" if latrow == "8" else "lat_small")
    for row, label, target in recs["hosts-cpu"]:
        CPU_ROWS.append((row, label, target if target != "-" else ""))
    for test, label, size, target in recs["osc"]:
        OSC_ROWS.append((test, label, to_bytes(size),
                         target if target != "-" else ""))


def read_tsv(path, ncols):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            cols = line.split("\t")
            cols += [""] * (ncols - len(cols))
            rows.append(cols[:ncols])
    return rows


def fsize(s):
    s = int(s)
    if s >= 1 << 20 and s % (1 << 20) == 0:
        return "%dM" % (s >> 20)
    if s >= 1 << 10 and s % (1 << 10) == 0:
        return "%dK" % (s >> 10)
    return str(s)


def fnum(v):
    if v is None:
        return "-"
    if v >= 1000:
        return "%.0f" % v
    if v >= 100:
        return "%.1f" % v
    if v >= 10:
        return "%.2f" % v
    return "%.3f" % v


def to_float(s):
    try:
        return float(s)
    except ValueError:
        return None


def verdict(ratio, target):
    if not target or ratio is None:
        return ""
    op, val = target[:2], float(target[2:])
    ok = ratio <= val if op == "<=" else ratio >= val
    return "PASS" if ok else "MISS"


def print_table(title, header, lines, notes):
    widths = [len(h) for h in header]
    for ln in lines:
        for i, c in enumerate(ln):
            widths[i] = max(widths[i], len(c))
    print(title)
    fmt = "  ".join("%%-%ds" % w if i < 2 else "%%%ds" % w
                    for i, w in enumerate(widths))
    print("  " + fmt % tuple(header))
    print("  " + "  ".join("-" * w for w in widths))
    for ln in lines:
        print("  " + fmt % tuple(ln))
    for n in notes:
        print("  note: " + n)
    print()


def machine_line(machine, level):
    """Cache-line ping-pong before this level and before the next one."""
    seen = [m for m in ORDER if m in machine]
    if level not in machine:
        return None
    i = seen.index(level)
    nxt = seen[i + 1] if i + 1 < len(seen) else None
    b = machine[level]
    s = "machine state: cache-line ping-pong (hca_pingpong_bench raw_shm, " \
        "one-way median) %s ns before" % b[0]
    if nxt:
        s += ", %s ns after" % machine[nxt][0]
    s += "  [hca send %s ns, rdma_write %s ns]" % (b[1], b[2])
    return s


def info_of(outdir):
    return dict((k, v) for k, v in
                read_tsv(os.path.join(outdir, "info.tsv"), 2))


def hosts_notes(outdir, info):
    notes = []
    if info.get("hosts"):
        notes.append(info["hosts"])
    if info.get("hosts_tcp_put"):
        notes.append("tcp's put_bw runs %s (ucx_info: %s)" % (
            info["hosts_tcp_put"],
            "put_zcopy" if info["hosts_tcp_put"] == "zcopy"
            else "no put_zcopy of 1 MiB"))
    return notes


def transport_notes(outdir, what):
    """The remote endpoints of the first MPI run of each set
    (UCX_LOG_LEVEL=info ep_cfg lines), from hosts-transports.tsv."""
    notes = []
    for kind, tl, w, cfg, status in read_tsv(
            os.path.join(outdir, "hosts-transports.tsv"), 5):
        if w == what:
            notes.append("UCX endpoints to the other host, %s: %s%s" % (
                tl, cfg, "" if status == "ok" else "  ** %s **" % status))
    return notes


def perftest_tables(outdir, rows, results, machine, skipped, summary,
                    levels=None):
    byrow = defaultdict(lambda: {"hca": [], "builtin": defaultdict(list),
                                 "fail": []})
    for level, row, kind, tl, rep, value, status, note in results:
        d = byrow[row]
        v = to_float(value)
        if status != "ok" or v is None:
            d["fail"].append("%s #%s: %s" % (tl, rep, note))
            continue
        if kind == "hca":
            d["hca"].append(v)
        else:
            d["builtin"][tl].append(v)

    for level in PERFTEST_LEVELS if levels is None else levels:
        lrows = [r for r in rows if r[0] == level]
        if not lrows:
            continue
        other = "tcp" if level == "hosts" else "built-in"
        header = ["test", "size", "unit", "hca", other, "(tl)", "runs",
                  "hca/" + other, "target", "result"]
        lines, notes = [], []
        for _, row, label, size, metric, target in lrows:
            d = byrow[row]
            hca = statistics.median(d["hca"]) if d["hca"] else None
            best, best_tl, nb = None, "-", 0
            for tl, vals in d["builtin"].items():
                m = statistics.median(vals)
                if best is None or (m < best if metric == "lat" else m > best):
                    best, best_tl, nb = m, tl, len(vals)
            ratio = hca / best if hca is not None and best else None
            res = verdict(ratio, target)
            if target and ratio is None:
                res = "n/a"
            if d["fail"]:
                res = (res + " FAIL").strip()
                for f in d["fail"]:
                    notes.append("%s %s: %s" % (label, fsize(size), f))
            if best is None and not d["fail"]:
                best_tl = "none"
                if level == "hosts":
                    notes.append("%s: UCX's tcp has no such operation; hca's "
                                 "absolute figure only" % label)
            lines.append([label, fsize(size),
                          "us" if metric == "lat" else "MB/s",
                          fnum(hca), fnum(best), best_tl,
                          "%d+%d" % (len(d["hca"]), nb),
                          "%.2f" % ratio if ratio is not None else "-",
                          target or "", res])
            summary.append((level, label, fsize(size), ratio, target, res))
            if level == "hosts" and metric == "bw":
                CEILING_ROWS.append((
                    "ucx_perftest", label, fsize(size),
                    hca * MIB if hca is not None else None,
                    best * MIB if best is not None else None))
        if level == "hosts":
            cl, cn = cpu_rows(outdir, lrows, summary)
            lines += cl
            notes += cn
        for lv, what, why in skipped:
            if lv == level:
                notes.append("FAIL not run: %s (%s)" % (what, why))
        ml = machine_line(machine, level)
        if ml:
            notes.insert(0, ml)
        if level == "hosts":
            notes += hosts_notes(outdir, info_of(outdir))
        print_table(LEVEL_TITLES[level] + "\n  lat = 50th percentile "
                    "latency (usec), bw = overall MB/s; medians of the runs; "
                    "'none' = no %s supports the operation" % (
                        "UCX tcp operation" if level == "hosts"
                        else "built-in transport"),
                    header, lines, notes)
    return byrow


def cpu_rows(outdir, lrows, summary):
    """The hosts-cpu rows: CPU seconds (user + sys of the ucx_perftest
    server and client, GNU time) per 10^9 B moved, per run; medians of the
    runs of each side.  The bytes moved are those host a's interface saw
    during the run (rx + tx); without them (no counters), the nominal
    payload size x (-n + -w).  (ucx_perftest ends its warm-up after 100 ms,
    so the nominal payload overstates what moved by up to w/n, and by more
    for the slower side.)  Returns the table lines and notes (and appends
    the target rows to summary)."""
    runs = defaultdict(lambda: defaultdict(list))   # row -> kind -> [run]
    tls = defaultdict(dict)
    for rec in read_tsv(os.path.join(outdir, "hosts-cpu.tsv"), 16):
        row, kind, tl, rep, status = rec[:5]
        nums = [to_float(v) for v in rec[5:]]
        size, n, w, swall, susr, ssys, cwall, cusr, csys, rx, tx = nums
        if status != "ok" or None in (size, n, w, susr, ssys, cusr, csys):
            continue
        payload = size * (n + w)
        wire = rx + tx if None not in (rx, tx) and rx + tx > 0 else None
        moved = wire or payload
        if moved <= 0:
            continue
        cpu = susr + ssys + cusr + csys
        runs[row][kind].append({
            "sgb": cpu / (moved / 1e9), "cpu": cpu, "srv": susr + ssys,
            "cli": cusr + csys, "swall": swall, "cwall": cwall,
            "moved": moved, "wire": wire,
            # the interface's bytes over the client's whole life: a lower
            # bound of the stream's rate that does not rely on
            # ucx_perftest's clock
            "floor": wire / cwall if wire and cwall else None,
            "payload": payload, "n": n, "w": w, "size": size})
        tls[row][kind] = tl
    lines, notes = [], []
    labels = dict((r[2], r) for r in lrows)
    for rowlabel, label, target in CPU_ROWS:
        if rowlabel not in labels:
            continue
        _, row, _, size, _, _ = labels[rowlabel]
        d = runs.get(row, {})
        if not d:
            if os.path.exists(os.path.join(outdir, "hosts-cpu.tsv")):
                notes.append("%s: no CPU figures (GNU time missing or every "
                             "run failed)" % label)
            continue
        med = {}
        for kind, rs in d.items():
            med[kind] = dict((k, statistics.median(r[k] for r in rs
                                                   if r[k] is not None))
                             for k in rs[0] if any(r[k] is not None
                                                   for r in rs))
            med[kind]["runs"] = len(rs)
        h, t = med.get("hca"), med.get("builtin")
        ratio = h["sgb"] / t["sgb"] if h and t and t["sgb"] else None
        res = verdict(ratio, target)
        if target and ratio is None:
            res = "n/a"
        lines.append([label, fsize(size), "s/GB",
                      fnum(h["sgb"]) if h else "-",
                      fnum(t["sgb"]) if t else "-",
                      tls[row].get("builtin", "none") if t else "none",
                      "%d+%d" % (h["runs"] if h else 0, t["runs"] if t else 0),
                      "%.2f" % ratio if ratio is not None else "-",
                      target, res])
        summary.append(("hosts", label, fsize(size), ratio, target, res))
        parts = []
        for name, m in (("hca", h), ("tcp", t)):
            if not m:
                continue
            p = "%s %.2f s (server %.2f in %.2f s wall, client %.2f in %.2f " \
                "s) for %.0f MB%s%s" % (
                    name, m["cpu"], m["srv"], m.get("swall", 0), m["cli"],
                    m.get("cwall", 0), m["moved"] / 1e6,
                    "" if m.get("wire") else " (nominal)",
                    ", >= %.2f GB/s over the client's life" % (
                        m["floor"] / 1e9) if m.get("floor") else "")
            parts.append(p)
        m = h or t
        notes.append("%s: CPU (user+sys) of server + client per run, and the "
                     "bytes host a's interface moved (nominal: %s x (%d + %d "
                     "warm-up) = %.0f MB): %s" % (
                         label, fsize(m["size"]), m["n"], m["w"],
                         m["payload"] / 1e6, "; ".join(parts)))
    if lines:
        notes.append("CPU/GB: GNU time of each ucx_perftest process (all its "
                     "threads) per 10^9 B through host a's interface (rx + "
                     "tx); both sides busy-poll, so a pinned process burns "
                     "most of its wall time: the figure follows 1/bandwidth "
                     "plus start-up")
    return lines, notes


def ceiling_table(outdir):
    """The iperf3 TCP ceiling between the hosts (hosts-iperf.tsv) and every
    bandwidth row of the hosts tables (CEILING_ROWS) as a fraction of it."""
    ok, fails = [], []
    for rec in read_tsv(os.path.join(outdir, "hosts-iperf.tsv"), 10):
        rep, status = rec[:2]
        vals = [to_float(v) for v in rec[2:9]]
        if status == "ok" and vals[0]:
            ok.append(vals)
        else:
            fails.append("iperf3 #%s: %s" % (rep, rec[9]))
    if not ok and not fails:
        return
    info = info_of(outdir)
    print("Between hosts: the kernel's ceiling, iperf3: one TCP stream from "
          "host b to host a, pinned as ucx_perftest (%s); median of the runs"
          % info.get("pinning", "?"))
    if not ok:
        print("  iperf3 TCP ceiling: none (every run failed)")
        for f in fails:
            print("  note: FAIL " + f)
        print()
        return
    bps = statistics.median(v[0] for v in ok) / 8      # B/s, receiver
    lo, hi = min(v[0] for v in ok) / 8, max(v[0] for v in ok) / 8
    print("  iperf3 TCP ceiling: %.3f GB/s (%.0f MB/s, %.0f MiB/s); runs "
          "%d, %.3f-%.3f GB/s, %s s each" % (
              bps / 1e9, bps / 1e6, bps / MIB, len(ok), lo / 1e9, hi / 1e9,
              "%.0f" % statistics.median(v[4] for v in ok)))
    retr = [v[2] for v in ok if v[2] is not None]
    cpus = [(v[5], v[6]) for v in ok if v[5] is not None and v[5] >= 0 and
            v[6] is not None and v[6] >= 0]
    if cpus:
        sc = statistics.median(c[0] for c in cpus)
        rc = statistics.median(c[1] for c in cpus)
        # CPU seconds per 10^9 B: (sender% + receiver%)/100 per second of
        # a stream moving bps
        print("  iperf3's own CPU (user+sys, its report): sender %.0f%%, "
              "receiver %.0f%% of a CPU = %.2f s/GB%s" % (
                  sc, rc, (sc + rc) / 100 / (bps / 1e9),
                  "; retransmits %s" % "/".join("%.0f" % r for r in retr)
                  if retr else ""))
    header = ["bandwidth row", "size", "hca GB/s", "hca/ceiling", "tcp GB/s",
              "tcp/ceiling"]
    lines = []
    for table, label, size, h, t in CEILING_ROWS:
        lines.append(["%s %s" % (table, label), size,
                      "%.3f" % (h / 1e9) if h else "-",
                      "%.2f" % (h / bps) if h else "-",
                      "%.3f" % (t / 1e9) if t else "-",
                      "%.2f" % (t / bps) if t else "-"])
    notes = ["GB/s = 10^9 B/s (ucx_perftest's MB/s are MiB/s, "
             "hca_osc_bench's 10^6 B/s, NetPIPE's Mbps 10^6 bit/s)"]
    notes += ["FAIL " + f for f in fails]
    print_table("  fraction of the ceiling", header, lines, notes)


def ab_spread(vals):
    """max/min - 1 of vals without the (n-1)//4 lowest and highest."""
    v = sorted(vals)
    k = (len(v) - 1) // 4
    v = v[k:len(v) - k]
    if len(v) < 2 or v[0] <= 0:
        return None
    return v[-1] / v[0] - 1


def ab_tables(outdir, info, rows, results, machine, skipped):
    """A/B mode: the old and the new hca build, per row.

    ratio = median(new) / median(old).  slower = how much slower the new
    build is, in percent (latency: new/old - 1; bandwidth: old/new - 1;
    negative = faster).  The spread of a build is max/min - 1 over its own
    runs, without its (n-1)//4 fastest and (n-1)//4 slowest runs (none up
    to 4 runs, one each for 5-8, two for 9-12): what the same binary does
    from run to run, interleaved with the other one.  (The full range
    grows with the number of runs, and more runs would then detect less.)
    noise = the larger of the two spreads, and at least one unit of
    ucx_perftest's last printed digit (0.001 us).
      SLOWER   slower > noise
      slower?  old spread < slower <= noise: beyond the old-vs-old spread
               but not the new build's own; re-run with more --reps
      faster   -slower > noise
      =        within the noise
    With both builds the same and i.i.d. runs (Monte Carlo), a row is
    SLOWER by chance about 3% of the time with 3 runs each, 7% with 5, 2%
    with 6, 1% with 7, 0.3% with 8; a 15% regression under 5% run-to-run
    noise is caught 70% of the time with 3 runs, 90% with 6.
    """

    byrow = defaultdict(lambda: {"old": {}, "new": {}, "fail": []})
    for level, row, kind, tl, rep, value, status, note in results:
        v = to_float(value)
        if kind not in ("old", "new"):
            continue
        if status != "ok" or v is None:
            byrow[row]["fail"].append("%s #%s: %s" % (kind, rep, note))
            continue
        byrow[row][kind][rep] = v
    tsv = open(os.path.join(outdir, "ab.tsv"), "w")
    tsv.write("# level\ttest\tsize\tmetric\told\tnew\tnew/old\t"
              "slower%\tspread_old%\tspread_new%\tnoise%\tpairs_slower\t"
              "verdict\n")
    allrows = []
    for level in AB_LEVELS:
        lrows = [r for r in rows if r[0] == level]
        if not lrows:
            continue
        header = ["test", "size", "unit", "old", "new", "new/old",
                  "slower", "old spread", "new spread", "noise", "pairs",
                  "runs", "verdict"]
        lines, notes = [], []
        for _, row, label, size, metric, target in lrows:
            d = byrow[row]
            olds, news = list(d["old"].values()), list(d["new"].values())
            om = statistics.median(olds) if olds else None
            nm = statistics.median(news) if news else None
            ratio = nm / om if om and nm is not None else None
            slower = None
            if ratio is not None and nm:
                slower = (ratio - 1 if metric == "lat" else 1 / ratio - 1)
            noise = None
            sp_old, sp_new = ab_spread(olds), ab_spread(news)
            if sp_old is not None and sp_new is not None:
                quantum = 0.001 / om if metric == "lat" else 0.01 / om
                noise = max(sp_old, sp_new, quantum)
            # paired (same repetition, back to back): how many pairs have
            # the new run slower
            reps = sorted(set(d["old"]) & set(d["new"]), key=int)
            nslow = sum(1 for r in reps if
                        (d["new"][r] > d["old"][r] if metric == "lat"
                         else d["new"][r] < d["old"][r]))
            res = ""
            if slower is not None and noise is not None:
                if slower > noise:
                    res = "SLOWER"
                elif slower > sp_old and slower > quantum:
                    res = "slower?"
                elif -slower > noise:
                    res = "faster"
                else:
                    res = "="
            if d["fail"]:
                res = (res + " FAIL").strip()
                for f in d["fail"]:
                    notes.append("%s %s: %s" % (label, fsize(size), f))
            lines.append([label, fsize(size),
                          "us" if metric == "lat" else "MB/s",
                          fnum(om), fnum(nm),
                          "%.3f" % ratio if ratio is not None else "-",
                          "%+.1f%%" % (100 * slower) if slower is not None
                          else "-",
                          "%.1f%%" % (100 * sp_old) if sp_old is not None
                          else "-",
                          "%.1f%%" % (100 * sp_new) if sp_new is not None
                          else "-",
                          "%.1f%%" % (100 * noise) if noise is not None
                          else "-",
                          "%d/%d" % (nslow, len(reps)),
                          "%d+%d" % (len(olds), len(news)), res])
            allrows.append((slower, noise, res))
            tsv.write("\t".join([level, label, size, metric,
                                 "%g" % om if om is not None else "-",
                                 "%g" % nm if nm is not None else "-",
                                 "%.4f" % ratio if ratio is not None else "-",
                                 "%.2f" % (100 * slower)
                                 if slower is not None else "-",
                                 "%.2f" % (100 * sp_old)
                                 if sp_old is not None else "-",
                                 "%.2f" % (100 * sp_new)
                                 if sp_new is not None else "-",
                                 "%.2f" % (100 * noise)
                                 if noise is not None else "-",
                                 "%d/%d" % (nslow, len(reps)), res]) + "\n")
        for lv, what, why in skipped:
            if lv == level:
                notes.append("FAIL not run: %s (%s)" % (what, why))
        ml = machine_line(machine, level)
        if ml:
            notes.insert(0, ml)
        print_table("%s level, A/B: old = %s, new = %s\n  lat = 50th "
                    "percentile latency (usec), bw = overall MB/s; medians "
                    "of the runs of each build" % (
                        level.upper(), info.get("ab_old_label", "?"),
                        info.get("ab_new", "?")),
                    header, lines, notes)
    tsv.close()
    ok = [(sl, no) for sl, no, _ in allrows
          if sl is not None and no is not None]
    if ok:
        print("A/B: %d rows: %d SLOWER, %d slower?, %d faster, %d within "
              "the noise; median |slower| %.1f%%, median noise %.1f%%" % (
                  len(allrows),
                  sum(1 for *_, r in allrows if r.startswith("SLOWER")),
                  sum(1 for *_, r in allrows if r.startswith("slower?")),
                  sum(1 for *_, r in allrows if r.startswith("faster")),
                  sum(1 for *_, r in allrows if r.startswith("=")),
                  100 * statistics.median(abs(sl) for sl, _ in ok),
                  100 * statistics.median(no for _, no in ok)))
        print()


def read_netpipe(path):
    pts = []
    with open(path) as f:
        for line in f:
            c = line.split()
            if len(c) >= 3:
                try:
                    pts.append((int(float(c[0])), float(c[1]), float(c[2])))
                except ValueError:
                    pass
    return pts


def netpipe_table(outdir, runs, machine, summary, level="netpipe",
                  other="builtin"):
    """NetPIPE table of one level: netpipe (hca vs the built-in shared
    memory, kind "builtin") or hosts-netpipe (hca vs tcp, kind "tcp")."""
    if not runs:
        return {}
    targets = NETPIPE_TARGETS.get(level, ("", "", "lat_small"))
    curves = defaultdict(list)          # tl -> [points of each run]
    fails = []
    for kind, tl, rep, path, status, note in runs:
        if status == "ok" and os.path.exists(path):
            pts = read_netpipe(path)
            if pts:
                curves[(kind, tl)].append(pts)
                continue
        fails.append("%s #%s: %s" % (tl, rep, note or "no output"))

    def metrics(pts):
        small = [t for s, _, t in pts if s <= 64]
        m = {
            "lat_small": statistics.median(small) * 1e6 if small else None,
            "lat_8": next((t * 1e6 for s, _, t in pts if s == 8), None),
            "bw_peak": max(b for _, b, _ in pts),
        }
        for s, b, _ in pts:
            if s in (65536, 1 << 20, 16 << 20):
                m["bw_%d" % s] = b
        return m

    per = {}
    for key, runs_pts in curves.items():
        ms = [metrics(p) for p in runs_pts]
        agg = {}
        for k in set().union(*ms):
            vals = [m[k] for m in ms if m.get(k) is not None]
            if vals:
                agg[k] = (statistics.median(vals), len(vals))
        per[key] = agg
    hk = next((k for k in per if k[0] == "hca"), None)
    bk = next((k for k in per if k[0] == other), None)
    specs = [("lat_small", "latency, 1-64 B (median)", "us", "lat",
              targets[0] if targets[2] == "lat_small" else ""),
             ("lat_8", "latency", "us", "lat",
              targets[0] if targets[2] == "lat_8" else ""),
             ("bw_65536", "bandwidth", "Mbps", "bw", ""),
             ("bw_1048576", "bandwidth", "Mbps", "bw", ""),
             ("bw_16777216", "bandwidth", "Mbps", "bw", ""),
             ("bw_peak", "peak bandwidth (max over sizes)", "Mbps", "bw",
              targets[1])]
    sizes = {"lat_small": "1-64", "lat_8": "8", "bw_65536": "64K",
             "bw_1048576": "1M", "bw_16777216": "16M", "bw_peak": "any"}
    oname = "tcp" if other == "tcp" else "built-in"
    header = ["test", "size", "unit", "hca", oname, "(tl)", "runs",
              "hca/" + oname, "target", "result"]
    lines = []
    for key, label, unit, metric, target in specs:
        h = per.get(hk, {}).get(key) if hk else None
        b = per.get(bk, {}).get(key) if bk else None
        if h is None and b is None:
            continue
        ratio = None
        if h and b and b[0]:
            ratio = h[0] / b[0]
        res = verdict(ratio, target)
        if target and ratio is None:
            res = "n/a"
        lines.append([label, sizes[key], unit,
                      fnum(h[0]) if h else "-", fnum(b[0]) if b else "-",
                      bk[1] if bk else "-",
                      "%d+%d" % (h[1] if h else 0, b[1] if b else 0),
                      "%.2f" % ratio if ratio is not None else "-",
                      target, res])
        summary.append((level if level == "netpipe" else "hosts",
                        label if level == "netpipe" else "NetPIPE " + label,
                        sizes[key], ratio, target, res))
        if level == "hosts-netpipe" and metric == "bw":
            CEILING_ROWS.append(("NetPIPE", label.split(" (")[0], sizes[key],
                                 h[0] * 1e6 / 8 if h else None,
                                 b[0] * 1e6 / 8 if b else None))
    notes = []
    ml = machine_line(machine, level)
    if ml:
        notes.append(ml)
    if level == "hosts-netpipe":
        notes += transport_notes(outdir, "netpipe")
    notes += ["FAIL " + f for f in fails]
    print_table(LEVEL_TITLES[level] + "\n  one-way time (usec) and "
                "bandwidth (Mbps) from NetPIPE's output file; medians of the "
                "runs", header, lines, notes)
    return curves


def osc_table(outdir, summary):
    """hca_osc_bench between the hosts: medians over the runs of each set,
    per test and size.  Returns {(test, kind): [(size, median)]}."""
    data = defaultdict(list)        # (test, size, kind) -> values
    fails = []
    tls = {}
    for kind, tl, rep, test, size, value, status, note in read_tsv(
            os.path.join(outdir, "hosts-osc.tsv"), 8):
        tls[kind] = tl
        v = to_float(value)
        if status != "ok" or v is None:
            fails.append("%s #%s: %s" % (tl, rep, note))
            continue
        data[(test, int(size), kind)].append(v)
    if not data and not fails:
        return {}
    header = ["test", "size", "unit", "hca", "tcp", "(tl)", "runs", "hca/tcp",
              "target", "result"]
    lines = []
    for test, label, size, target in OSC_ROWS:
        h, t = data.get((test, size, "hca")), data.get((test, size, "tcp"))
        if not h and not t:
            continue
        hm = statistics.median(h) if h else None
        tm = statistics.median(t) if t else None
        ratio = hm / tm if hm is not None and tm else None
        res = verdict(ratio, target)
        if target and ratio is None:
            res = "n/a"
        lines.append([label, fsize(size),
                      "us" if test == "fop_lat" else "MB/s",
                      fnum(hm), fnum(tm), tls.get("tcp", "-"),
                      "%d+%d" % (len(h or []), len(t or [])),
                      "%.2f" % ratio if ratio is not None else "-",
                      target, res])
        summary.append(("hosts", "osc " + label, fsize(size), ratio, target,
                        res))
        if test != "fop_lat" and size >= 1 << 16:
            CEILING_ROWS.append(("osc", label, fsize(size),
                                 hm * 1e6 if hm is not None else None,
                                 tm * 1e6 if tm is not None else None))
    notes = transport_notes(outdir, "osc")
    notes.append("UCX's tcp does MPI_Put/MPI_Get/MPI_Fetch_and_op with "
                 "active messages (rma_am, amo_am): the ratio is against osc "
                 "ucx over UCX's tcp")
    notes += ["FAIL " + f for f in fails]
    print_table(LEVEL_TITLES["hosts-osc"] + "\n  bw: window of 64 ops, then "
                "MPI_Win_flush (MB/s, 10^6 B/s); lat: one MPI_Fetch_and_op "
                "(MPI_SUM, 8 B) + MPI_Win_flush (us, median of the ops); "
                "medians of the runs", header, lines, notes)
    curves = {}
    for (test, size, kind), vals in data.items():
        if test != "fop_lat":
            curves.setdefault((test, kind), []).append(
                (size, statistics.median(vals)))
    for k in curves:
        curves[k].sort()
    return curves


def median_curve(runs_pts, col):
    bysize = defaultdict(list)
    for pts in runs_pts:
        for p in pts:
            bysize[p[0]].append(p[col])
    return [(s, statistics.median(v)) for s, v in sorted(bysize.items())]


def write_dat(path, pts):
    with open(path, "w") as f:
        for s, v in pts:
            f.write("%d %g\n" % (s, v))


def netpipe_charts(outdir, curves, prefix, what):
    charts = []
    if curves:
        lat, bw = [], []
        for (kind, tl), runs_pts in sorted(curves.items()):
            name = "%s-%s" % (prefix, kind)
            d1 = os.path.join(outdir, name + "-lat.dat")
            d2 = os.path.join(outdir, name + "-bw.dat")
            write_dat(d1, [(s, t * 1e6) for s, t in median_curve(runs_pts, 2)])
            write_dat(d2, median_curve(runs_pts, 1))
            lat.append((d1, tl))
            bw.append((d2, tl))
        charts.append(("%s-latency.png" % prefix, "NetPIPE over OpenMPI pml "
                       "ucx%s: one-way latency" % what, "usec", lat, True))
        charts.append(("%s-bandwidth.png" % prefix, "NetPIPE over OpenMPI pml "
                       "ucx%s: bandwidth" % what, "Mbps", bw, False))
    return charts


def plots(outdir, curves, results, rows, hosts_curves=None, osc_curves=None):
    """Write .dat files and plots.gp; run gnuplot."""
    charts = []   # (png, title, ylabel, [(dat, title)], logy)
    charts += netpipe_charts(outdir, curves, "netpipe", "")
    charts += netpipe_charts(outdir, hosts_curves, "hosts-netpipe",
                             " between two hosts (namespaces)")
    if osc_curves:
        lines = []
        for (test, kind), pts in sorted(osc_curves.items()):
            d = os.path.join(outdir, "hosts-osc-%s-%s.dat" % (test, kind))
            write_dat(d, pts)
            lines.append((d, "%s %s,self" % (
                {"put_bw": "MPI_Put", "get_bw": "MPI_Get"}.get(test, test),
                kind)))
        charts.append(("hosts-osc-bandwidth.png", "MPI one-sided between two "
                       "hosts (osc ucx, hca_osc_bench, window 64 + flush): "
                       "bandwidth", "MB/s", lines, True))
    # size sweeps (and the main levels' rows) by test label
    series = defaultdict(lambda: defaultdict(list))  # (label) -> tl -> pts
    info = {}
    for level, row, label, size, metric, target in rows:
        if level in ("sweep", "mid"):
            info[row] = (level, label, int(size), metric)
    for level, row, kind, tl, rep, value, status, note in results:
        if row in info and status == "ok":
            level, label, size, metric = info[row]
            series[(level, label, metric)][(kind, tl)].append(
                (size, float(value)))
    for (level, label, metric), bytl in sorted(series.items()):
        lines = []
        slug = "%s-%s" % (level, label.replace(" ", "-").replace(
            "[", "").replace("]", ""))
        for (kind, tl), pts in sorted(bytl.items()):
            by = defaultdict(list)
            for s, v in pts:
                by[s].append(v)
            med = [(s, statistics.median(v)) for s, v in sorted(by.items())]
            d = os.path.join(outdir, "%s-%s.dat" % (slug, kind))
            write_dat(d, med)
            lines.append((d, tl))
        what = "UCP" if label.startswith(("tag_", "ucp_")) else \
            "UCT, default iface ALLOC (hca: device memory)"
        if metric == "lat":
            charts.append(("%s.png" % slug, "ucx_perftest %s [%s]: "
                           "latency (50th percentile)" % (label, what),
                           "usec", lines, True))
        else:
            charts.append(("%s.png" % slug, "ucx_perftest %s [%s]: "
                           "bandwidth (overall)" % (label, what), "MB/s",
                           lines, False))
    if not charts:
        return []
    gp = os.path.join(outdir, "plots.gp")
    with open(gp, "w") as f:
        f.write("# generated by hca-bench-summary.py; run: gnuplot plots.gp\n")
        f.write("set terminal pngcairo size 900,600 noenhanced\n")
        f.write("set logscale x 2\nset format x '%.0b%B'\n")
        f.write("set xlabel 'message size (bytes)'\nset grid\n")
        f.write("set key left top\n")
        for png, title, ylabel, lines, logy in charts:
            f.write("set output '%s'\n" % os.path.join(outdir, png))
            f.write("set title '%s'\nset ylabel '%s'\n" % (title, ylabel))
            f.write("%s\n" % ("set logscale y" if logy else "unset logscale y"))
            f.write("plot " + ", \\\n     ".join(
                "'%s' using 1:2 with linespoints title '%s'" % (d, t)
                for d, t in lines) + "\n")
        f.write("unset output\n")
    try:
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode != 0:
            print("gnuplot failed: " + r.stderr.strip(), file=sys.stderr)
            return []
    except FileNotFoundError:
        print("gnuplot not found: plots not drawn (data in %s)" % outdir,
              file=sys.stderr)
        return []
    return [os.path.join(outdir, c[0]) for c in charts]


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    load_matrix(outdir)
    info = dict((k, v) for k, v in read_tsv(os.path.join(outdir, "info.tsv"), 2))
    rows = read_tsv(os.path.join(outdir, "rows.tsv"), 6)
    results = read_tsv(os.path.join(outdir, "results.tsv"), 8)
    machine = OrderedDict((r[0], r[1:]) for r in
                          read_tsv(os.path.join(outdir, "machine.tsv"), 4))
    skipped = read_tsv(os.path.join(outdir, "skipped.tsv"), 3)
    np_runs = read_tsv(os.path.join(outdir, "netpipe.tsv"), 6)

    print("hca benchmark, %s, %s run, UCX %s; %s" % (
        info.get("date", "?"), info.get("mode", "?"), info.get("ucx", "?"),
        info.get("host", "?")))
    if "ab_old" in info:
        return ab_main(outdir, info, rows, results, machine, skipped)
    hosts = any(r[0] == "hosts" for r in rows) or os.path.exists(
        os.path.join(outdir, "hosts-osc.tsv")) and os.path.getsize(
        os.path.join(outdir, "hosts-osc.tsv")) > 0
    print("load average at start: %s; ratio = hca / best built-in%s "
          "(latency: lower is better, target <= ; bandwidth: higher is "
          "better, target >=)" % (info.get("loadavg", "?"),
                                  " (hosts: hca / tcp)" if hosts else ""))
    if info.get("pinning"):
        print("pinning: %s" % info["pinning"])
    print("these machines are noisy: compare ratios of interleaved runs, "
          "absolute times are only indicative\n")
    summary = []
    perftest_tables(outdir, rows, results, machine, skipped, summary)
    curves = netpipe_table(outdir, np_runs, machine, summary)
    perftest_tables(outdir, rows, results, machine, skipped, summary,
                    levels=("hosts",))
    hosts_np = read_tsv(os.path.join(outdir, "hosts-netpipe.tsv"), 6)
    hosts_curves = netpipe_table(outdir, hosts_np, machine, summary,
                                 level="hosts-netpipe", other="tcp")
    osc_curves = osc_table(outdir, summary)
    ceiling_table(outdir)
    for lv, what, why in skipped:
        if lv == "hosts" and what == "all rows":
            print("Between hosts: %s\n" % why)
    pngs = plots(outdir, curves, results, rows, hosts_curves, osc_curves)

    targets = [s for s in summary if s[4]]
    if targets:
        print("Target rows")
        lw = max([32] + [len(t[1]) for t in targets])
        for level, label, size, ratio, target, res in targets:
            print("  %-9s %-7s %-*s %5s  ratio %-5s  target %s" % (
                res or "n/a", level, lw, label, size,
                "%.2f" % ratio if ratio is not None else "-", target))
        npass = sum(1 for s in targets if s[5] == "PASS")
        print("  %d of %d target rows PASS (informational)\n" % (
            npass, len(targets)))
    not_run_lines(skipped)
    if "end" in machine:
        print("machine state at the end: cache-line ping-pong raw_shm %s ns"
              % machine["end"][0])
    if pngs:
        print("plots: " + ", ".join(os.path.basename(p) for p in pngs))
    if "elapsed" in info:
        print("elapsed: %s s, failed runs: %s" % (
            info["elapsed"], info.get("failed_runs", "?")))
    return 0


def not_run_lines(skipped):
    """The rows the matrix lists that did not run, at the end, where a
    reader of the log looks: each one a FAIL (hca-bench.sh counts them as
    failed runs and exits non-zero)."""
    if not skipped:
        return
    print("Rows not run (FAIL)")
    for lv, what, why in skipped:
        print("  FAIL %-7s %s: %s" % (lv, what, why))
    print()


def ab_main(outdir, info, rows, results, machine, skipped):
    print("A/B run: old = %s (%s)" % (info.get("ab_old_label", "?"),
                                      info.get("ab_old", "?")))
    print("         new = %s" % info.get("ab_new", "?"))
    print("load average at start: %s; %s runs of each build per row, "
          "back to back, order alternating (ABBA)" % (
              info.get("loadavg", "?"), info.get("reps", "?")))
    if info.get("pinning"):
        print("pinning: %s" % info["pinning"])
    for side in ("old", "new"):
        if info.get("ab_loads_" + side):
            print("%s side loads (LD_DEBUG=libs): %s" % (
                side, info["ab_loads_" + side]))
    print("slower = how much slower new is than old (latency new/old - 1, "
          "bandwidth old/new - 1; negative: faster)")
    print("spread = max/min - 1 of a build's own runs (from 5 runs on, "
          "without the (n-1)/4 fastest and slowest)")
    print("noise = the larger spread of the two builds (at least 0.001 us)")
    print("SLOWER = slower > noise; slower? = slower > the old spread only "
          "(re-run with more --reps); faster = -slower > noise")
    print("pairs = repetitions where the new run was slower than the old "
          "run next to it\n")
    ab_tables(outdir, info, rows, results, machine, skipped)
    not_run_lines(skipped)
    if "end" in machine:
        print("machine state at the end: cache-line ping-pong raw_shm %s ns"
              % machine["end"][0])
    if "elapsed" in info:
        print("elapsed: %s s, failed runs: %s" % (
            info["elapsed"], info.get("failed_runs", "?")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
