#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

    ncu --warp-sampling-interval 0 -k regex:kvUnitCheck -s 3 -c 1 --section SourceCounters \
        -o rep ./gpu.test -test.run '^$' -test.bench 'CUDACheckSteps/batch=12MiB/...' -test.benchtime 5x
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    tools/perf/ncu_sass.py sass.csv [MIN_PERCENT]

Prints the total of the warp-state samples, then every SASS instruction holding at least
MIN_PERCENT (default 1) of them with its three largest stall reasons, and the samples of each
opcode (the first word of the instruction, predicates dropped). The samples are of warps, so
an instruction's share is its share of the warps' time, not of the kernel's: many warps
waiting at a barrier weigh more than the one warp they wait for.
"""

import collections
import csv
import sys


def main():
    path = sys.argv[1]
    floor = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The first row names the kernel; the second holds the column names.
    head = rows[1]
    data = rows[2:]
    samples = head.index("Warp Stall Sampling (All Samples)")
    executed = head.index("Instructions Executed")
    source = head.index("Source")
    stalls = [(j, h[len("stall_") :]) for j, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]

    def num(s):
        return int(s) if s.strip() else 0

    total = sum(num(r[samples]) for r in data)
    print(f"{rows[0][1] if len(rows[0]) > 1 else rows[0][0]}: {total} samples, {len(data)} instructions")
    print(f"{'#':>5} {'samples':>8} {'%':>6} {'executed':>9}  instruction / largest stall reasons")
    by_op = collections.Counter()
    for i, r in enumerate(data):
        s = num(r[samples])
        text = r[source].strip()
        words = [w for w in text.split() if not w.startswith("@")]
        if words:
            by_op[words[0].split(".")[0]] += s
        if total and 100 * s / total >= floor:
            top = sorted(((num(r[j]), name) for j, name in stalls), reverse=True)[:3]
            why = ", ".join(f"{name} {n}" for n, name in top if n)
            print(f"{i:5d} {s:8d} {100 * s / total:6.1f} {num(r[executed]):9d}  {text[:58]:58s} {why}")
    print("\nsamples by opcode")
    for op, s in by_op.most_common(12):
        print(f"{op:>12s} {s:8d} {100 * s / max(total, 1):6.1f} %")


if __name__ == "__main__":
    main()
