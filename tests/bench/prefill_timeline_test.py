#!/usr/bin/env python3
"""bench/prefill_timeline.py on a made-up timeline: steps computed from stamps written out by
hand, steady tiles only (a CTA's first two and last left out), CTAs without stamps skipped, and
--absolute's offsets from consumer 0's keys-ready."""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import prefill_timeline as tl  # noqa: E402

CTAS, TILES, EVENTS = 5, 6, 17


def make():
    stamps = [[[0] * EVENTS for _ in range(TILES)] for _ in range(CTAS)]
    # CTA 0: five tiles, a period of 1000 cycles; consumer 1 runs 300 behind consumer 0.
    for t in range(5):
        base = 10000 + 1000 * t
        for c, lag in ((0, 0), (1, 300)):
            b = 5 * c
            ev = stamps[0][t]
            ev[b + tl.KEYS_READY] = base + lag + 50        # 50 after the tile before's values
            ev[b + tl.TURN] = base + lag + 80
            ev[b + tl.SCORES_DONE] = base + lag + 380
            ev[b + tl.SOFTMAX_DONE] = base + lag + 780
            ev[b + tl.VALUES_DONE] = base + lag + 1000
        ev = stamps[0][t]
        ev[tl.KEY_SLOT] = base - 500
        ev[tl.KEYS_ISSUED] = base - 400
        ev[tl.VALUE_SLOT] = base - 250
        ev[tl.VALUES_ISSUED] = base - 200
    stamps[0][0][tl.CTA_START] = 9000
    stamps[0][0][tl.SM_ID] = 7
    stamps[0][0][tl.FIRST_QUERY_MADE] = 9700
    # CTA 1: no stamps at all (not in the recorded waves).
    # CTA 2: after CTA 0 on SM 7, 800 cycles after CTA 0's last P V (consumer 1's, tile 4: 15300);
    # its first query made 600 cycles after its start; one tile, whose keys were issued at once.
    ev = stamps[2][0]
    ev[tl.CTA_START], ev[tl.SM_ID], ev[tl.FIRST_QUERY_MADE], ev[tl.KEYS_ISSUED] = 16100, 7, 16700, 16150
    ev[tl.KEYS_READY], ev[tl.VALUES_DONE], ev[5 + tl.VALUES_DONE] = 16750, 17500, 17900
    # CTA 3 on SM 7: no visible key (a start, no finished tile); CTA 4 after it: no gap is measured
    # from CTA 3, which has no last P V.
    stamps[3][0][tl.CTA_START], stamps[3][0][tl.SM_ID] = 18000, 7
    ev = stamps[4][0]
    ev[tl.CTA_START], ev[tl.SM_ID], ev[tl.VALUES_DONE], ev[5 + tl.VALUES_DONE] = 20000, 7, 21000, 21100
    flat = [x for cta in stamps for tile in cta for x in tile]
    return struct.pack("<3i", CTAS, TILES, EVENTS) + struct.pack(f"<{len(flat)}q", *flat)


def main():
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(make())
    grid = tl.read(f.name)
    os.unlink(f.name)
    steps = tl.summarize(grid)
    # Five tiles: steady ones are 2 and 3 (first two and the last left out).
    assert len(steps["tile period"]) == 2, steps["tile period"]
    want = {
        "tile period": 1000, "c0 wait keys": 50, "c1 wait keys": 50, "c0 wait turn": 30, "c0 scores": 300,
        "c0 softmax": 400, "c0 values+PV": 220, "c1 behind c0 (scores done)": 300, "copy wait key slot": 700,
        "copy keys issue": 100, "copy wait value slot": 150, "copy values issue": 50,
        "keys issued -> c0 keys ready": 450,
    }
    for name, value in want.items():
        assert steps[name] == [value, value], (name, steps[name])
    # --absolute: every event's median offset from consumer 0's keys-ready of a steady tile, in
    # time order, for the tiles before and after too.
    rows = tl.absolute(grid)
    assert [r[0] for r in rows] == sorted(r[0] for r in rows), rows
    got = {(dt, name): offset for offset, dt, name in rows}
    assert got[(0, "c0 keys ready")] == 0, got
    assert got[(0, "copy key slot taken")] == -550, got
    assert got[(-1, "copy key slot taken")] == -1550, got
    assert got[(1, "c1 values done")] == 1000 + 300 + 1000 - 50, got
    assert len(got) == 3 * 14, len(got)  # 14 events a tile (no CTA start or SM id past tile 0)
    # A CTA's start and end: tile 0's steps after the start, and the gap after the CTA before on
    # the same SM (CTA 2 follows CTA 0; CTA 1 has no stamps).
    edges = tl.cta_edges(grid)
    assert sorted(edges["start -> first query made"]) == [600, 700], edges
    assert sorted(edges["start -> copy keys issued"]) == [50, 600], edges  # CTA 0's tile 0: 10000 - 400
    assert sorted(edges["start -> c0 keys ready"]) == [650, 1050], edges
    assert edges["previous CTA's last P V -> start"] == [800, 100], edges
    # A tile after one without consumer stamps (the persistent kernel's empty work tile) is not a
    # step: its waits would be measured from zero.
    cta = [[0] * EVENTS for _ in range(7)]
    for t in (0, 1, 2, 4, 5, 6):
        for c in (0, 1):
            b = 5 * c
            cta[t][b + tl.KEYS_READY], cta[t][b + tl.TURN] = 1000 * t + 10, 1000 * t + 20
            cta[t][b + tl.SCORES_DONE], cta[t][b + tl.SOFTMAX_DONE] = 1000 * t + 30, 1000 * t + 40
            cta[t][b + tl.VALUES_DONE] = 1000 * t + 50
    got = tl.summarize([cta])
    assert got["tile period"] == [1000, 1000], got["tile period"]  # tiles 2 and 5; tile 4 follows the empty 3
    print("prefill_timeline_test: ok")


if __name__ == "__main__":
    main()
