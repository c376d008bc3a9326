#!/usr/bin/env python3
"""Where a served request's time to first token goes between the client and the worker.

Reads a `lazykv-bench compare` output (compare.json) and prints, per mode, the median and
quartiles of the client's TTFT, the worker's own TTFT (GenerateDone.timings: from the handler's
first line to the first token) and their difference: the call's transit to the handler and
the first token's way back (and the client's own delay from the request's scheduled start to
its send). Where both sides reported the host's monotonic clock and the worker was the one
`compare` started (so on this host), the transit is split into: the client's delay, inbound (the
send to the handler's first line), to the write (the first token, stamped by the engine when it
is sampled, to its Write returning in the handler: the rest of that engine step and the
loop's hand-off to the handler, then the handler's detokenizing and gRPC's write, split where
the worker reports the handler's stamp) and outbound (that to the client's first read).
Standard library only.
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
        same_host = not data.get("target")  # a --target worker may be on another host: other clock
        split = [r for r in rows if same_host and r.get("sent_monotonic_ns") and
                 r["server"].get("arrival_monotonic_ns") and r["server"].get("first_write_monotonic_ns") and
                 r.get("first_read_monotonic_ns")]
        fmt = lambda q: "/".join(f"{v:.3f}" for v in q)
        print(f"{mode['mode']}: {len(rows)} requests (>= {min_cached} cached documents); quartiles/median/quartile ms: "
              f"client TTFT {fmt(quartiles(client))}, worker TTFT {fmt(quartiles(worker))}, "
              f"transit {fmt(quartiles(transit))}" + (f", ITL {fmt(quartiles(itl))}" if itl else ""))
        if split:
            ms = lambda a, b: (a - b) / 1e6
            inbound = [ms(r["server"]["arrival_monotonic_ns"], r["sent_monotonic_ns"]) for r in split]
            to_write = [ms(r["server"]["first_write_monotonic_ns"], r["server"]["arrival_monotonic_ns"]) -
                        r["server"]["ttft_ms"] for r in split]
            in_handler = [r["server"].get("first_token_in_handler_monotonic_ns", 0) for r in split]
            to_handler = [ms(h, r["server"]["arrival_monotonic_ns"]) - r["server"]["ttft_ms"]
                          for h, r in zip(in_handler, split) if h]
            handler_write = [ms(r["server"]["first_write_monotonic_ns"], h) for h, r in zip(in_handler, split) if h]
            outbound = [ms(r["first_read_monotonic_ns"], r["server"]["first_write_monotonic_ns"]) for r in split]
            delay = [(r["sent_s"] - r["scheduled_s"]) * 1e3 for r in split]
            print(f"  transit split ({len(split)} requests): client's delay to the send {fmt(quartiles(delay))}, "
                  f"inbound {fmt(quartiles(inbound))}, first token to its Write returning {fmt(quartiles(to_write))}, "
                  f"Write to the client's read {fmt(quartiles(outbound))}")
            if to_handler:
                print(f"  the first token to its Write, split: to the handler {fmt(quartiles(to_handler))}, "
                      f"the handler to its Write returning {fmt(quartiles(handler_write))}")


if __name__ == "__main__":
    main()
