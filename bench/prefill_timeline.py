#!/usr/bin/env python3
"""The one-tile lazy prefill kernel's in-kernel timeline, summarized: where a KV tile's time goes
for each role. Input: a file written by `cuda_prefill_bench` with LAZYKV_PREFILL_TIMELINE_OUT in a
-DLAZYKV_PREFILL_TIMELINE=ON build (int32 ctas, tiles, events, then int64 stamps [ctas][tiles]
[events]; kernels/cuda/prefill_timeline.cuh says which event is which; a stamp is the SM's cycle
counter, 0 where none was written).

For each consumer, per tile in steady state (a CTA's tiles after its first two, before its last):
the median, mean and 90th percentile cycles of each step (waiting for the keys, for the turn, the scores, the
softmax, the values and their product), and the consumers' offset from each other; for the copy
warps, the waits for free slots and the issue times; and the tile period (consumer 0's
values-done to values-done), set against the cycles the tensor cores need for a tile (two
consumers' 64 x 128 x 128 products twice, at 1024 dense bf16 FLOP a cycle per SM quarter).
With --absolute, also every role's steps on one axis: each event's median offset from consumer 0's
keys-ready of a steady tile j, for tiles j - 1, j and j + 1, in time order (which release a wait
followed, e.g. whether the copy warps took a key slot long after the consumers freed it).
Then a CTA's start and end: tile 0's steps after the CTA's start, and the gap from the CTA before
on the same SM (its last P V) to this one's start, which no tile overlaps in the one-tile kernel.
Usage: prefill_timeline.py [--absolute] FILE...
"""
import statistics
import struct
import sys

KEYS_READY, TURN, SCORES_DONE, SOFTMAX_DONE, VALUES_DONE = range(5)
KEY_SLOT, KEYS_ISSUED, VALUE_SLOT, VALUES_ISSUED, CTA_START, SM_ID = 10, 11, 12, 13, 14, 15
FIRST_QUERY_MADE = 16  # tile 0 only
# Tile 0 only, the one-tile kernel's prologue (prefill_short_ctas.py reads them).
ENTRY, ENTRY_NS, PRIOR_GRID_DONE, ROWS_WRITTEN, ROWS_WRITTEN_NS = 26, 27, 28, 29, 30
WORK_MADE, FIRST_TILES_MADE, COPY_START = 31, 32, 33
TENSOR_CYCLES_PER_TILE = 2 * 2 * (2 * 64 * 128 * 128) // 4096  # both consumers' S and P V: 2048


def read(path):
    data = open(path, "rb").read()
    ctas, tiles, events = struct.unpack_from("<3i", data, 0)
    stamps = struct.unpack_from(f"<{ctas * tiles * events}q", data, 12)
    grid = [[stamps[(c * tiles + t) * events:(c * tiles + t + 1) * events] for t in range(tiles)] for c in range(ctas)]
    return grid


def steady_tiles(cta):
    """Indices of the CTA's tiles that both consumers finished, minus the first two and the last."""
    done = [t for t, ev in enumerate(cta) if ev[VALUES_DONE] and ev[5 + VALUES_DONE]]
    return done[2:-1]


def summarize(grid):
    steps = {name: [] for name in (
        "c0 wait keys", "c0 wait turn", "c0 scores", "c0 softmax", "c0 values+PV",
        "c1 wait keys", "c1 wait turn", "c1 scores", "c1 softmax", "c1 values+PV",
        "c1 behind c0 (scores done)", "tile period", "copy wait key slot", "copy keys issue",
        "copy wait value slot", "copy values issue", "keys issued -> c0 keys ready")}
    for cta in grid:
        tiles = steady_tiles(cta)
        for t in tiles:
            ev, prev = cta[t], cta[t - 1]
            if not (prev[VALUES_DONE] and prev[5 + VALUES_DONE]):
                continue  # the tile before has no consumer stamps (the persistent kernel's empty work tile)
            for c in (0, 1):
                b = 5 * c
                steps[f"c{c} wait keys"].append(ev[b + KEYS_READY] - prev[b + VALUES_DONE])
                steps[f"c{c} wait turn"].append(ev[b + TURN] - ev[b + KEYS_READY])
                steps[f"c{c} scores"].append(ev[b + SCORES_DONE] - ev[b + TURN])
                steps[f"c{c} softmax"].append(ev[b + SOFTMAX_DONE] - ev[b + SCORES_DONE])
                steps[f"c{c} values+PV"].append(ev[b + VALUES_DONE] - ev[b + SOFTMAX_DONE])
            steps["c1 behind c0 (scores done)"].append(ev[5 + SCORES_DONE] - ev[SCORES_DONE])
            steps["tile period"].append(ev[VALUES_DONE] - prev[VALUES_DONE])
            if ev[KEY_SLOT] and prev[VALUES_ISSUED]:
                steps["copy wait key slot"].append(ev[KEY_SLOT] - prev[VALUES_ISSUED])
                steps["copy keys issue"].append(ev[KEYS_ISSUED] - ev[KEY_SLOT])
                steps["copy wait value slot"].append(ev[VALUE_SLOT] - ev[KEYS_ISSUED])
                steps["copy values issue"].append(ev[VALUES_ISSUED] - ev[VALUE_SLOT])
                steps["keys issued -> c0 keys ready"].append(ev[KEYS_READY] - ev[KEYS_ISSUED])
    return steps


EVENT_NAMES = {
    KEYS_READY: "c0 keys ready", TURN: "c0 turn", SCORES_DONE: "c0 scores done", SOFTMAX_DONE: "c0 softmax done",
    VALUES_DONE: "c0 values done", 5 + KEYS_READY: "c1 keys ready", 5 + TURN: "c1 turn",
    5 + SCORES_DONE: "c1 scores done", 5 + SOFTMAX_DONE: "c1 softmax done", 5 + VALUES_DONE: "c1 values done",
    KEY_SLOT: "copy key slot taken", KEYS_ISSUED: "copy keys issued", VALUE_SLOT: "copy value slot taken",
    VALUES_ISSUED: "copy values issued"}


def cta_edges(grid):
    """A CTA's start and end, in cycles: {name: [values]} of tile 0's steps after the CTA's start
    (its table walk and barrier setup are before it), and, for CTAs after another on the same SM,
    the gap from that CTA's last P V (either consumer's) to this CTA's start (the output's stores,
    the CTA's exit and launch, the table walk); none after a CTA without a finished tile (no
    visible key, or tiles past the recorded ones)."""
    edges = {name: [] for name in (
        "start -> first query made", "start -> copy keys issued", "start -> c0 keys ready",
        "previous CTA's last P V -> start")}
    by_sm = {}
    for cta in grid:
        first = cta[0]
        if not first[CTA_START]:
            continue
        for name, event in (("first query made", FIRST_QUERY_MADE), ("copy keys issued", KEYS_ISSUED),
                            ("c0 keys ready", KEYS_READY)):
            if event < len(first) and first[event]:
                edges[f"start -> {name}"].append(first[event] - first[CTA_START])
        done = [ev for ev in cta if ev[VALUES_DONE] and ev[5 + VALUES_DONE]]
        end = max(done[-1][VALUES_DONE], done[-1][5 + VALUES_DONE]) if done else None
        by_sm.setdefault(first[SM_ID], []).append((first[CTA_START], end))
    for ctas in by_sm.values():
        ctas.sort()
        for (_, end), (start, _) in zip(ctas, ctas[1:]):
            if end is not None:
                edges["previous CTA's last P V -> start"].append(start - end)
    return edges


def absolute(grid):
    """[(median offset, tile offset, event name)] relative to consumer 0's keys-ready of tile j."""
    offsets = {}
    for cta in grid:
        for t in steady_tiles(cta):  # tiles t - 1 .. t + 1 exist and none is tile 0 (CTA_START, SM_ID)
            ref = cta[t][KEYS_READY]
            for dt in (-1, 0, 1):
                for event, stamp in enumerate(cta[t + dt]):
                    if stamp:
                        offsets.setdefault((dt, EVENT_NAMES.get(event, f"event {event}")), []).append(stamp - ref)
    return sorted((statistics.median(v), dt, name) for (dt, name), v in offsets.items())


def percentile(values, q):
    """The q-quantile by the nearest rank (a step's tail: e.g. the persistent kernel's work-tile
    boundaries, a few tiles in each work tile's)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main():
    args = sys.argv[1:]
    show_absolute = "--absolute" in args
    for path in [a for a in args if a != "--absolute"]:
        grid = read(path)
        steps = summarize(grid)
        n = len(steps["tile period"])
        print(f"== {path}: {n} steady tiles")
        if n == 0:
            continue
        period = statistics.median(steps["tile period"])
        for name, values in steps.items():
            if values:
                print(f"   {name:32s} median {statistics.median(values):8.0f}  mean {statistics.fmean(values):8.0f}  "
                      f"p90 {percentile(values, 0.9):8.0f}  ({statistics.median(values) / period:5.1%} of the median "
                      "period)")
        print(f"   tensor cycles a tile needs: {TENSOR_CYCLES_PER_TILE} ({TENSOR_CYCLES_PER_TILE / period:.1%} of the "
              "median period)")
        print("   a CTA's start and end (cycles):")
        for name, values in cta_edges(grid).items():
            if values:
                print(f"   {name:40s} median {statistics.median(values):8.0f}  mean {statistics.fmean(values):8.0f}")
        if show_absolute:
            print("   median offset from consumer 0's keys ready of tile j:")
            for offset, dt, name in absolute(grid):
                print(f"   {offset:8.0f}  tile j{dt:+d}  {name}")


if __name__ == "__main__":
    main()
