#!/usr/bin/env python3
"""The check that moving the skinny MMA kernel's device helpers into skinny_mma_stages.cuh left its
machine code unchanged. The move puts `Epilogue` in namespace skinny_mma, which renames every
kernel, so `cubin_inspect.py compare` alone pairs none of them; this pairs them by their names
with that namespace taken out and compares their .text sections byte for byte.

  nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG -I. \
      kernels/cuda/skinny_mma_gemm.cu -o /tmp/before.cubin      # at fa0b553, then at HEAD as after
  python3 bench/results/raw/product_chain_2026-11-29/sass_compare.py /tmp/before.cubin /tmp/after.cubin
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import cubin_inspect  # noqa: E402  (bench/cubin_inspect.py)


def norm(name):
    name = re.sub(r"LNS\d_(10skinny_mma)?8EpilogueE", "EPI", name)
    return re.sub(r"S[0-9A-Z]?_(S[0-9A-Z]?_)?Pi$", "", name)


before = {norm(k): v for k, v in cubin_inspect.text_sections(sys.argv[1]).items()}
after = {norm(k): v for k, v in cubin_inspect.text_sections(sys.argv[2]).items()}
same = sum(before.get(k) == after.get(k) for k in set(before) | set(after))
print(f"{len(before)} kernels before, {len(after)} after, {same} byte for byte the same")
sys.exit(0 if same == len(before) == len(after) else 1)
