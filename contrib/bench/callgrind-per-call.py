#!/usr/bin/env python3
"""callgrind-per-call.py OUT FUNCTION... - calls and inclusive instructions
per call of each function whose name contains FUNCTION, from a callgrind
output file (summed over every call site).  Used for docs/PERF.md."""
import re
import sys


def per_call(path, pattern):
    names, cfn, calls, incl, want = {}, None, 0, 0, False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                if m.group(1) == "cfn":
                    cfn = names.get(m.group(2), "")
                continue
            if line.startswith("calls="):
                want = bool(cfn) and pattern in cfn
                if want:
                    calls += int(line.split("=")[1].split()[0])
                continue
            if want:
                parts = line.split()
                if len(parts) >= 2:
                    incl += int(parts[1])
                want = False
    return calls, incl


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for pattern in sys.argv[2:]:
        calls, incl = per_call(sys.argv[1], pattern)
        print("%-32s calls %9d  instructions/call %7.1f"
              % (pattern, calls, incl / calls if calls else 0.0))


if __name__ == "__main__":
    main()
