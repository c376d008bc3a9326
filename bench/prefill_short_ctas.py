#!/usr/bin/env python3
"""Where a short prefill CTA's time goes: the one-tile kernel's fixed path, from its entry to its
rows written, for launches whose CTAs take a few KV tiles each (a cached-document question's
splits: `cuda_prefill_bench questions` with LAZYKV_PREFILL_TIMELINE_OUT in a
-DLAZYKV_PREFILL_TIMELINE=ON build writes PREFIX_questions_BATCH). prefill_timeline.py reads the
same files for the long loops' steady state; this reads each CTA's steps from its entry.

Per step, the median over the CTAs of its offset from the CTA's entry (cycles, and us at the SM
clock that the CTAs' own cycle and global-timer stamps give), in time order; then the launch's
span on the global timer: the first CTA's entry to the last CTA's rows, and how far apart the
CTAs enter and finish.
CTAs whose split sees no key (they write empty rows, unstamped) are left out.
Usage: prefill_short_ctas.py FILE...
"""
import statistics
import sys

from prefill_timeline import (COPY_START, CTA_START, ENTRY, ENTRY_NS, FIRST_QUERY_MADE, FIRST_TILES_MADE,
                              KEY_SLOT, KEYS_ISSUED, KEYS_READY, PRIOR_GRID_DONE, ROWS_WRITTEN, ROWS_WRITTEN_NS,
                              SCORES_DONE, SOFTMAX_DONE, VALUE_SLOT, VALUES_DONE, VALUES_ISSUED, WORK_MADE, read)

# (name, tile, event): the steps read, all in cycles on the CTA's SM.
STEPS = [("work tile made", 0, WORK_MADE), ("first tiles made or read", 0, FIRST_TILES_MADE),
         ("waited for the kernel before", 0, PRIOR_GRID_DONE), ("CTA barrier passed", 0, CTA_START),
         ("copy warps start", 0, COPY_START), ("first query made (seen by rotation)", 0, FIRST_QUERY_MADE)]
for tile in range(4):
    STEPS += [(f"copy: key slot {tile}", tile, KEY_SLOT), (f"copy: keys {tile} issued", tile, KEYS_ISSUED),
              (f"copy: value slot {tile}", tile, VALUE_SLOT), (f"copy: values {tile} issued", tile, VALUES_ISSUED),
              (f"c0: keys {tile} ready", tile, KEYS_READY), (f"c0: scores {tile} done", tile, SCORES_DONE),
              (f"c0: first half's softmax {tile}", tile, SOFTMAX_DONE), (f"c0: P V {tile} done", tile, VALUES_DONE)]
STEPS.append(("c0: rows written", 0, ROWS_WRITTEN))


def summarize(grid):
    ctas = [cta for cta in grid if cta[0][ENTRY] and cta[0][ROWS_WRITTEN]]
    offsets = {name: [] for name, _, _ in STEPS}
    for cta in ctas:
        entry = cta[0][ENTRY]
        for name, tile, event in STEPS:
            if tile < len(cta) and cta[tile][event]:
                offsets[name].append(cta[tile][event] - entry)
    rates = [(c[0][ROWS_WRITTEN] - c[0][ENTRY]) / (c[0][ROWS_WRITTEN_NS] - c[0][ENTRY_NS])
             for c in ctas if c[0][ROWS_WRITTEN_NS] > c[0][ENTRY_NS]]
    ghz = statistics.median(rates) if rates else float("nan")
    entries = [c[0][ENTRY_NS] for c in ctas]
    ends = [c[0][ROWS_WRITTEN_NS] for c in ctas]
    return ctas, offsets, ghz, entries, ends


def main():
    for path in sys.argv[1:]:
        grid = read(path)
        if not grid or not grid[0] or len(grid[0][0]) <= COPY_START:
            print(f"== {path}: no prologue stamps (a timeline from before they were added)")
            continue
        ctas, offsets, ghz, entries, ends = summarize(grid)
        if not ctas:  # a CTA whose split sees no key writes its rows without these stamps
            print(f"== {path}: no CTA with both its entry and its rows stamped")
            continue
        print(f"== {path}: {len(ctas)} CTAs, SM clock {ghz:.2f} GHz (cycles / global-timer ns)")
        rows = sorted(((statistics.median(v), name, len(v)) for name, v in offsets.items() if v))
        for median, name, n in rows:
            print(f"   {median:8.0f} cycles {median / ghz / 1e3:7.2f} us  {name} ({n} CTAs)")
        first = min(entries)
        print(f"   global timer: entries over {(max(entries) - first) / 1e3:.2f} us, rows written from "
              f"{(min(ends) - first) / 1e3:.2f} to {(max(ends) - first) / 1e3:.2f} us after the first entry")


if __name__ == "__main__":
    main()
