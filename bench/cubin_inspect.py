#!/usr/bin/env python3
"""Looks inside sm_90a cubins on a machine without cuobjdump or nvdisasm (the build VM).

A kernel's speed here has turned on its code rather than its source (a merge compiled into a
loop, a counter that lost its uniform register), and the build VM's CUDA toolkit has nvcc and
ptxas but no disassembler. This reads the cubin's ELF sections directly:

  compare A.cubin B.cubin
      Per kernel (anonymous-namespace hashes ignored): instruction counts and how many
      instructions differ, aligned (difflib). "changed 0" means the same machine code: a
      refactor that must not change a measured kernel can be checked without a GPU.
  loops CUBIN [KERNEL_SUBSTRING]
      Per kernel, every loop (a backward branch and what it spans): its size and the opcodes
      that tell its code apart: HGMMA, R2UR (a vector value moved to a uniform register),
      uniform-datapath instructions (U*), BSSY (a divergent region), LDL/STL (spills).
  copies CUBIN [KERNEL_SUBSTRING]
      Per kernel, its cp.async copies (LDGSTS) in code order with their global-address register
      pair, and how many copies reuse the register pair of the copy just before: a copy holds
      that register until the memory pipe has read it, so the next copy's address waits
      (the one-tile prefill kernel's copy warps took ~1270 cycles to issue a key tile, 16 copies a
      thread whose addresses all went through R4: bench/results/prefill_overlap_2026-11-28.md).
  learn DUMP.sass...
      Adds the mnemonics of `cuobjdump -sass` dumps (made on a GPU machine) to the opcode table.

Only mnemonics are decoded, from a table (bench/sass_opcodes_sm90.json: the low 12 bits of an
instruction's first 64-bit word name its opcode, learned from dumps of this project's kernels),
plus the targets of BRA and LDGSTS's registers (bits 16-23 its shared-memory address register,
24-31 its global one, checked against dumps). An opcode the table lacks prints as ?XXX.

usage: python3 bench/cubin_inspect.py compare A.cubin B.cubin
       python3 bench/cubin_inspect.py loops X.cubin [LazyPrefillPersistentKernelILi128]
       python3 bench/cubin_inspect.py copies X.cubin [LazyPrefillSpecializedKernelILi128]
       python3 bench/cubin_inspect.py learn dump1.sass [dump2.sass ...]
"""
import difflib
import json
import os
import re
import struct
import sys
from collections import Counter

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sass_opcodes_sm90.json")


def load_table():
    with open(TABLE) as f:
        return {int(k, 16): v for k, v in json.load(f).items()}


def text_sections(path):
    """{kernel name without anonymous-namespace hashes: machine code} for each .text section."""
    data = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    out = {}
    for name_off, kind, _, _, offset, size, *_ in headers:
        name = data[names + name_off:data.index(b"\0", names + name_off)].decode()
        if name.startswith(".text.") and kind != 8:  # 8: SHT_NOBITS
            name = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "", name[len(".text."):])
            out[name] = data[offset:offset + size]
    return out


def decode(code, table):
    """[(address, mnemonic, branch target or None)]."""
    out = []
    for addr in range(0, len(code), 16):
        w0, w1 = struct.unpack_from("<QQ", code, addr)
        op = table.get(w0 & 0xFFF, "?%03x" % (w0 & 0xFFF))
        target = None
        if op == "BRA":  # offset / 4: bits 16-23 and 34-63 of word 0, then word 1's low bits
            v = ((w0 >> 16) & 0xFF) | ((w0 >> 34) << 8) | ((w1 & 0x3FFFF) << 38)
            if v >> 55:
                v -= 1 << 56
            target = addr + 16 + 4 * v
        out.append((addr, op, target))
    return out


def compare(a_path, b_path):
    a, b = text_sections(a_path), text_sections(b_path)
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{'only in ' + (a_path if name in a else b_path)}: {name}")
            continue
        xa = [a[name][i:i + 16] for i in range(0, len(a[name]), 16)]
        xb = [b[name][i:i + 16] for i in range(0, len(b[name]), 16)]
        ops = difflib.SequenceMatcher(None, xa, xb, autojunk=False).get_opcodes()
        changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
        print(f"{'same   ' if changed == 0 else 'differs'} {len(xa):6d} {len(xb):6d} instrs, {changed:5d} changed: {name}")


def loops(path, substring):
    table = load_table()
    for name, code in sorted(text_sections(path).items()):
        if substring and substring not in name:
            continue
        ins = decode(code, table)
        print(f"{name}: {len(ins)} instrs")
        for addr, op, target in ins:
            if op != "BRA" or target is None or target >= addr:
                continue
            body = Counter(o for a, o, _ in ins if target <= a <= addr)
            size = sum(body.values())
            uniform = sum(v for k, v in body.items() if k.startswith("U") and k != "USETMAXREG")
            print(f"  loop {target:#7x}-{addr:#7x} {size:5d} instrs: HGMMA {body['HGMMA']:2d} R2UR {body['R2UR']:3d} "
                  f"uniform {uniform:3d} BSSY {body['BSSY']:2d} LDGSTS {body['LDGSTS']:2d} "
                  f"LDL {body['LDL']} STL {body['STL']}")


LDGSTS = 0xFAE


def copies(path, want):
    for name, code in sorted(text_sections(path).items()):
        if want not in name:
            continue
        regs = []
        for off in range(0, len(code), 16):
            lo = struct.unpack_from("<Q", code, off)[0]
            if lo & 0xFFF == LDGSTS:
                regs.append((off, (lo >> 24) & 0xFF))
        reused = sum(1 for a, b in zip(regs, regs[1:]) if a[1] == b[1])
        print(f"{name}: {len(regs)} LDGSTS, {reused} reuse the address registers of the copy before")
        print("  " + " ".join(f"{off:x}:R{reg}" for off, reg in regs))


def learn(dumps):
    table = load_table() if os.path.exists(TABLE) else {}
    line = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)[^;]*;\s+/\* 0x([0-9a-f]{16}) \*/")
    for path in dumps:
        for text in open(path):
            m = line.match(text)
            if m:
                key = int(m.group(3), 16) & 0xFFF
                if table.get(key, m.group(2)) != m.group(2):
                    sys.exit(f"{path}: opcode {key:#x} is both {table[key]} and {m.group(2)}")
                table[key] = m.group(2)
    with open(TABLE, "w") as f:
        json.dump({"%03x" % k: v for k, v in sorted(table.items())}, f, indent=0, sort_keys=True)
    print(f"{len(table)} opcodes in {TABLE}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "loops":
        loops(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "")
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "copies":
        copies(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "")
    elif len(sys.argv) >= 3 and sys.argv[1] == "learn":
        learn(sys.argv[2:])
    else:
        sys.exit(__doc__)
