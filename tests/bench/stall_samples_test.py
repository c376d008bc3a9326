#!/usr/bin/env python3
"""bench/stall_samples.py on a small made-up ncu source export: the split into roles at
USETMAXREG, the out-of-line retry blocks given to the role that branches into them, and the
shares (checked against sums written out by hand)."""
import csv
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import stall_samples  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_long_sb", "stall_selected", "stall_long_sb (Not Issued)"]
BASE = 0x7F0000001000
# (offset, SASS, samples, executed, barrier, long_sb, selected)
CODE = [
    (0x00, "LDC R1, c[0x0][0x28]", 4, 10, 0, 0, 4),
    (0x10, "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd0", 1, 10, 0, 0, 1),
    (0x20, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 2, 20, 0, 0, 2),
    (0x30, f"@!P0  BRA 0x{BASE + 0xa0:x}", 30, 20, 0, 30, 0),   # the consumer's wait, retried out of line
    (0x40, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", 10, 20, 6, 0, 4),
    (0x50, "USETMAXREG.DEALLOC.CTAPOOL 0x38", 1, 10, 0, 0, 1),
    (0x60, f"@!P1  BRA 0x{BASE + 0xc0:x}", 8, 10, 0, 8, 0),      # the copy's wait
    (0x70, "LDGSTS.E.BYPASS.128 [R4], desc[UR6][R2.64]", 4, 40, 0, 0, 4),
    (0x80, "EXIT", 0, 10, 0, 0, 0),
    (0x90, "BRA 0x7f0000001090", 0, 0, 0, 0, 0),
    (0xa0, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 5, 100, 0, 5, 0),  # the consumer's retry block
    (0xb0, f"BRA 0x{BASE + 0x20:x}", 5, 100, 0, 5, 0),
    (0xc0, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR5], R3", 20, 50, 20, 0, 0),  # the copy's retry block
    (0xd0, f"BRA 0x{BASE + 0x60:x}", 10, 50, 0, 0, 10),
]


def export():
    text = io.StringIO()
    w = csv.writer(text, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "void kernel()"])
    w.writerow(HEADER)
    for off, sass, samples, executed, barrier, long_sb, selected in CODE:
        w.writerow([f"0x{BASE + off:x}", "      " + sass, samples, samples - selected, executed, barrier, long_sb,
                    selected, long_sb])
    return text.getvalue()


def main():
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(export())
    code = stall_samples.read(f.name)
    os.unlink(f.name)
    assert len(code) == len(CODE), len(code)
    assert "Not Issued" not in " ".join(code[0]["reasons"]), code[0]["reasons"]
    got = {r["role"]: r for r in stall_samples.summarize(code)}
    assert list(got) == ["prologue", "grow to 208", "shrink to 56"], list(got)
    total_samples = sum(c[2] for c in CODE)
    total_executed = sum(c[3] for c in CODE)
    # The consumer: 0x10-0x40 and its retry block 0xa0-0xb0; the copy: 0x50-0x90 and 0xc0-0xd0.
    consumer = [1, 2, 30, 10, 5, 5]
    copy = [1, 8, 4, 0, 0, 20, 10]
    checks = [
        (got["prologue"]["samples"], 4 / total_samples),
        (got["grow to 208"]["samples"], sum(consumer) / total_samples),
        (got["shrink to 56"]["samples"], sum(copy) / total_samples),
        (got["grow to 208"]["issued"], (10 + 20 + 20 + 20 + 100 + 100) / total_executed),
        (got["grow to 208"]["reasons"]["long_sb"], (30 + 5 + 5) / sum(consumer)),
        (got["shrink to 56"]["reasons"]["barrier"], 20 / sum(copy)),
    ]
    for value, want in checks:
        assert abs(value - want) < 1e-12, (value, want)
    assert got["grow to 208"]["code"][0]["sass"].startswith("@!P0  BRA"), got["grow to 208"]["code"][0]
    print("stall_samples_test: ok")


if __name__ == "__main__":
    main()
