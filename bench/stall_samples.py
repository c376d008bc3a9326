#!/usr/bin/env python3
"""Where a warp-specialized kernel's warps wait, role by role, from ncu's per-instruction samples.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` for one kernel (a report
collected with `--section SourceCounters --section WarpStateStats`; bench/run_prefill_gpu.sh makes
them). The kernel's SASS is split into roles at its `USETMAXREG` instructions (each role's
setmaxnreg opens its code; the code before the first is the prologue). ptxas moves the retry loops
of mbarrier waits out of line to the end of the function: an out-of-line block is given to the role
whose branch jumps into it.

For each role: its share of the samples and of the instructions issued, its stall reasons (share of
its samples), and its instructions with the most samples (address offset, executions, samples, SASS,
main reasons). Usage: stall_samples.py SOURCE.csv [TOP]
"""
import collections
import csv
import re
import sys

REASON = re.compile(r"^stall_(\w+)$")  # the all-samples columns; "(Not Issued)" ones are left out


def read(path):
    rows = list(csv.reader(open(path, newline="")))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if REASON.match(h)]
    code = []
    for r in rows[header_at + 1:]:
        if len(r) < len(header) or not r[0].startswith("0x"):
            continue
        code.append({
            "addr": int(r[0], 16),
            "sass": r[col["Source"]].strip(),
            "samples": int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
            "executed": int(r[col["Instructions Executed"]] or 0),
            "reasons": {REASON.match(h).group(1): int(r[col[h]] or 0) for h in reasons},
        })
    return code


def roles(code):
    """Role name per instruction: split at USETMAXREG, out-of-line blocks to their caller."""
    names, current = [], "prologue"
    for ins in code:
        if "USETMAXREG" in ins["sass"]:
            regs = int(ins["sass"].split()[-1], 16)
            current = ("shrink to " if "DEALLOC" in ins["sass"] else "grow to ") + str(regs)
        names.append(current)
    # The out-of-line tail: the code after the function's last unconditional EXIT. Each of its
    # blocks runs from a branch target to an unconditional BRA and belongs to the role of the
    # instruction before the tail that branches into it.
    tail = max((i for i, ins in enumerate(code) if ins["sass"] == "EXIT"), default=len(code) - 1) + 1
    index = {ins["addr"]: i for i, ins in enumerate(code)}
    for i, ins in enumerate(code[:tail]):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", ins["sass"])
        j = index.get(int(m.group(1), 16)) if m else None
        if j is None or j < tail:
            continue
        while j < len(code):
            names[j] = names[i]
            if re.match(r"^BRA ", code[j]["sass"]):
                break
            j += 1
    return names


def summarize(code):
    """Per role, in code order: name, sample share, issue share, reason shares, instructions."""
    names = roles(code)
    total = sum(i["samples"] for i in code) or 1
    issued = sum(i["executed"] for i in code) or 1
    out = []
    for role in dict.fromkeys(names):
        mine = [c for c, n in zip(code, names) if n == role]
        samples = sum(c["samples"] for c in mine)
        reasons = collections.Counter()
        for c in mine:
            reasons.update(c["reasons"])
        out.append({
            "role": role,
            "samples": samples / total,
            "issued": sum(c["executed"] for c in mine) / issued,
            "reasons": {k: v / (samples or 1) for k, v in reasons.most_common()},
            "code": sorted(mine, key=lambda c: -c["samples"]),
        })
    return out


def main():
    code = read(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    base = code[0]["addr"]
    for r in summarize(code):
        print(f"== {r['role']}: {r['samples']:.1%} of samples, {r['issued']:.1%} of instructions issued")
        print("   " + "  ".join(f"{k} {v:.2f}" for k, v in list(r["reasons"].items())[:8]))
        role_samples = sum(c["samples"] for c in r["code"]) or 1
        for c in r["code"][:top]:
            main_reasons = " ".join(f"{k}:{v}" for k, v in sorted(c["reasons"].items(), key=lambda x: -x[1])[:2] if v)
            print(f"   {c['samples'] / role_samples:6.1%} {c['addr'] - base:6x} x{c['executed']:<9d} {c['sass'][:62]:62s} "
                  f"{main_reasons}")


if __name__ == "__main__":
    main()
