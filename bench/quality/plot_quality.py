#!/usr/bin/python3
"""Plots lazykv-quality's per-case CSV (bench/quality/quality_report.h, MetricsCsv).

usage: plot_quality.py METRICS.csv OUT.png [TITLE]

Four panels, 95% normal-approximation intervals over cases:
  held-out perplexity ratio against `none` with the same anchor setting (BOS, long, none;
  paired geometric mean; the repair settings against `none` with BOS) by document count,
  the same by position of the relevant document (3 to 8 documents),
  object recall of the greedy free run by document count,
  greedy agreement with `none` (same anchor setting) up to the first divergence by document count.
"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BASELINE = {"lazy": "none", "lazy+long": "none+long", "lazy+noanchor": "none+noanchor", "control": "none",
            "block": "none", "prefix": "none", "lazy+repair4": "none", "lazy+repair16": "none"}
COLORS = {"none": "black", "lazy": "tab:red", "lazy+long": "tab:blue", "lazy+noanchor": "tab:orange",
          "control": "tab:gray", "none+long": "tab:green", "none+noanchor": "tab:brown", "lazy+repair4": "tab:pink",
          "lazy+repair16": "tab:purple"}
# Each against `none` with its own anchor setting; the repairs (BOS anchor) against `none`.
LAZY = ["lazy", "lazy+long", "lazy+noanchor", "lazy+repair4", "lazy+repair16"]


def mean_ci(values):
    n = len(values)
    if n == 0:
        return float("nan"), 0.0
    m = sum(values) / n
    if n < 2:
        return m, 0.0
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, 1.96 * sd / math.sqrt(n)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    title = sys.argv[3] if len(sys.argv) > 3 else sys.argv[1]
    by = defaultdict(dict)  # case -> setting -> row
    for r in rows:
        by[int(r["case"])][r["setting"]] = r
    counts = sorted({int(r["count"]) for r in rows})
    present = {r["setting"] for r in rows}

    def only(settings):  # the settings this CSV has (--no-long-anchor, --no-anchorless)
        return [s for s in settings if s in present]

    def ratio(setting, keep):
        diffs = []
        for per in by.values():
            if setting in per and BASELINE[setting] in per and keep(per[setting]):
                diffs.append(float(per[setting]["held_nll"]) - float(per[BASELINE[setting]]["held_nll"]))
        m, h = mean_ci(diffs)
        return math.exp(m), math.exp(m - h), math.exp(m + h)

    def field(setting, name, keep):
        return mean_ci([float(per[setting][name]) for per in by.values() if setting in per and keep(per[setting])])

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax = axes[0][0]
    for i, s in enumerate(only(LAZY + ["control"])):
        pts = [ratio(s, lambda r, k=k: int(r["count"]) == k) for k in counts]
        xs = [k * (1 + 0.03 * (i - 2.5)) for k in counts]
        ax.errorbar(xs, [p[0] for p in pts], yerr=[[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]],
                    marker="o", capsize=3, label=f"{s} / {BASELINE[s]}", color=COLORS[s])
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(k) for k in counts])
    ax.set_xlabel("documents in context")
    ax.set_ylabel("held-out perplexity ratio")
    ax.set_title("held-out text: perplexity against none")
    ax.legend()

    ax = axes[0][1]
    groups = [(p, k) for p in ["first", "middle", "last"] for k in counts if k >= 3]
    for i, s in enumerate(only(LAZY)):
        pts = [ratio(s, lambda r, p=p, k=k: r["placement"] == p and int(r["count"]) == k) for p, k in groups]
        xs = [j + 0.08 * (i - 2) for j in range(len(groups))]
        ax.errorbar(xs, [q[0] for q in pts], yerr=[[q[0] - q[1] for q in pts], [q[2] - q[0] for q in pts]],
                    marker="o", ls="none", capsize=3, label=f"{s} / {BASELINE[s]}", color=COLORS[s])
    ax.axhline(1, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), [f"{p}\nof {k}" for p, k in groups])
    ax.set_ylabel("held-out perplexity ratio")
    ax.set_title("by position of the relevant document")
    ax.legend()

    for ax, name, label in [(axes[1][0], "recalls_object", "free run names the relevant object"),
                            (axes[1][1], "agree_prefix", "agreement with none to first divergence")]:
        settings = only(["none"] + LAZY + ["none+noanchor", "control"] if name == "recalls_object" else LAZY)
        for i, s in enumerate(settings):
            pts = [field(s, name, lambda r, k=k: int(r["count"]) == k) for k in counts]
            xs = [k * (1 + 0.03 * (i - (len(settings) - 1) / 2)) for k in counts]
            ax.errorbar(xs, [p[0] for p in pts], yerr=[p[1] for p in pts], marker="o", capsize=3, label=s,
                        color=COLORS[s])
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(k) for k in counts])
        ax.set_xlabel("documents in context")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(label)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
