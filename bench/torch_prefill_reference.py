"""Full-prefill TTFT of a plain PyTorch Llama-3-8B-shaped model (random bf16 weights): the
alternative a user would reach for, against `cuda_backend_bench`'s `none` mode on the same
prompt length. One forward pass over the whole prompt (SDPA, causal, GQA), the final norm and
classifier on the last token, argmax; CUDA-event timing, median after warm-up.
usage: python3 torch_prefill_reference.py [--tokens 4113] [--reps 10]
"""
import argparse
import math

import torch
import torch.nn.functional as F

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256


def inv_freq_llama3(theta=500000.0, factor=8.0, low=1.0, high=4.0, original=8192.0):
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    wavelen = 2 * math.pi / inv
    smooth = (original / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    mid = (wavelen <= original / low) & (wavelen >= original / high)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)


def rope(x, cos, sin):  # rotate-half, x: [tokens, heads, head_dim]
    a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rms_norm(x, w, eps=1e-5):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4113)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, fan_in):
        return (torch.rand(*shape, device=dev, generator=g, dtype=bf) * 2 - 1) * math.sqrt(3.0 / fan_in)

    emb = rand(VOCAB, DIM, fan_in=3)
    layers = [dict(norm1=torch.ones(DIM, device=dev, dtype=bf), wqkv=rand((HEADS + 2 * KV_HEADS) * HEAD_DIM, DIM, fan_in=DIM),
                   wo=rand(DIM, HEADS * HEAD_DIM, fan_in=DIM), norm2=torch.ones(DIM, device=dev, dtype=bf),
                   wgu=rand(2 * HIDDEN, DIM, fan_in=DIM), wd=rand(DIM, HIDDEN, fan_in=HIDDEN)) for _ in range(LAYERS)]
    final_norm, cls = torch.ones(DIM, device=dev, dtype=bf), rand(VOCAB, DIM, fan_in=DIM)
    tokens = torch.randint(3, VOCAB, (args.tokens,), device=dev, generator=g)
    angles = torch.arange(args.tokens, device=dev, dtype=torch.float64)[:, None] * inv_freq_llama3().to(dev)[None, :]
    cos, sin = angles.cos().float()[:, None, :].to(bf), angles.sin().float()[:, None, :].to(bf)

    @torch.inference_mode()
    def forward():
        x = emb[tokens]
        n = x.shape[0]
        for lw in layers:
            qkv = rms_norm(x, lw["norm1"]) @ lw["wqkv"].T
            q = qkv[:, : HEADS * HEAD_DIM].view(n, HEADS, HEAD_DIM)
            k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(n, KV_HEADS, HEAD_DIM)
            v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(n, KV_HEADS, HEAD_DIM)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                               is_causal=True, enable_gqa=True)
            x = x + o[0].transpose(0, 1).reshape(n, HEADS * HEAD_DIM) @ lw["wo"].T
            gu = rms_norm(x, lw["norm2"]) @ lw["wgu"].T
            x = x + (F.silu(gu[:, :HIDDEN]) * gu[:, HIDDEN:]) @ lw["wd"].T
        logits = (rms_norm(x[-1:], final_norm) @ cls.T).float()
        return int(logits.argmax())

    for _ in range(3):
        forward()
    times = []
    for _ in range(args.reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        forward()  # .item() inside synchronizes
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    ms = times[len(times) // 2]
    flops = 2 * args.tokens * (LAYERS * (DIM * (HEADS + 2 * KV_HEADS) * HEAD_DIM + DIM * HEADS * HEAD_DIM + 3 * DIM * HIDDEN))
    print(f"PyTorch {torch.__version__} full prefill, Llama-3-8B shape, {args.tokens} tokens: TTFT {ms:.2f} ms "
          f"(median of {args.reps}; {flops / ms / 1e9:.0f} TFLOP/s of GEMM work)")


if __name__ == "__main__":
    main()
