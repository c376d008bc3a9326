#!/usr/bin/env python3
"""The persistent lazy prefill kernel's work tile boundaries, from its in-kernel timeline.

Input: a file written by `cuda_prefill_bench L full` with LAZYKV_PREFILL_TIMELINE_SCHEDULE=3 and
LAZYKV_PREFILL_TIMELINE_OUT in a -DLAZYKV_PREFILL_TIMELINE=ON build (int32 ctas, tiles, events,
then int64 stamps [ctas][tiles][events]; kernels/cuda/prefill_timeline.cuh says which event is
which; LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 launches it on a rotated query, as the backend does).

Prints, in cycles (quantiles over every CTA):
- the rotation warps' chain per work tile: the last query written to the next work tile found,
  its raw rows asked for and landed, R(position) q made, each delta's wait for a query buffer and
  its write;
- consumer 0 at a work tile's first tile (a boundary) and inside one: the previous tile's P V
  done to its keys landed, then to its keys and query ready, and the tile period; at a boundary,
  the previous P V done to its rows handed off (stores issued or TMA boxes read); consumer 1's P V done to its next keys and query;
- the copy warps at a boundary: when they took the key and value slots and issued the loads,
  relative to consumer 0's previous P V done.
Usage: prefill_boundaries.py FILE
"""
import struct
import sys

KEYS_READY, VALUES_DONE = 0, 4
KEY_SLOT, KEYS_ISSUED, VALUE_SLOT, VALUES_ISSUED = 10, 11, 12, 13
KEYS_LANDED, WORK_INDEX = 17, 18
RAW_LANDED, POSITION_DONE, BUFFER_FREE, QUERY_WRITTEN, WORK_FOUND, RAW_ISSUED = 19, 20, 21, 22, 23, 24
OUTPUT_HANDED_OFF = 25  # consumer 0, at a work tile's last tile (timelines of 26 events a tile and more)
C1 = 5  # consumer 1's events: C1 + KEYS_READY, ...


def read(path):
    data = open(path, "rb").read()
    ctas, tiles, events = struct.unpack_from("<3i", data, 0)
    if events <= RAW_ISSUED:
        sys.exit(f"{path}: {events} events a tile; this summary needs the persistent kernel's ({RAW_ISSUED + 1})")
    stamps = struct.unpack_from(f"<{ctas * tiles * events}q", data, 12)
    return ctas, tiles, lambda c, t, e: stamps[(c * tiles + t) * events + e] if e < events else 0


def summary(values):
    if not values:
        return "none"
    v = sorted(values)
    n = len(v)
    return f"p10 {v[n // 10]:6d}  median {v[n // 2]:6d}  p90 {v[9 * n // 10]:6d}  mean {sum(v) / n:8.0f}  ({n})"


def main():
    ctas, tiles, at = read(sys.argv[1])
    rows = {}

    def add(name, value):
        rows.setdefault(name, []).append(value)

    for c in range(ctas):
        # The rotation warps stamp at k, the CTA's delta index (a work tile's first delta for the raw rows).
        for k in range(tiles):
            if at(c, k, RAW_LANDED) and at(c, k, WORK_FOUND):
                if k > 0 and at(c, k - 1, QUERY_WRITTEN):
                    add("rotation: last query written -> next work tile found", at(c, k, WORK_FOUND) - at(c, k - 1, QUERY_WRITTEN))
                add("rotation: work tile found -> raw rows asked for", at(c, k, RAW_ISSUED) - at(c, k, WORK_FOUND))
                add("rotation: raw rows asked for -> landed", at(c, k, RAW_LANDED) - at(c, k, RAW_ISSUED))
                add("rotation: raw rows landed -> R(p) q made", at(c, k, POSITION_DONE) - at(c, k, RAW_LANDED))
            if at(c, k, BUFFER_FREE) and at(c, k, QUERY_WRITTEN):
                add("rotation: a delta's query written (buffer free -> written)", at(c, k, QUERY_WRITTEN) - at(c, k, BUFFER_FREE))
        firsts = {t for t in range(tiles) if at(c, t, WORK_INDEX)}
        for t in range(1, tiles):
            prev, landed, ready = at(c, t - 1, VALUES_DONE), at(c, t, KEYS_LANDED), at(c, t, KEYS_READY)
            if not (prev and landed and ready):
                continue
            where = "boundary" if t in firsts else "inside"
            add(f"consumer 0, {where}: previous P V done -> keys landed", landed - prev)
            add(f"consumer 0, {where}: keys landed -> keys and query ready", ready - landed)
            if at(c, t, VALUES_DONE):
                add(f"consumer 0, {where}: tile period", at(c, t, VALUES_DONE) - prev)
            if where == "boundary" and at(c, t - 1, OUTPUT_HANDED_OFF):
                add("consumer 0, boundary: previous P V done -> its rows handed off", at(c, t - 1, OUTPUT_HANDED_OFF) - prev)
            prev1, ready1 = at(c, t - 1, C1 + VALUES_DONE), at(c, t, C1 + KEYS_READY)
            if prev1 and ready1:
                add(f"consumer 1, {where}: previous P V done -> keys and query ready", ready1 - prev1)
            if where == "boundary":
                for event, name in ((KEY_SLOT, "key slot taken"), (KEYS_ISSUED, "keys issued"),
                                    (VALUE_SLOT, "value slot taken"), (VALUES_ISSUED, "values issued")):
                    if at(c, t, event):
                        add(f"copy warps, boundary: {name} (from consumer 0's previous P V done)", at(c, t, event) - prev)
    if not rows:
        sys.exit(f"{sys.argv[1]}: no work tile with the persistent kernel's stamps")
    width = max(len(name) for name in rows)
    for name, values in rows.items():
        print(f"{name:<{width}}  {summary(values)}")


if __name__ == "__main__":
    main()
