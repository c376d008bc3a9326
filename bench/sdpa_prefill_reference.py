#!/usr/bin/env python3
"""PyTorch references for the lazy attention kernels, on the shapes of
cuda_prefill_bench and cuda_decode_bench (Llama-3-8B attention: 32 query heads, 8 KV heads,
head dim 128, bf16), with pre-rotated contiguous KV (what a conventional cache holds).

1. Ceiling: an 8192^3 bf16 matrix product (torch.matmul, cuBLAS) on random data.
2. Prefill: scaled_dot_product_attention restricted to the flash backend.
   full: every token of a sequence of L a query, is_causal (L x L);
   last: the last 512 tokens as queries against all L keys, lower-right causal.
   Batch 16384 / L; FLOPs count the visible pairs exactly, as the C++ benchmark does.
3. Decode: one query token per sequence against its whole context (no mask), batch 1, 32, 64,
   contexts 4k, 16k, 32k; GB/s counts K and V read once (8 KV heads).
With --prefill-log / --decode-log (the C++ benchmarks' output) it prints the ratios.

usage: python3 sdpa_prefill_reference.py [--prefill-log FILE] [--decode-log FILE] [--decode-only]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HEADS, KV_HEADS, HD, DOC, TOKENS = 32, 8, 128, 512, 16384


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def sdpa_flash(q, k, v, **kw):
    """SDPA on the flash backend; GQA natively if this PyTorch allows it, else K/V expanded."""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
            return (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)), "gqa"
        except Exception:  # noqa: BLE001 - fall back to expanded K/V
            group = q.shape[1] // k.shape[1]
            ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            F.scaled_dot_product_attention(q, ke, ve, **kw)
            return (lambda: F.scaled_dot_product_attention(q, ke, ve, **kw)), "expanded"


def timed_flash(q, k, v, **kw):
    """Median ms of one call, timed over CUDA-graph replays of 10 calls (no launch gaps);
    plain back-to-back calls if the graph capture fails."""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fn, path = sdpa_flash(q, k, v, **kw)
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(10):
                    fn()
            return median_ms(graph.replay) / 10, path + ",graph"
        except Exception:  # noqa: BLE001
            return median_ms(fn), path


def parse_rows(path, width):
    rows = []
    if not path:
        return rows
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == width:
                rows.append(parts)
    return rows


def prefill_timings(dev, sdpa_prefill):
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b), reps=10)
    print(f"bf16 GEMM 8192^3 (torch.matmul): {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
    del a, b

    print(f"{'scenario':8} {'L':>6} {'batch':>5} {'sdpa_ms':>9} {'sdpa_TFLOP/s':>12} path")
    for length in (1024, 4096, 16384):
        batch = TOKENS // length
        k = torch.randn(batch, KV_HEADS, length, HD, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for scenario in ("full", "last"):
            n_q = length if scenario == "full" else DOC
            pos0 = length - n_q
            q = torch.randn(batch, HEADS, n_q, HD, device=dev, dtype=torch.bfloat16)
            pairs = n_q * pos0 + n_q * (n_q + 1) / 2
            flops = 4.0 * HD * HEADS * pairs * batch
            try:
                if scenario == "full":
                    ms, path = timed_flash(q, k, v, is_causal=True)
                else:
                    ms, path = timed_flash(q, k, v, attn_mask=causal_lower_right(n_q, length))
                tf = flops / ms / 1e9
                sdpa_prefill[(scenario, length)] = tf
                print(f"{scenario:8} {length:6d} {batch:5d} {ms:9.3f} {tf:12.1f} {path}")
            except Exception as e:  # noqa: BLE001
                print(f"{scenario:8} {length:6d} {batch:5d} failed: {type(e).__name__}: {e}")
            del q
        del k, v
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill-log")
    ap.add_argument("--decode-log")
    ap.add_argument("--decode-only", action="store_true", help="skip the GEMM ceiling and the prefill timings")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    torch.manual_seed(0)

    sdpa_prefill = {}
    if not args.decode_only:
        prefill_timings(dev, sdpa_prefill)

    print(f"{'batch':>5} {'context':>7} {'sdpa_us':>9} {'sdpa_GB/s':>9} path")
    sdpa_decode = {}
    for batch in (1, 32, 64):
        for context in (4096, 16384, 32768):
            k = torch.randn(batch, KV_HEADS, context, HD, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            q = torch.randn(batch, HEADS, 1, HD, device=dev, dtype=torch.bfloat16)
            try:
                ms, path = timed_flash(q, k, v)
                gbs = 2 * k.numel() * 2 / ms / 1e6
                sdpa_decode[(batch, context)] = ms * 1e3
                print(f"{batch:5d} {context:7d} {ms * 1e3:9.1f} {gbs:9.0f} {path}")
            except Exception as e:  # noqa: BLE001
                print(f"{batch:5d} {context:7d} failed: {type(e).__name__}: {e}")
            del k, v, q
            torch.cuda.empty_cache()

    rows = parse_rows(args.prefill_log, 10)
    if rows:
        print("prefill ratios (lazy kernel vs SDPA flash; rotation cost = lazy / no-rotation - 1)")
        print(f"{'scenario':8} {'L':>6} {'lazy_TF':>8} {'norot_TF':>8} {'sdpa_TF':>8} {'lazy/sdpa':>9} "
              f"{'norot/sdpa':>10} {'rot_cost':>8}")
        for r in rows:
            if r[0] not in ("full", "last"):
                continue
            key = (r[0], int(r[1]))
            lazy_tf, norot_tf = float(r[7]), float(r[8])
            sdpa_tf = sdpa_prefill.get(key)
            if sdpa_tf is None:
                continue
            print(f"{r[0]:8} {int(r[1]):6d} {lazy_tf:8.1f} {norot_tf:8.1f} {sdpa_tf:8.1f} "
                  f"{lazy_tf / sdpa_tf:9.2f} {norot_tf / sdpa_tf:10.2f} {r[9]:>8}")
    # cuda_decode_bench rows: 9 columns (graph_us last); logs of its first version had 8.
    rows = parse_rows(args.decode_log, 9) or parse_rows(args.decode_log, 8)
    if rows:
        print("decode ratios (SDPA time / lazy kernel time: above 1 means the lazy kernel is faster;")
        print("  lazy_us: one launch per event pair; graph_us: graph replays, timed as SDPA is)")
        print(f"{'batch':>5} {'context':>7} {'lazy_us':>9} {'graph_us':>9} {'sdpa_us':>9} {'sdpa/lazy':>9} "
              f"{'sdpa/graph':>10}")
        for r in rows:
            if not r[0].isdigit():
                continue
            key = (int(r[0]), int(r[1]))
            if key in sdpa_decode:
                lazy_us = float(r[3])
                graph_us = float(r[8]) if len(r) > 8 else lazy_us
                print(f"{key[0]:5d} {key[1]:7d} {lazy_us:9.1f} {graph_us:9.1f} {sdpa_decode[key]:9.1f} "
                      f"{sdpa_decode[key] / lazy_us:9.2f} {sdpa_decode[key] / graph_us:10.2f}")

if __name__ == "__main__":
    main()
