#!/usr/bin/env python3
"""The one-tile lazy prefill kernel's in-kernel timeline, summarized: where a KV tile's time goes
for each role. Input: a file written by `cuda_prefill_bench` with LAZYKV_PREFILL_TIMELINE_OUT in a
-DLAZYKV_PREFILL_TIMELINE=ON build (int32 ctas, tiles, events, then int64 stamps [ctas][tiles]
[events]; kernels/cuda/prefill_timeline.cuh says which event is which; a stamp is the SM's cycle
counter, 0 where none was written).

For each consumer, per tile in steady state (a CTA's tiles after its first two, before its last):
the median and mean cycles of each step (waiting for the keys, for the turn, the scores, the
softmax, the values and their product), and the consumers' offset from each other; for the copy
warps, the waits for free slots and the issue times; and the tile period (consumer 0's
values-done to values-done), set against the cycles the tensor cores need for a tile (two
consumers' 64 x 128 x 128 products twice, at 1024 dense bf16 FLOP a cycle per SM quarter).
Usage: prefill_timeline.py FILE...
"""
import statistics
import struct
import sys

KEYS_READY, TURN, SCORES_DONE, SOFTMAX_DONE, VALUES_DONE = range(5)
KEY_SLOT, KEYS_ISSUED, VALUE_SLOT, VALUES_ISSUED, CTA_START, SM_ID = 10, 11, 12, 13, 14, 15
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


def main():
    for path in sys.argv[1:]:
        steps = summarize(read(path))
        n = len(steps["tile period"])
        print(f"== {path}: {n} steady tiles")
        if n == 0:
            continue
        period = statistics.median(steps["tile period"])
        for name, values in steps.items():
            if values:
                print(f"   {name:32s} median {statistics.median(values):8.0f}  mean {statistics.fmean(values):8.0f}  "
                      f"({statistics.median(values) / period:5.1%} of the median period)")
        print(f"   tensor cycles a tile needs: {TENSOR_CYCLES_PER_TILE} ({TENSOR_CYCLES_PER_TILE / period:.1%} of the "
              "median period)")


if __name__ == "__main__":
    main()
