#!/usr/bin/env python3
"""Where a served request's time to first token goes between the client and the worker.

Reads a `lazykv-bench compare` output (compare.json) and prints, per mode, the median and
quartiles of the client's TTFT, the worker's own TTFT (GenerateDone.timings: from the handler's
first line to the first token) and their difference: the call's transit to the handler and
the first token's way back. Standard library only.
usage: served_transit.py COMPARE_JSON [MIN_CACHED_DOCS]
"""
import json
import statistics
import sys


def quartiles(values):
    values = sorted(values)
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main():
    data = json.load(open(sys.argv[1]))
    min_cached = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    for mode in data["modes"]:
        rows = [r for r in mode["requests"] if r.get("status") == "OK" and "server" in r and
                r.get("usage", {}).get("cached_documents", 0) >= min_cached]
        if not rows:
            print(f"{mode['mode']}: no requests")
            continue
        client = [r["ttft_ms"] for r in rows]
        worker = [r["server"]["ttft_ms"] for r in rows]
        transit = [c - w for c, w in zip(client, worker)]
        itl = [x for r in rows for x in r.get("itl_ms", [])]
        fmt = lambda q: "/".join(f"{v:.3f}" for v in q)
        print(f"{mode['mode']}: {len(rows)} requests (>= {min_cached} cached documents); quartiles/median/quartile ms: "
              f"client TTFT {fmt(quartiles(client))}, worker TTFT {fmt(quartiles(worker))}, "
              f"transit {fmt(quartiles(transit))}" + (f", ITL {fmt(quartiles(itl))}" if itl else ""))


if __name__ == "__main__":
    main()
