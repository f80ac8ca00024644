#!/usr/bin/env python3
"""check-layers.py - the layering of libhcadev and of the UCT module, checked
on the built objects (binutils nm: who defines and who references which
symbol) and on the sources' and headers' #include lines, against the layer
map docs/layers.map (its syntax is described at its top).

Rules, each violation one line naming the file, the symbol (or header) and
both layers:
  a. an object of a lower layer references a symbol defined by an object
     of a higher layer (upward reference);
  b. an object outside a fabric references a symbol defined inside it
     that the map does not list as an entry of that fabric (or lists, but
     only for other files: the fabric registry);
  c. the UCT module references an hca_* symbol that is not a function
     declared in hca_dev.h (the public API);
  d. a source file of libhcadev (the *_SOURCES of every Makefile.am under
     src/hca_dev) or of the UCT module has no layer in the map (or was not
     built);
  e. libhcadev.so exports (dynamic symbols) exactly hca_dev.h's functions,
     and the UCT module exports nothing beyond the map's uct-export list;
  f. every header under src/hca_dev and src/uct/hca has a header line in
     the map; a file (source or header) of the library includes only
     headers of its own layer or lower (upward include), and the UCT
     module's files include only hca_dev.h and the module's own headers
     (besides UCX's and the system's, which the check does not see).
     Includes are read textually, "x.h" and <x.h> alike, and matched on
     basenames: an include that names no header of the tree is not checked.
  g. no function of hca_dev.h (the public API) is defined inside a
     fabric: an entry point of the device belongs to the core, which
     dispatches to the fabric through its ops (a caller of the API would
     otherwise reach a fabric past the registry, unseen by rule b, because
     the module's references are checked against the API only).
  h. a fabric's marker (an identifier the map names with "marker": how a
     message says which fabric carried it) appears, outside comments, only
     in that fabric's files and the files the marker line lists (the
     registry that decodes it, the wire format that defines it): nothing
     else may branch on which fabric carried a message.
  i. inside a set of files the map lists with "order" (top first: the
     files of one fabric, say), a file references symbols of files after
     it only: the set calls one way, with no circle.

Sources and headers are found recursively under src/hca_dev and
src/uct/hca, and every map pattern is a basename glob, so files may move
into subdirectories without a change here or in the map.

Exit status: 0 clean (or --warn), 1 violations, 2 usage/map/build errors.

Needs python3 (standard library only) and binutils nm; nothing else.
"""

import argparse
import fnmatch
import os
import re
import subprocess
import sys

PROG = "check-layers"

# nm's symbol types that define a symbol (global; lower-case types other
# than i/u are local, and a static function of one file does not satisfy
# another's reference).
DEFINED_TYPES = set("ABCDGIRSTVWiu")


def die(msg):
    print("%s: %s" % (PROG, msg), file=sys.stderr)
    sys.exit(2)


# ------------------------------------------------------------------ the map

class MapError(Exception):
    pass


def glob_re(pattern):
    """A basename glob (*, ?, [...]) as a compiled, anchored regex.

    fnmatch is right for basenames (they hold no "/"); a [...] class is
    passed through as in sh.
    """
    return re.compile(fnmatch.translate(pattern))


class LayerMap:
    """The statements of docs/layers.map (see its header comment)."""

    def __init__(self, path):
        self.path = path
        self.layer_names = {}       # layer number -> name
        self.layer_pats = []        # (regex, layer number), in map order
        self.header_pats = []       # (regex, layer number or "uct", line)
        self.fabric_pats = []       # (regex, fabric name)
        self.fabrics = set()
        self.entries = {}           # (fabric, symbol) -> [regex] (may be [])
        self.entry_lines = {}
        self.markers = []           # (fabric, identifier, [regex], lineno)
        self.orders = []            # ([regex], lineno): top file first
        self.uct_pats = []
        self.uct_exports = set()
        self.errors = []            # "file:line: message"

    def error(self, lineno, msg):
        self.errors.append("%s:%d: %s" % (self.path, lineno, msg))

    def statements(self):
        """(first line number, words) of every statement: comments cut,
        continuation lines joined."""
        with open(self.path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        cont, cont_line = None, 0
        for lineno, line in enumerate(lines, 1):
            line = line.split("#", 1)[0]
            if cont is not None:
                line = cont + " " + line
                lineno = cont_line
            m = re.search(r"\\[ \t]*$", line)
            if m:
                if cont is None:
                    cont_line = lineno
                cont = line[:m.start()]
                continue
            cont = None
            words = line.split()
            if words:
                yield lineno, words

    def parse(self):
        for lineno, w in self.statements():
            kind = w[0]
            if kind == "layer":
                if len(w) < 4 or not w[1].isdigit():
                    self.error(lineno, "expected: layer <n> <name> <pattern>...")
                    continue
                n = int(w[1])
                if n in self.layer_names and self.layer_names[n] != w[2]:
                    self.error(lineno, "layer %s is named %s"
                               % (w[1], self.layer_names[n]))
                    continue
                self.layer_names[n] = w[2]
                self.layer_pats += [(glob_re(p), n) for p in w[3:]]
            elif kind == "header":
                if len(w) < 3 or not (w[1].isdigit() or w[1] == "uct"):
                    self.error(lineno,
                               "expected: header <n>|uct <pattern>...")
                    continue
                level = "uct" if w[1] == "uct" else int(w[1])
                self.header_pats += [(glob_re(p), level, lineno)
                                     for p in w[2:]]
            elif kind == "fabric":
                if len(w) < 3:
                    self.error(lineno, "expected: fabric <name> <pattern>...")
                    continue
                self.fabrics.add(w[1])
                self.fabric_pats += [(glob_re(p), w[1]) for p in w[2:]]
            elif kind == "entry":
                if len(w) < 3:
                    self.error(lineno,
                               "expected: entry <fabric> <symbol> [<pattern>...]")
                    continue
                key = (w[1], w[2])
                self.entries.setdefault(key, [])
                self.entries[key] += [glob_re(p) for p in w[3:]]
                self.entry_lines[key] = lineno
            elif kind == "marker":
                if len(w) < 3:
                    self.error(lineno, "expected: marker <fabric> "
                               "<identifier> [<pattern>...]")
                    continue
                self.markers.append((w[1], w[2],
                                     [glob_re(p) for p in w[3:]], lineno))
            elif kind == "order":
                if len(w) < 3:
                    self.error(lineno, "expected: order <pattern> "
                               "<pattern>...")
                    continue
                self.orders.append(([glob_re(p) for p in w[1:]], lineno))
            elif kind == "uct":
                if len(w) < 2:
                    self.error(lineno, "expected: uct <pattern>...")
                    continue
                self.uct_pats += [glob_re(p) for p in w[1:]]
            elif kind == "uct-export":
                self.uct_exports.update(w[1:])
            else:
                self.error(lineno, 'unknown statement "%s"' % kind)
        # Checks that need the whole map: an entry may come before its
        # fabric line, a header line before its layer line.
        for (fabric, _), lineno in self.entry_lines.items():
            if fabric not in self.fabrics:
                self.error(lineno, "entry of unknown fabric " + fabric)
        for fabric, _, _, lineno in self.markers:
            if fabric not in self.fabrics:
                self.error(lineno, "marker of unknown fabric " + fabric)
        for _, level, lineno in self.header_pats:
            if level != "uct" and level not in self.layer_names:
                self.error(lineno, "header of layer %d, which no layer line "
                           "names" % level)
        if self.errors:
            raise MapError("\n".join(self.errors))

    @staticmethod
    def first(pats, name):
        for p in pats:
            if p[0].match(name):
                return p[1]
        return None

    def layer_of(self, name):
        return self.first(self.layer_pats, name)

    def header_level(self, name):
        return self.first(self.header_pats, name)

    def fabric_of(self, name):
        return self.first(self.fabric_pats, name)

    def is_uct(self, name):
        return any(r.match(name) for r in self.uct_pats)


# ------------------------------------------------- build tree and sources

def am_sources(am):
    """The .c files of every *_SOURCES variable of a Makefile.am (with its
    continuation lines), as paths relative to the Makefile.am's directory."""
    start = re.compile(r"^[ \t]*(nodist_|dist_)?[A-Za-z0-9_]+_SOURCES[ \t]*\+?=")
    out, cont = [], False
    with open(am, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not cont and not start.match(line):
                continue
            if not cont:
                line = line.split("=", 1)[1]
            cont = re.search(r"\\[ \t]*$", line) is not None
            line = re.sub(r"\\[ \t]*$", "", line)
            out += [w for w in line.split() if w.endswith(".c")]
    return out


def makefile_ams(srcdir):
    """Every Makefile.am under srcdir, the top one first: a subdirectory
    may get its own (a convenience library) when the sources move."""
    found = []
    for root, dirs, files in os.walk(srcdir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if "Makefile.am" in files:
            found.append(os.path.join(root, "Makefile.am"))
    return found


def lo_field(lo, field):
    with open(lo, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^%s='(.*)'$" % field, line.rstrip("\n"))
            if m:
                return m.group(1)
    return ""


def glob_files(d, pattern):
    """Files of directory d whose names match pattern, sorted (as sh's
    glob expands them)."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return [os.path.join(d, n) for n in sorted(names)
            if fnmatch.fnmatchcase(n, pattern)]


def find_object(builddir, src):
    """The object of source file src (relative to builddir), built by
    libtool: the PIC object its .lo names (<name>.lo, or <target>-<name>.lo
    with per-target flags); failing a .lo, a .o that looks like it."""
    d = os.path.normpath(os.path.join(builddir, os.path.dirname(src)))
    b = os.path.basename(src)[:-2]
    for lo in [os.path.join(d, b + ".lo")] + glob_files(d, "*_la-%s.lo" % b):
        if not os.path.isfile(lo):
            continue
        for field in ("pic_object", "non_pic_object"):
            o = lo_field(lo, field)
            if o and o != "none" and os.path.isfile(os.path.join(d, o)):
                return os.path.join(d, o)
    libs = os.path.join(d, ".libs")
    for o in ([os.path.join(libs, b + ".o")] + glob_files(libs, "*_la-%s.o" % b)
              + [os.path.join(d, b + ".o")] + glob_files(d, "*_la-%s.o" % b)):
        if os.path.isfile(o):
            return o
    return None


def find_so(la):
    """The shared object a libtool .la names (dlname, in .libs/)."""
    if not os.path.isfile(la):
        return None
    dl = lo_field(la, "dlname")
    so = os.path.join(os.path.dirname(la), ".libs", dl)
    return so if dl and os.path.isfile(so) else None


def obj_source(obj):
    """Source file name of an object given on the command line."""
    b = os.path.basename(obj)
    if b.endswith(".o"):
        b = b[:-2]
    return b.split("_la-", 1)[1] + ".c" if "_la-" in b else b + ".c"


class Unit:
    """The library ("lib") or the UCT module ("uct"): its source files
    (basenames, in order), their objects and, if known, their paths."""

    def __init__(self, name):
        self.name = name
        self.sources = []           # basenames, first occurrence order
        self.objects = {}           # basename -> object file
        self.paths = {}             # basename -> source file, when known
        self.srcdir = None          # scanned for headers and includes

    def add_source(self, name, path=None):
        if name not in self.sources:
            self.sources.append(name)
        if path and name not in self.paths:
            self.paths[name] = path

    def collect(self, srcdir, builddir):
        """Sources from the Makefile.am files under srcdir, objects from the
        same directories of builddir."""
        ams = makefile_ams(srcdir)
        if not ams:
            die("no %s" % os.path.join(srcdir, "Makefile.am"))
        for am in ams:
            rel = os.path.relpath(os.path.dirname(am), srcdir)
            bdir = os.path.normpath(os.path.join(builddir, rel))
            for src in am_sources(am):
                name = os.path.basename(src)
                self.add_source(name, os.path.join(os.path.dirname(am), src))
                o = find_object(bdir, src)
                if o and name not in self.objects:
                    self.objects[name] = o

    def add_objects(self, objs, sources_given):
        for o in objs:
            if not os.path.isfile(o):
                die("no object " + o)
            name = obj_source(o)
            if not sources_given:
                self.add_source(name)
            self.objects.setdefault(name, o)


# -------------------------------------------------------------------- nm

def run_nm(args, what):
    try:
        p = subprocess.run(["nm"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    except OSError:
        die("nm (binutils) not found")
    if p.returncode != 0:
        first = (p.stderr.splitlines() or [""])[0]
        die("nm %s: %s" % (what, first))
    for line in p.stdout.splitlines():
        w = line.split()
        if len(w) >= 2:
            # a versioned name (sym@VERS, sym@@VERS) is the symbol sym
            yield w[0].split("@", 1)[0], w[1]


def object_symbols(obj):
    """(defined, referenced) global symbol names of an object."""
    defined, undefined = [], []
    for name, t in run_nm(["-P", obj], obj):
        if t == "U":
            undefined.append(name)
        elif t in DEFINED_TYPES:
            defined.append(name)
    return defined, undefined


def exports(so):
    """The dynamic symbols a shared object defines."""
    if not os.path.isfile(so):
        die("no shared object " + so)
    return [n for n, t in run_nm(["-D", "-P", "--defined-only", so], so)
            if t in DEFINED_TYPES]


# ------------------------------------------------------------------- API

def strip_comments(lines):
    """The lines with /* */ and // comments replaced by a blank (a comment
    may span lines)."""
    in_comment = False
    for line in lines:
        out = ""
        while line:
            if in_comment:
                i = line.find("*/")
                if i < 0:
                    line = ""
                    break
                line = line[i + 2:]
                in_comment = False
                out += " "
                continue
            i, j = line.find("/*"), line.find("//")
            if j >= 0 and (i < 0 or j < i):
                out += line[:j]
                break
            if i < 0:
                out += line
                break
            out += line[:i] + " "
            line = line[i + 2:]
            in_comment = True
        yield out


def api_functions(header):
    """Every hca_* identifier followed by "(" in the API header, comments
    and preprocessor lines removed: not a function pointer's "(*name)(",
    not a *_t type name.  In order, once each."""
    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*[ \t]*\(")
    api = []
    with open(header, encoding="utf-8", errors="replace") as f:
        text = f.read().split("\n")
    for out in strip_comments(text):
        if re.match(r"^[ \t]*#", out):
            continue
        while True:
            m = ident.search(out)
            if not m:
                break
            name = re.sub(r"[ \t]*\($", "", m.group(0))
            pre = out[:m.start()]
            out = out[m.end():]
            if (name.startswith("hca_") and not name.endswith("_t")
                    and not re.search(r"\(\*?[ \t]*$", pre)
                    and name not in api):
                api.append(name)
    return api


# -------------------------------------------------------------- includes

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*["<]([^">]+)[">]')


def tree_files(srcdir, suffix):
    """basename -> path of the files with suffix under srcdir, recursively
    (hidden directories such as .libs and .deps skipped; the first of two
    same basenames, in sorted walk order, wins)."""
    found = {}
    for root, dirs, files in os.walk(srcdir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.endswith(suffix):
                found.setdefault(f, os.path.join(root, f))
    return found


def includes(path):
    """(line number, included basename) of every #include of a file."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if m:
                out.append((lineno, os.path.basename(m.group(1))))
    return out


# ---------------------------------------------------------------- checker

class Checker:
    def __init__(self, lmap, api, api_header, mode, verbose):
        self.map = lmap
        self.api = api
        self.api_set = set(api)
        self.header = os.path.basename(api_header)
        self.mode = mode
        self.verbose = verbose
        self.nviol = 0
        self.layer_of = {}          # (unit, file) -> layer number
        self.fabric_of = {}         # (unit, file) -> fabric name

    def violation(self, msg):
        self.nviol += 1
        print("%s: %s: %s" % (PROG, "warning" if self.mode == "warn"
                                   else "error", msg))

    def describe(self, name, level, fabric=None):
        """ "file (layer n name[, fabric f])", "(uct)" or "(no layer)"."""
        if level == "uct":
            return name + " (uct)"
        if level is None:
            return name + " (no layer)"
        return "%s (layer %d %s%s)" % (name, level, self.map.layer_names[level],
                                       ", fabric " + fabric if fabric else "")

    def where(self, key):
        unit, name = key
        if unit == "uct":
            return self.describe(name, "uct")
        return self.describe(name, self.layer_of.get(key),
                             self.fabric_of.get(key))

    # rule d
    def assign_layers(self, units):
        for unit in units:
            for name in unit.sources:
                key = (unit.name, name)
                if unit.name == "uct":
                    if not self.map.is_uct(name):
                        self.violation(name + " (uct module): no uct line of "
                                       "the map names it")
                    continue
                layer = self.map.layer_of(name)
                if layer is None:
                    self.violation(name + ": no layer in the map (every "
                                   "source of libhcadev needs one)")
                else:
                    self.layer_of[key] = layer
                fabric = self.map.fabric_of(name)
                if fabric:
                    self.fabric_of[key] = fabric

    def built_files(self, units):
        n = 0
        for unit in units:
            for name in unit.sources:
                if name not in unit.objects:
                    self.violation(name + ": not built (no object found)")
                else:
                    n += 1
                if self.verbose:
                    print("  " + self.where((unit.name, name)))
        return n

    # rules a, b, c
    def check_references(self, units):
        defs, refs = {}, []
        for unit in units:
            # every object, in the order found (an object given whose
            # source --lib-sources leaves out is read too: rule d said)
            for name, obj in unit.objects.items():
                d, u = object_symbols(obj)
                for s in d:
                    defs.setdefault((unit.name, s), (unit.name, name))
                refs += [((unit.name, name), s) for s in u]
        nchecked = 0
        for src, s in refs:
            if src[0] == "uct":
                # rule c: the module sees only the public API
                if not s.startswith("hca_"):
                    continue
                nchecked += 1
                if s in self.api_set:
                    continue
                if ("lib", s) in defs:
                    self.violation("%s -> %s in %s: not in %s's API" % (
                        self.where(src), s, self.where(defs["lib", s]),
                        self.header))
                else:
                    self.violation("%s -> %s: not in %s's API (defined "
                                   "nowhere in libhcadev)" % (
                                       self.where(src), s, self.header))
                continue
            to = defs.get((src[0], s))
            if to is None or to == src:         # libc, libnuma, ...; itself
                continue
            nchecked += 1
            if src not in self.layer_of or to not in self.layer_of:
                continue                        # rule d said
            ref = "%s -> %s in %s" % (self.where(src), s, self.where(to))
            # rule a: no upward reference
            if self.layer_of[src] < self.layer_of[to]:
                self.violation(ref + ": upward reference")
            # rule b: a fabric is entered by its entries only
            fab = self.fabric_of.get(to)
            if fab and self.fabric_of.get(src) != fab:
                if (fab, s) not in self.map.entries:
                    self.violation(ref + ": private to fabric " + fab)
                else:
                    only = self.map.entries[fab, s]
                    if only and not any(r.match(src[1]) for r in only):
                        self.violation(ref + ": entry of fabric %s for its "
                                       "registry only" % fab)
            # rule i: inside an order, downward only
            for pats, lineno in self.map.orders:
                i = next((k for k, r in enumerate(pats) if r.match(src[1])),
                         None)
                j = next((k for k, r in enumerate(pats) if r.match(to[1])),
                         None)
                if i is not None and j is not None and i >= j:
                    self.violation(ref + ": against the order of the map's "
                                   "line %d (a file calls only files after "
                                   "it)" % lineno)
        return defs, nchecked

    # rule g
    def check_api_homes(self, defs):
        for s in self.api:
            home = defs.get(("lib", s))
            if home is None or home not in self.fabric_of:
                continue                        # rule e says if missing
            self.violation("%s: %s of %s's API is defined inside fabric %s "
                           "(the core's entry point dispatches to a fabric "
                           "op)" % (self.where(home), s, self.header,
                                    self.fabric_of[home]))

    # rule h
    def check_markers(self, units):
        """Returns the number of files read."""
        if not self.map.markers:
            return 0
        files = {}
        for unit in units:
            if unit.srcdir:
                for suffix in (".c", ".h"):
                    files.update(tree_files(unit.srcdir, suffix))
        for name, path in sorted(files.items()):
            with open(path, encoding="utf-8", errors="replace") as f:
                text = list(strip_comments(f.read().split("\n")))
            for fabric, ident, allowed, _ in self.map.markers:
                if (self.map.fabric_of(name) == fabric or
                        any(r.match(name) for r in allowed)):
                    continue
                word = re.compile(r"\b%s\b" % re.escape(ident))
                for lineno, line in enumerate(text, 1):
                    if word.search(line):
                        self.violation("%s:%d: %s, the marker of fabric %s: "
                                       "ask the message's fabric "
                                       "(hca_fabric_of_msg) instead"
                                       % (name, lineno, ident, fabric))
        return len(files)

    # rule e
    def check_exports(self, lib_so, uct_so, defs):
        if lib_so:
            exported = exports(lib_so)
            for s in exported:
                if s.startswith("_") or s in self.api_set:
                    continue
                where = (" (defined in %s)" % self.where(defs["lib", s])
                         if ("lib", s) in defs else "")
                self.violation("%s: exports %s%s, not in %s's API"
                               % (lib_so, s, where, self.header))
            have = set(exported)
            for s in self.api:
                if s not in have:
                    self.violation("%s: does not export %s, declared in %s"
                                   % (lib_so, s, self.header))
        if uct_so:
            for s in exports(uct_so):
                if s.startswith("_") or s in self.map.uct_exports:
                    continue
                self.violation("%s: exports %s (not in the map's uct-export "
                               "list)" % (uct_so, s))

    # rule f
    def check_includes(self, units):
        """Returns (headers, includes checked); (0, 0) when no unit has a
        source directory to scan."""
        headers = {}                # (unit, basename) -> (path, level)
        for unit in units:
            if not unit.srcdir:
                continue
            for name, path in sorted(tree_files(unit.srcdir, ".h").items()):
                level = self.map.header_level(name)
                headers[unit.name, name] = (path, level)
                if level is None:
                    self.violation(name + ": no layer in the map (every "
                                   "header needs a header line)")
                if self.verbose:
                    print("  " + self.describe(name, level) + " header")
        if not headers:
            return 0, 0
        # the files whose includes are read: every header, every source
        files = [(name, path, level) for (_, name), (path, level)
                 in headers.items()]
        for unit in units:
            if not unit.srcdir:
                continue
            on_disk = tree_files(unit.srcdir, ".c")
            for name in unit.sources:
                # the Makefile.am's path, else the same basename anywhere
                # under the source directory (the objects were given)
                path = unit.paths.get(name)
                if not path or not os.path.isfile(path):
                    path = on_disk.get(name)
                if not path:
                    continue                    # rule d says what it can
                level = ("uct" if unit.name == "uct"
                         else self.layer_of.get((unit.name, name)))
                files.append((name, path, level))
        # A quoted include finds a header of the includer's own directory
        # first: a basename in both trees is taken from the includer's.
        by_name = {}
        for (unit, name), (_, level) in headers.items():
            by_name.setdefault(name, {})[unit] = level
        nchecked = 0
        for name, path, level in files:
            own = "uct" if level == "uct" else "lib"
            for lineno, inc in includes(path):
                if inc not in by_name:
                    continue                    # UCX's, the system's
                choices = by_name[inc]
                to = choices.get(own, next(iter(choices.values())))
                nchecked += 1
                if level is None or to is None:
                    continue                    # no layer: said above
                what = "%s includes %s" % (
                    self.describe("%s:%d" % (name, lineno), level),
                    self.describe(inc, to))
                if level == "uct":
                    if to != "uct" and inc != self.header:
                        self.violation(what + ": the UCT module may include "
                                       "only %s and its own headers"
                                       % self.header)
                elif to == "uct" or to > level:
                    self.violation(what + ": upward include")
        return len(headers), nchecked


# ------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="check-layers.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top-srcdir", metavar="DIR",
                    help="source tree (default: this script's ..)")
    ap.add_argument("--top-builddir", metavar="DIR",
                    help="build tree (default: <top-srcdir>/build)")
    ap.add_argument("--map", metavar="FILE",
                    help="layer map (default: <top-srcdir>/docs/layers.map)")
    ap.add_argument("--api-header", metavar="FILE",
                    help="public API (default: "
                    "<top-srcdir>/src/hca_dev/hca_dev.h)")
    ap.add_argument("--lib-obj", metavar="FILE", action="append", default=[],
                    help="an object of the library (repeatable); given, the "
                    "build tree is not looked at for the library: the "
                    "sources are the objects' (lib<x>_la-)<name>.c unless "
                    "--lib-sources says otherwise, rule e checks only a "
                    "--lib-so that is given and rule f only a --lib-srcdir "
                    "that is given")
    ap.add_argument("--uct-obj", metavar="FILE", action="append", default=[],
                    help="an object of the UCT module (repeatable), likewise")
    ap.add_argument("--lib-sources", metavar="LIST",
                    help="the library's source files (blank-separated)")
    ap.add_argument("--lib-so", metavar="FILE",
                    help="the shared library for rule e")
    ap.add_argument("--uct-so", metavar="FILE",
                    help="the UCT module for rule e")
    ap.add_argument("--lib-srcdir", metavar="DIR",
                    help="the library's Makefile.am, sources and headers "
                    "(default: <top-srcdir>/src/hca_dev)")
    ap.add_argument("--uct-srcdir", metavar="DIR",
                    help="the UCT module's Makefile.am, sources and headers "
                    "(default: <top-srcdir>/src/uct/hca)")
    ap.add_argument("--warn", dest="mode", action="store_const", const="warn",
                    help="report violations as warnings and exit 0 "
                    "(environment: HCA_LAYERS=warn does the same)")
    ap.add_argument("--strict", dest="mode", action="store_const",
                    const="strict", help="the default: violations fail")
    ap.add_argument("-v", dest="verbose", action="store_true",
                    help="also list every file with its layer")
    args = ap.parse_args(argv)
    if args.mode is None:
        args.mode = os.environ.get("HCA_LAYERS") or "strict"
    if args.mode not in ("strict", "warn"):
        die("HCA_LAYERS must be 'strict' or 'warn', not '%s'" % args.mode)
    return args


def main(argv):
    args = parse_args(argv)
    top = args.top_srcdir or os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    build = args.top_builddir or os.path.join(top, "build")
    map_path = args.map or os.path.join(top, "docs", "layers.map")
    api_header = args.api_header or os.path.join(top, "src", "hca_dev",
                                                 "hca_dev.h")
    if not os.access(map_path, os.R_OK):
        die("no layer map " + map_path)
    if not os.access(api_header, os.R_OK):
        die("no API header " + api_header)

    lmap = LayerMap(map_path)
    try:
        lmap.parse()
    except MapError as e:
        print(e, file=sys.stderr)
        return 2

    lib, uct = Unit("lib"), Unit("uct")
    lib_so, uct_so = args.lib_so, args.uct_so
    sources_given = args.lib_sources is not None
    if args.lib_obj:
        lib.add_objects(args.lib_obj, sources_given)
        lib.srcdir = args.lib_srcdir
    else:
        lib.srcdir = args.lib_srcdir or os.path.join(top, "src", "hca_dev")
        lib.collect(lib.srcdir, os.path.join(build, "src", "hca_dev"))
        if not lib_so:
            lib_so = find_so(os.path.join(build, "src", "hca_dev",
                                          "libhcadev.la"))
            if not lib_so:
                die("libhcadev.la not built in "
                    + os.path.join(build, "src", "hca_dev"))
    if sources_given:
        for name in args.lib_sources.split():
            lib.add_source(name)
    if args.uct_obj:
        uct.add_objects(args.uct_obj, False)
        uct.srcdir = args.uct_srcdir
    elif not args.lib_obj:
        uct.srcdir = args.uct_srcdir or os.path.join(top, "src", "uct", "hca")
        uct.collect(uct.srcdir, os.path.join(build, "src", "uct", "hca"))
        if not uct_so:
            uct_so = find_so(os.path.join(build, "src", "uct", "hca",
                                          "libuct_hca.la"))
            if not uct_so:
                die("libuct_hca.la not built in "
                    + os.path.join(build, "src", "uct", "hca"))
    for d in (lib.srcdir, uct.srcdir):
        if d and not os.path.isdir(d):
            die("no source directory " + d)

    api = api_functions(api_header)
    if not api:
        die("no hca_* function found in " + api_header)

    units = [lib, uct]
    chk = Checker(lmap, api, api_header, args.mode, args.verbose)
    chk.assign_layers(units)
    nfiles = chk.built_files(units)
    defs, nrefs = chk.check_references(units)
    chk.check_exports(lib_so, uct_so, defs)
    chk.check_api_homes(defs)
    chk.check_markers(units)
    nheaders, nincludes = chk.check_includes(units)

    if chk.nviol:
        print("%s: %d violation%s (%s, %d files, %d references)" % (
            PROG, chk.nviol, "" if chk.nviol == 1 else "s", map_path,
            nfiles, nrefs))
        return 0 if args.mode == "warn" else 1
    print("%s: OK: %d files, %d layers, %d references checked, "
          "%d API functions%s%s" % (
              PROG, nfiles, len(lmap.layer_names), nrefs, len(api),
              ", exports checked" if lib_so else "",
              ", %d headers, %d includes checked" % (nheaders, nincludes)
              if nheaders else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
