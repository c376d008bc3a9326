#!/usr/bin/python3
"""Plots `lazykv-bench compare` results: the TTFT distribution (CDF, log axis: lazy and
block sit far left of prefix and none) per mode, TTFT by the number of a request's documents
found cached, and the throughput per mode. Usage: plot_compare.py DIR/compare.json DIR/compare.png

Uses Debian's python3-matplotlib (scripts/setup.sh installs it)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on servers
import matplotlib.pyplot as plt  # noqa: E402


def main(json_path, png_path):
    with open(json_path) as f:
        results = json.load(f)
    modes = results["modes"]
    fig, (cdf, by_cached, bars) = plt.subplots(1, 3, figsize=(17, 4.5))

    for run in modes:
        ttft = sorted(r["ttft_ms"] for r in run["requests"] if r["status"] == "OK" and r["ttft_ms"] >= 0)
        if not ttft:
            continue
        fraction = [(i + 1) / len(ttft) for i in range(len(ttft))]
        cdf.step(ttft, fraction, where="post", label=run["mode"])
    cdf.set_xscale("log")
    cdf.set_xlabel("time to first token (ms, client-side, log scale)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("TTFT distribution")
    cdf.set_ylim(0, 1.02)
    cdf.grid(alpha=0.3)
    cdf.legend()

    for run in modes:
        by = run["summary"].get("ttft_ms_by_cached_documents", {})
        if not by:
            continue
        cached = sorted(by, key=int)
        by_cached.plot([int(k) for k in cached], [by[k]["p50"] for k in cached], marker="o", label=run["mode"])
    by_cached.set_yscale("log")
    by_cached.set_xlabel("documents of the request found cached")
    by_cached.set_ylabel("TTFT p50 (ms, log scale)")
    by_cached.set_title("TTFT by cached documents")
    by_cached.grid(alpha=0.3)
    by_cached.legend()

    names = [run["mode"] for run in modes]
    tokens = [run["summary"]["output_token_throughput"] for run in modes]
    requests = [run["summary"]["request_throughput"] for run in modes]
    drawn = bars.bar(names, tokens, color="tab:blue")
    for bar, rps in zip(drawn, requests):
        bars.annotate(f"{rps:.2f} req/s", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=9)
    bars.set_ylabel("output tokens per second")
    bars.set_title("throughput")
    bars.grid(axis="y", alpha=0.3)

    options = results.get("trace_options", {})
    fig.suptitle("lazykv-bench compare: {} requests, {} docs ({}), {} per request, zipf s {}".format(
        options.get("requests"), options.get("docs"), options.get("doc_lengths"),
        options.get("docs_per_request"), options.get("zipf_s")))
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
