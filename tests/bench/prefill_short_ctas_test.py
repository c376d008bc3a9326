#!/usr/bin/env python3
"""bench/prefill_short_ctas.py on a made-up timeline: each step's median offset from a CTA's entry,
the SM clock from the cycle and global-timer stamps, the CTAs' spread on the global timer, CTAs
without both stamps left out, and a file from before the prologue stamps refused."""
import contextlib
import io
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import prefill_short_ctas as sc  # noqa: E402
from prefill_timeline import read  # noqa: E402

TILES, EVENTS = 3, 34


def cta(entry, entry_ns, scale):
    """One CTA's stamps, each step `scale` times the base offsets after `entry` (2 cycles a ns)."""
    stamps = [[0] * EVENTS for _ in range(TILES)]
    t0 = stamps[0]
    t0[sc.ENTRY], t0[sc.ENTRY_NS] = entry, entry_ns
    for event, offset in ((sc.WORK_MADE, 2000), (sc.FIRST_TILES_MADE, 6000), (sc.PRIOR_GRID_DONE, 6500),
                          (sc.CTA_START, 6600), (sc.COPY_START, 7000), (sc.FIRST_QUERY_MADE, 9000)):
        t0[event] = entry + scale * offset
    for tile in range(2):
        stamps[tile][sc.KEYS_READY] = entry + scale * (10000 + 3000 * tile)
        stamps[tile][sc.VALUES_DONE] = entry + scale * (12000 + 3000 * tile)
    rows = scale * 16000
    t0[sc.ROWS_WRITTEN], t0[sc.ROWS_WRITTEN_NS] = entry + rows, entry_ns + rows // 2
    return stamps


def write(grid, events):
    flat = [x for c in grid for tile in c for x in tile]
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(struct.pack("<3i", len(grid), TILES, events) + struct.pack(f"<{len(flat)}q", *flat))
    return f.name


def main():
    # Three CTAs with stamps (steps 1x, 1x and 3x the base: the medians are the base), one with
    # none, one with an entry but no rows written (a split that saw no key).
    no_rows = cta(900, 40000, 1)
    no_rows[0][sc.ROWS_WRITTEN] = no_rows[0][sc.ROWS_WRITTEN_NS] = 0
    grid = [cta(1000, 50000, 1), [[0] * EVENTS for _ in range(TILES)], cta(5000, 50300, 1), cta(800, 50100, 3),
            no_rows]
    path = write(grid, EVENTS)
    ctas, offsets, ghz, entries, ends = sc.summarize(read(path))
    assert len(ctas) == 3, len(ctas)
    assert ghz == 2.0, ghz
    medians = {name: sorted(v)[len(v) // 2] for name, v in offsets.items() if v}
    assert medians["work tile made"] == 2000, medians
    assert medians["first tiles made or read"] == 6000, medians
    assert medians["c0: keys 1 ready"] == 13000, medians
    assert medians["c0: rows written"] == 16000, medians
    assert "c0: keys 2 ready" not in medians, medians  # no CTA stamped a third tile
    assert sorted(entries) == [50000, 50100, 50300], entries
    assert sorted(ends) == [58000, 58300, 74100], ends  # the 3x CTA's rows: 48000 cycles = 24000 ns
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sys.argv = ["prefill_short_ctas.py", path]
        sc.main()
    text = out.getvalue()
    assert "3 CTAs, SM clock 2.00 GHz" in text, text
    assert "entries over 0.30 us, rows written from 8.00 to 24.10 us" in text, text
    os.unlink(path)
    # A timeline of the older, 26-event layout has no prologue stamps: said, not misread.
    old = write([[[1] * 26 for _ in range(TILES)]], 26)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sys.argv = ["prefill_short_ctas.py", old]
        sc.main()
    os.unlink(old)
    assert "no prologue stamps" in out.getvalue(), out.getvalue()
    print("prefill_short_ctas_test: ok")


if __name__ == "__main__":
    main()
