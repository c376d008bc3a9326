#!/usr/bin/env python3
"""Where a decode step's time goes, from an Nsight Systems GPU trace.

usage: decode_step_profile.py TRACE.csv [--last N]

TRACE.csv: `nsys stats -r cuda_gpu_trace -f csv` of a run whose decode steps each end in one
SampleRowsKernel (the CUDA backend's GPU sampling). A step is the span from the end of one
sampling kernel to the end of the next. For the last N such steps (default 60) it reports, as
medians: the step's wall time on the GPU timeline, the time kernels and copies ran, the idle
time before the step's first kernel (the host's work between steps: the engine, the pass's
planning, the launches), the idle time between kernels inside the step, the kernel count, and
the busy time per kernel name. Plain Python (csv, statistics): runs on the GPU machine.
"""
import csv
import statistics
import sys
from collections import defaultdict


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    last = 60
    if "--last" in sys.argv:
        last = int(sys.argv[sys.argv.index("--last") + 1])
    rows = []
    with open(sys.argv[1], newline="") as f:
        for r in csv.DictReader(f):
            start = r.get("Start (ns)") or r.get("Start")
            dur = r.get("Duration (ns)") or r.get("Duration")
            name = r.get("Name", "")
            if start is None or dur is None:
                continue
            rows.append((int(float(start)), int(float(dur)), name))
    rows.sort()
    ends = [i for i, (_, _, n) in enumerate(rows) if "SampleRowsKernel" in n]
    if len(ends) < 3:
        print("fewer than 3 sampling kernels: no decode steps found")
        return 1
    steps = []
    for a, b in zip(ends[:-1], ends[1:]):
        t0 = rows[a][0] + rows[a][1]
        t1 = rows[b][0] + rows[b][1]
        inside = rows[a + 1:b + 1]
        busy = 0
        cursor = t0
        gaps = 0
        first_gap = None
        per_name = defaultdict(int)
        for s, d, n in inside:
            if s > cursor:
                if first_gap is None:
                    first_gap = s - cursor
                else:
                    gaps += s - cursor
            elif first_gap is None:
                first_gap = 0
            end = s + d
            busy += max(0, end - max(s, cursor))
            cursor = max(cursor, end)
            short = n.split("(")[0].split("<")[0].strip()[:60]
            per_name[short] += d
        steps.append(dict(wall=t1 - t0, busy=busy, first_gap=first_gap or 0, gaps=gaps, kernels=len(inside),
                          per_name=per_name))
    steps = steps[-last:]
    med = lambda k: statistics.median(s[k] for s in steps) / 1e3
    print(f"decode steps: {len(steps)} (of {len(ends) - 1}); medians in us")
    print(f"  wall {med('wall'):.1f}, busy {med('busy'):.1f}, idle before the first kernel {med('first_gap'):.1f}, "
          f"idle between kernels {med('gaps'):.1f}, kernels {statistics.median(s['kernels'] for s in steps):.0f}")
    names = defaultdict(list)
    for s in steps:
        for n, d in s["per_name"].items():
            names[n].append(d)
    print("  busy per kernel (median per step, us):")
    for n, ds in sorted(names.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"    {statistics.median(ds) / 1e3:9.1f}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
