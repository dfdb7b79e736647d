#!/usr/bin/env python3
"""Where a StartLoad's time goes inside kvctl serve, from a Go execution trace.

    ./daemon.test -test.run 'TestGPUTorchEngine$/page=64KiB' -test.trace=trace.out ...
    go tool trace -d=parsed trace.out | tools/perf/startload_trace.py [METHOD [N]]

Reads the parsed events on stdin. For every call-channel region of METHOD (default StartLoad;
'Type="load"' takes the connector's load regions themselves, as BenchmarkGPUCheckCost makes them)
it takes the regions nested in it on the same goroutine (load, load.get, load.issue,
load.scatter, load.check, load.release, gpu.prepare, gpu.issue with gpu.copies and gpu.queue
in it, gpu.sync, gpu.wait, gpu.harvest) and prints the median and 90th
percentile of each over all calls, then the first N calls (default 0) event by event, with
microseconds from the call's start. Calls that checked on the GPU (a load.check region in them)
and calls that did not get tables of their own, each region also with its start's median offset
from the call's start. Tracing adds about a microsecond to every cgo call, so
the absolute times are a little above an untraced run's.
"""

import collections
import re
import sys

HEAD = re.compile(r"^M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)$")
FRAME_PREFIXES = ("runtime.", "github.com", "syscall", "internal", "net.")


def events(lines):
    out = []
    for i, line in enumerate(lines):
        m = HEAD.match(line)
        if not m:
            continue
        frame = ""
        for j in range(i + 1, min(i + 4, len(lines))):
            s = lines[j].strip()
            if s.startswith(FRAME_PREFIXES):
                frame = s.split(" @")[0]
                break
            if HEAD.match(lines[j]):
                break
        out.append((int(m.group(5)), int(m.group(3)), m.group(4), m.group(6).strip(), frame))
    out.sort()
    return out


def main():
    want = sys.argv[1] if len(sys.argv) > 1 else "StartLoad"
    show = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    ev = events(sys.stdin.read().split("\n"))
    opened, n = {}, 0
    # Per kind of call (checked or not): region -> durations, and its starts from the call's start.
    spans = collections.defaultdict(lambda: collections.defaultdict(list))
    starts = collections.defaultdict(lambda: collections.defaultdict(list))
    for idx, (t, g, kind, rest, _frame) in enumerate(ev):
        if kind == "RegionBegin" and want in rest:
            opened[g] = (t, idx)
        elif kind == "RegionEnd" and want in rest and g in opened:
            t0, i0 = opened.pop(g)
            n += 1
            inner = [e for e in ev[i0 : idx + 1] if e[1] == g]
            types = {re.search(r'Type="([^"]+)"', r).group(1) for (_, _, k, r, _) in inner if k == "RegionBegin"}
            group = "checked" if "load.check" in types else "unchecked"
            begun, loaded = {}, False
            for tt, _, k, r, _ in inner:
                if k not in ("RegionBegin", "RegionEnd"):
                    continue
                ty = re.search(r'Type="([^"]+)"', r).group(1)
                if k == "RegionBegin":
                    begun[ty] = tt
                    loaded = loaded or ty == "load"
                elif ty in begun:
                    b0 = begun.pop(ty)
                    spans[group][ty].append((tt - b0) / 1000)
                    starts[group][ty].append((b0 - t0) / 1000)
            if loaded:
                spans[group]["call that loaded"].append((t - t0) / 1000)
            if n <= show:
                print("=== %s #%d (%s): %.1f us" % (want, n, group, (t - t0) / 1000))
                for tt, _gg, k, r, f in inner:
                    if k != "Metric":
                        print("  %8.1f %s %s %s" % ((tt - t0) / 1000, k, r[:90], f))
    for group in sorted(spans):
        print("%s calls (us): median, 90th percentile, count, median start" % group)
        for k, v in sorted(spans[group].items()):
            v.sort()
            st = sorted(starts[group][k])
            at = "%8.1f" % st[len(st) // 2] if st else ""
            print("  %-48s %8.1f %8.1f %5d %s" % (k, v[len(v) // 2], v[int(len(v) * 0.9)], len(v), at))
    print("%d %s calls" % (n, want))


if __name__ == "__main__":
    main()
