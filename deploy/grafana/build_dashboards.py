#!/usr/bin/env python3
"""Writes the LazyKV Grafana dashboards (deploy/grafana/dashboards/*.json).

The JSON files are checked in; edit this script and run it again rather than editing
them by hand (or edit them in Grafana and export, then fold the change back here):

    python3 deploy/grafana/build_dashboards.py
    /usr/bin/python3 scripts/check_dashboards.py --scrape deploy/local/scrapes/*.prom

Conventions:
- Every panel queries the data source variable ${datasource} (default "Prometheus") and
  filters on the $job and $instance variables (multi-value, "All" = .*).
- Rates use $__rate_interval; latency quantiles are histogram_quantile over the summed
  rate of the *_bucket series by le.
- Every ratio divides by a denominator filtered with "> 0": no traffic shows "No data",
  never 0 or NaN (scripts/check_dashboards.py enforces a guard on every division).
- The panels a person looks at first are on top: one row of stats, then latency and
  throughput, then the detail rows.
Metric names and their meaning: docs/reference.md.
Panel and query helpers: dashboard_panels.py; this file holds the shared expressions and
the three dashboards (overview, workers, cache servers).
"""
import json
import os

from dashboard_panels import (F, RI, dashboard, latency_quantiles, quantile, rate, ratio, right_axis, row, stat,
                              target, targets, ts)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "dashboards")


# ----------------------------------------------------------------------------- shared expressions
W = "lazykv_worker_"
C = "lazykv_cache_"
NOT_OK = 'outcome!="OK"'
USED, CACHED, ALL_BLOCKS = 'state="used"', 'state="cached"', 'state=~"used|free"'
HOST, DISK = 'tier="host"', 'tier="disk"'

DOC_HIT = ratio(rate(W + "document_cached_tokens_total"), rate(W + "document_tokens_total"))
DOC_HIT_DESC = (
    "Document tokens whose KV was reused (the worker's pool or any cache tier) over document "
    "tokens requested: lazykv_worker_document_cached_tokens_total / lazykv_worker_document_tokens_total. "
    "The anchor and the question are not documents."
)
FLEET = ratio(
    f"(\n  {rate(W + 'chunk_misses_total')}\n  + {rate(W + 'chunk_recomputes_total')}\n)",
    rate(C + "lease_grants_total"),
)
FLEET_DESC = (
    "Fleet compute, by chunks: chunk encodings on every worker (misses: held nowhere; recomputes: held by "
    "the tier but computed) per lease the cache tier granted (one per key missing from every cache server). "
    "1.0 = every chunk missing from the fleet is computed once; above 1 = duplicate work (lease waits given up, "
    "a cache server skipped or down, recomputing chosen over fetching). Needs cache servers; a chunk the tier "
    "evicted counts as new again. The counters hold no number of distinct document tokens, so the token form "
    "(prefilled / distinct, as lazykv-bench load prints) cannot be computed from /metrics."
)
FLEET_RANGE = ratio(
    f"(\n  sum(increase({W}chunk_misses_total{F()}[$__range]))"
    f"\n  + sum(increase({W}chunk_recomputes_total{F()}[$__range]))\n)",
    f"sum(increase({C}lease_grants_total{F()}[$__range]))",
)
ERR_RATIO = ratio(
    f'({rate(W + "requests_total", extra=NOT_OK)} or vector(0))',
    rate(W + "requests_total"),
)
PROMPT_SHARE = (
    f"{rate(W + 'prompt_tokens_total', by='source')}\n  / ignoring (source) group_left ()\n"
    f"({rate(W + 'prompt_tokens_total')} > 0)"
)
PROMPT_SHARE_DESC = (
    "Share of prompt tokens (anchor, documents, question) by where their KV came from: gpu = the worker's own "
    "KV pool (host memory on the CPU backend), host/disk = the embedded cache tier, remote = cache servers, "
    "computed = prefilled. The cached sources are the per-tier hit ratios."
)
FILL = f"{C}occupancy_bytes{F()}\n  / ({C}capacity_bytes{F()} > 0)"


AUTH_REFUSED = targets(
    (rate(C + "rejected_total", by="reason"), "cache: {{reason}}"),
    (
        rate(W + "requests_total", extra='outcome=~"UNAUTHENTICATED|PERMISSION_DENIED|RESOURCE_EXHAUSTED"', by="outcome"),
        "worker: {{outcome}}",
    ),
)
AUTH_DESC = (
    "Calls refused. Cache servers: lazykv_cache_rejected_total by reason (unauthenticated, permission_denied, "
    "lease_held, bad_mac, non_finite, max_concurrent_streams, max_streams_per_client, max_lookup_keys, "
    "stream_idle_timeout, host_full, chunk_too_large). Workers: Generate calls that ended UNAUTHENTICATED, "
    "PERMISSION_DENIED or RESOURCE_EXHAUSTED (queue or threads full). A reason appears after its first event."
)


# ----------------------------------------------------------------------------- overview
def overview():
    top = [
        stat("Document hit ratio", DOC_HIT, "percentunit", DOC_HIT_DESC,
             (("red", None), ("orange", 0.3), ("green", 0.6)), decimals=1),
        stat("Fleet compute (time range)", FLEET_RANGE, "none",
             "Over the dashboard's time range (like lazykv-bench load's whole-run figure). " + FLEET_DESC,
             (("green", None), ("orange", 1.2), ("red", 2)), decimals=2),
        stat("TTFT p99", quantile(0.99, W + "ttft_seconds"), "s",
             "Arrival to first token, server side, p99 over the rate interval (lazykv_worker_ttft_seconds).",
             (("green", None), ("orange", 1), ("red", 2))),
        stat("Inter-token p99", quantile(0.99, W + "inter_token_seconds"), "s",
             "Time between consecutive tokens of a request, p99 (lazykv_worker_inter_token_seconds).",
             (("green", None), ("orange", 0.1), ("red", 0.25))),
        stat("Requests/s", rate(W + "requests_total"), "reqps",
             "Generate calls finished per second, every outcome (lazykv_worker_requests_total)."),
        stat("Output tokens/s", rate(W + "generated_tokens_total"), "short",
             "Tokens generated per second (lazykv_worker_generated_tokens_total)."),
        stat("Error ratio", ERR_RATIO, "percentunit",
             "Generate calls not OK over all calls (any gRPC code, including CANCELLED and refused credentials).",
             (("green", None), ("orange", 0.01), ("red", 0.05)), decimals=2),
        stat("Targets down", f'count(up{{job=~"$job", instance=~"$instance"}} == 0) or vector(0)', "none",
             "Scrape targets of the selected jobs that Prometheus cannot reach (up == 0).",
             (("green", None), ("red", 1))),
    ]
    latency = [
        latency_quantiles(W + "ttft_seconds", "Time to first token",
                          "Server side, from the call's arrival (before tokenizing and queueing): lazykv_worker_ttft_seconds."),
        latency_quantiles(W + "inter_token_seconds", "Inter-token latency",
                          "Between consecutive generated tokens of a request: lazykv_worker_inter_token_seconds."),
        latency_quantiles(W + "queue_seconds", "Queue time",
                          "Arrival to admission (the request's KV blocks reserved): lazykv_worker_queue_seconds."),
    ]
    throughput = [
        ts("Requests/s by outcome", targets((rate(W + "requests_total", by="outcome"), "{{outcome}}")), "reqps",
           "Generate calls per second by outcome: OK or the gRPC code (lazykv_worker_requests_total).", stack=True),
        ts("Tokens/s", targets(
            (rate(W + "generated_tokens_total"), "generated"),
            (rate(W + "prompt_tokens_total"), "prompt"),
            (rate(W + "document_tokens_total"), "document (requested)"),
            (f"{rate(W + 'document_tokens_total')}\n  - {rate(W + 'document_cached_tokens_total')}", "document (computed)"),
        ), "short",
           "Generated tokens, prompt tokens (all sources), document tokens requested and document tokens "
           "prefilled (requested minus reused), per second. Tokens by outcome are not exported."),
        ts("Queued and running requests", targets(
            (f"sum({W}queued_requests{F()})", "queued"),
            (f"sum({W}running_requests{F()})", "running"),
        ), "short", "Requests waiting for KV pool room, and admitted ones (gauges, summed over workers)."),
    ]
    reuse = [
        ts("Document hit ratio", targets(
            (DOC_HIT, "fleet"),
            (ratio(rate(W + "document_cached_tokens_total", by="instance"),
                   rate(W + "document_tokens_total", by="instance")), "{{instance}}"),
        ), "percentunit", DOC_HIT_DESC, maximum=1),
        ts("Prompt tokens by source (share)", targets((PROMPT_SHARE, "{{source}}")), "percentunit",
           PROMPT_SHARE_DESC, stack=True, maximum=1),
        ts("Fleet compute (chunks)", targets(
            (FLEET, "fleet compute"),
            (f"{rate(W + 'chunk_misses_total')}\n  + {rate(W + 'chunk_recomputes_total')}", "chunks encoded/s"),
            (rate(C + "lease_grants_total"), "lease grants/s"),
        ), "none", FLEET_DESC + " Right axis: the two rates of the ratio; encodings with no grants "
                                "(no data on the left) are duplicate work too."),
    ]
    reuse[2]["fieldConfig"]["overrides"] = [right_axis("chunks encoded/s", "ops"), right_axis("lease grants/s", "ops")]
    tier = [
        ts("Cache fill by tier", targets((FILL, "{{instance}} {{tier}}")), "percentunit",
           "lazykv_cache_occupancy_bytes / lazykv_cache_capacity_bytes per cache server and tier.", maximum=1),
        ts("Evictions, demotions, promotions", targets(
            (rate(C + "evictions_total", by="tier"), "evicted from {{tier}}"),
            (rate(C + "demotions_total"), "demoted (host to disk)"),
            (rate(C + "promotions_total"), "promoted (disk to host)"),
            (rate(C + "gpu_promotions_total"), "promoted to the GPU tier"),
            (rate(C + "gpu_demotions_total"), "demoted (GPU tier to host)"),
        ), "ops",
           "Chunks per second leaving a tier for space, evicted from host RAM but kept on disk, read from "
           "disk back into host RAM, copied into the GPU tier (--gpu-capacity), and evicted from it with no "
           "lower copy (stored back in host RAM)."),
        ts("Refused calls", AUTH_REFUSED, "ops", AUTH_DESC),
    ]
    return dashboard(
        "lazykv-overview",
        "LazyKV / Overview",
        "Service level of a LazyKV fleet: reuse, latency, throughput, cache tier. Details: LazyKV / Workers, LazyKV / Cache servers.",
        'label_values({__name__=~"lazykv_worker_kv_blocks|lazykv_cache_capacity_bytes"}, job)',
        [
            row("Service level", top),
            row("Latency", latency),
            row("Throughput", throughput),
            row("Reuse", reuse),
            row("Cache tier", tier),
        ],
    )


# ----------------------------------------------------------------------------- workers
def workers():
    pool_used = ratio(
        f'sum by (instance) ({W}kv_blocks{F(USED)})',
        f'sum by (instance) ({W}kv_blocks{F(ALL_BLOCKS)})',
    )
    top = [
        stat("Document hit ratio", DOC_HIT, "percentunit", DOC_HIT_DESC,
             (("red", None), ("orange", 0.3), ("green", 0.6)), w=4, decimals=1),
        stat("TTFT p99", quantile(0.99, W + "ttft_seconds"), "s", "lazykv_worker_ttft_seconds, p99.",
             (("green", None), ("orange", 1), ("red", 2)), w=4),
        stat("Inter-token p99", quantile(0.99, W + "inter_token_seconds"), "s",
             "lazykv_worker_inter_token_seconds, p99.", (("green", None), ("orange", 0.1), ("red", 0.25)), w=4),
        stat("Requests/s", rate(W + "requests_total"), "reqps", "Generate calls finished per second.", w=4),
        stat("Queued requests", f"sum({W}queued_requests{F()})", "none",
             "Requests waiting for KV pool room (past --max-queued-requests they get RESOURCE_EXHAUSTED).",
             (("green", None), ("orange", 16), ("red", 48)), w=4),
        stat("KV pool used (max)", f"max({pool_used})", "percentunit",
             "Blocks in use (by requests or holding cached chunks) over all blocks, the fullest worker.",
             (("green", None), ("orange", 0.9), ("red", 0.98)), w=4, decimals=1),
    ]
    requests = [
        ts("Requests/s by outcome", targets((rate(W + "requests_total", by="outcome"), "{{outcome}}")), "reqps",
           "Generate calls per second by outcome: OK or the gRPC code; refused credentials count as "
           "UNAUTHENTICATED and PERMISSION_DENIED.", w=12, stack=True),
        ts("Failed and refused requests/s", targets(
            (rate(W + "requests_total", extra='outcome!="OK"', by="outcome"), "{{outcome}}")), "reqps",
           "Generate calls per second that did not end OK, by gRPC code (a code appears after its first event).",
           w=12),
    ]
    latency = [
        latency_quantiles(W + "ttft_seconds", "Time to first token", "lazykv_worker_ttft_seconds, server side."),
        ts("TTFT p99 by instance", targets((quantile(0.99, W + "ttft_seconds", by="instance"), "{{instance}}")), "s",
           "p99 time to first token per worker."),
        latency_quantiles(W + "inter_token_seconds", "Inter-token latency", "lazykv_worker_inter_token_seconds."),
        latency_quantiles(W + "queue_seconds", "Queue time", "Arrival to admission: lazykv_worker_queue_seconds.",
                          w=12),
        ts("Queued and running requests", targets(
            (f"sum by (instance) ({W}queued_requests{F()})", "queued {{instance}}"),
            (f"sum by (instance) ({W}running_requests{F()})", "running {{instance}}"),
        ), "short", "lazykv_worker_queued_requests and lazykv_worker_running_requests.", w=12),
    ]
    reuse = [
        ts("Document hit ratio by instance", targets(
            (ratio(rate(W + "document_cached_tokens_total", by="instance"),
                   rate(W + "document_tokens_total", by="instance")), "{{instance}}"),
        ), "percentunit", DOC_HIT_DESC, maximum=1),
        ts("Prompt tokens/s by source", targets((rate(W + "prompt_tokens_total", by="source"), "{{source}}")),
           "short", "lazykv_worker_prompt_tokens_total by source (gpu, host, disk, remote, computed).", stack=True),
        ts("Hit ratio by source (share of prompt tokens)", targets((PROMPT_SHARE, "{{source}}")), "percentunit",
           PROMPT_SHARE_DESC, maximum=1),
        ts("Chunks/s", targets(
            (rate(W + "chunk_hits_total"), "hits"),
            (rate(W + "chunk_misses_total"), "misses (held nowhere)"),
            (rate(W + "chunk_recomputes_total"), "recomputes (held by the tier)"),
        ), "ops", "Documents and anchors per second: reused from any source, encoded because held nowhere, "
                  "encoded though the tier held them."),
        ts("Chunk hit ratio", targets((ratio(
            rate(W + "chunk_hits_total"),
            f"({rate(W + 'chunk_hits_total')} + {rate(W + 'chunk_misses_total')} + {rate(W + 'chunk_recomputes_total')})",
        ), "chunks reused")), "percentunit",
           "Chunks (documents and anchors) reused over chunks needed, by count rather than tokens.", maximum=1),
        ts("Document tokens/s", targets(
            (rate(W + "document_tokens_total"), "requested"),
            (rate(W + "document_cached_tokens_total"), "reused"),
            (f"{rate(W + 'document_tokens_total')}\n  - {rate(W + 'document_cached_tokens_total')}", "computed"),
        ), "short", "Document tokens requested, reused and prefilled per second."),
    ]
    host_path = [
        ts("Document texts/s", targets((rate(W + "document_texts_total", by="tokens"), "{{tokens}}")), "ops",
           "Documents sent as text (the OpenAI API sends only text), by where their tokens came from: cached "
           "(the worker's document token cache, --document-token-cache-bytes) or tokenized on the handler "
           "thread, before the engine sees the request.", stack=True),
        ts("Document texts from the token cache", targets((ratio(
            rate(W + "document_texts_total", extra='tokens="cached"'),
            rate(W + "document_texts_total"),
        ), "cached")), "percentunit",
           "Document texts whose tokens came from the cache over all document texts. Low with popular "
           "documents: the cache is smaller than the hot set (or off).", maximum=1),
        ts("Engine idle watches/s", targets((rate(W + "engine_idle_watches_total", by="outcome"), "{{outcome}}")),
           "ops", "When the engine runs out of work, its thread watches for the next request for --idle-spin-us "
                  "before it sleeps: took_work (the next request skipped the thread's wake-up), ran_out (it slept). "
                  "None under steady load; each watch holds a core for up to that long.", stack=True),
    ]
    pipeline = [
        ts("Chunk pipeline decisions/s", targets((rate(W + "chunk_decisions_total", by="decision"), "{{decision}}")),
           "ops", "One per chunk missing from the pool: fetch, miss (held nowhere), recompute_chosen (computing "
                  "judged faster), recompute_failed (the fetch failed), busy (the pipeline's queue was full, the "
                  "tier not asked).", stack=True),
        ts("Publications/s", targets(
            (rate(W + "chunks_published_total"), "published"),
            (rate(W + "chunk_publish_failures_total"), "failed"),
            (rate(W + "publications_dropped_total"), "dropped (budget full)"),
            (rate(W + "chunks_rejected_total"), "fetched chunks rejected (MAC, non-finite)"),
        ), "ops", "Computed chunks published to the cache tier, refused or lost, dropped because the "
                  "--publish-budget was full; and fetched chunks refused before use."),
        ts("Lease waits/s and publish bytes in flight", targets(
            (rate(W + "lease_waits_total"), "lease waits/s"),
        ) + [target(f"sum({W}publish_bytes_in_flight{F()})", "publish bytes in flight", "B")],
           "ops", "Chunks waited for while another worker computed them (lease waits/s, left axis); captured chunk "
                  "bytes not yet published (the --publish-budget's use, right axis)."),
    ]
    # Second axis for the bytes in flight.
    pipeline[2]["fieldConfig"]["overrides"] = [right_axis("publish bytes in flight", "bytes")]
    pool = [
        ts("KV blocks by state", targets(
            (f"sum by (state) ({W}kv_blocks{F()})", "{{state}}"),
            (f"sum({W}kv_blocks_reserved{F()})", "reserved (worst case)"),
        ), "short", "lazykv_worker_kv_blocks: used (includes cached), cached (holding reusable chunks), free; "
                    "and blocks reserved for running requests' worst case. Total = used + free."),
        ts("KV pool used by instance", targets((pool_used, "{{instance}}")), "percentunit",
           "used / (used + free) per worker.", maximum=1),
        ts("KV pool cached share", targets((ratio(
            f'sum by (instance) ({W}kv_blocks{F(CACHED)})',
            f'sum by (instance) ({W}kv_blocks{F(ALL_BLOCKS)})',
        ), "{{instance}}")), "percentunit", "Blocks holding cached chunks over all blocks.", maximum=1),
    ]
    bytes_ = [
        ts("KV bytes fetched/s by source", targets((rate(W + "kv_bytes_fetched_total", by="source"), "{{source}}")),
           "Bps", "Chunk bytes fetched from the cache tier: host/disk (embedded tier, in process), remote (cache "
                  "servers over gRPC).", w=12, stack=True),
        ts("KV bytes copied/s", targets((rate(W + "kv_bytes_copied_total"), "copied")), "Bps",
           "KV bytes re-rotated into private copies (block mode only; lazy mode copies nothing).", w=12),
        ts("Fetched bytes/s by transport", targets((rate(W + "tier_fetched_bytes_total", by="transport"),
                                                    "{{transport}}")), "Bps",
           "Chunk bytes fetched from cache servers: grpc, shm (a server on this host, in place), cuda_ipc (its GPU "
           "tier, device to device), nccl (a GPU tier over a link across GPUs).", w=12, stack=True),
    ]
    return dashboard(
        "lazykv-worker",
        "LazyKV / Workers",
        "lazykv-worker: requests, latency, reuse, chunk pipeline, KV pool, bytes.",
        "label_values(lazykv_worker_kv_blocks, job)",
        [
            row("Summary", top),
            row("Requests", requests),
            row("Latency", latency),
            row("Reuse", reuse),
            row("Host path", host_path),
            row("Chunk pipeline", pipeline),
            row("KV pool", pool),
            row("Bytes moved", bytes_, collapsed=True),
        ],
    )


# ----------------------------------------------------------------------------- cache servers
def cache_servers():
    lookup_hit = ratio(rate(C + "hits_total"), rate(C + "lookups_total"))
    top = [
        stat("Cache servers up", f'sum(up{{job=~"$job", instance=~"$instance"}})', "none",
             "Targets of the selected jobs that answer scrapes (sum of up).", (("red", None), ("green", 1)), w=4),
        stat("Host RAM fill (max)", f'max({FILL.replace(F(), F(HOST))})',
             "percentunit", "Host tier occupancy over capacity, the fullest server.", w=4, decimals=1),
        stat("Disk fill (max)", f'max({FILL.replace(F(), F(DISK))})',
             "percentunit", "Disk tier occupancy over capacity, the fullest server (it evicts LRU at its cap).",
             (("green", None), ("orange", 0.9)), w=4, decimals=1),
        stat("Lookup hit ratio", lookup_hit, "percentunit",
             "Keys found (host or disk) over keys looked up, all servers.", (("orange", None), ("green", 0.5)),
             w=4, decimals=1),
        stat("Corrupt values (range)", f"sum(increase({C}corrupt_values_total{F()}[$__range])) or vector(0)",
             "none", "Stored chunks that failed their checksum in the dashboard's time range (dropped, never served).",
             (("green", None), ("red", 1)), w=4, decimals=0),
        stat("Refused calls/s", f"{rate(C + 'rejected_total')} or vector(0)", "ops",
             "Calls refused for any reason (see Integrity and security).", (("green", None), ("orange", 0.1), ("red", 1)),
             w=4),
    ]
    occupancy = [
        ts("Bytes stored by tier", targets(
            (f"sum by (instance, tier) ({C}occupancy_bytes{F()})", "{{instance}} {{tier}}"),
            (f"sum by (tier) ({C}capacity_bytes{F()})", "capacity {{tier}} (all)"),
        ), "bytes", "lazykv_cache_occupancy_bytes per server and tier; capacity summed over servers."),
        ts("Fill by tier", targets((FILL, "{{instance}} {{tier}}")), "percentunit",
           "Occupancy over --host-capacity / --disk-capacity.", maximum=1),
        ts("Chunks stored", targets((f"sum by (instance, tier) ({C}entries{F()})", "{{instance}} {{tier}}")),
           "short", "lazykv_cache_entries per server and tier."),
        ts("Pending disk writes", targets((f"sum by (instance) ({C}pending_disk_writes{F()})", "{{instance}}")),
           "short", "Chunks in host RAM not yet written through to disk (normally drained within a second).", w=12),
        ts("Active streams and waits", targets((f"sum by (instance) ({C}active_streams{F()})", "{{instance}}")),
           "short", "Get/Put streams and lease waits in progress (limit --max-streams).", w=12),
    ]
    traffic = [
        ts("Lookups/s", targets(
            (rate(C + "lookups_total"), "keys looked up"),
            (rate(C + "hits_total", by="tier"), "found in {{tier}}"),
            (rate(C + "misses_total"), "not found"),
        ), "ops", "Chunk keys looked up, found by tier, not found (once per key per lookup)."),
        ts("Lookup hit ratio by tier", targets((
            f"{rate(C + 'hits_total', by='tier')}\n  / ignoring (tier) group_left ()\n({rate(C + 'lookups_total')} > 0)",
            "{{tier}}")), "percentunit", "Keys found in each tier over keys looked up.", stack=True, maximum=1),
        ts("Bytes/s in and out", targets(
            (rate(C + "bytes_in_total"), "in (Put)"),
            (rate(C + "bytes_out_total", by="tier"), "out from {{tier}}"),
        ), "Bps", "Chunk bytes stored by Put and served by Get, by the tier that served them."),
        ts("Bytes/s sent by transport", targets((rate(C + "bytes_sent_total", by="transport"), "{{transport}}")),
           "Bps", "Chunk bytes handed to readers: grpc (Get, streamed), shm (ShmGet: page locations in shared "
                  "memory), cuda_ipc (the GPU tier, to a worker that opened it), nccl (the GPU tier over a link to "
                  "a worker on another GPU), socket (the link's CPU twin, emulated GPU tiers).", stack=True),
        ts("Call latency p99 by method", targets(
            (quantile(0.99, C + "request_seconds", by="method"), "{{method}}")), "s",
           "lazykv_cache_request_seconds p99 per method (a method appears after its first call).", w=12),
        ts("Calls/s by method", targets((rate(C + "request_seconds_count", by="method"), "{{method}}")), "ops",
           "Calls per second per method (the histogram's count).", w=12, stack=True),
    ]
    eviction = [
        ts("Evictions/s by tier", targets((rate(C + "evictions_total", by="tier"), "{{tier}}")), "ops",
           "Chunks that left a tier for space (host: S3-FIFO; disk: LRU). Evicted from disk means recomputed "
           "on next use."),
        ts("Demotions and promotions/s", targets(
            (rate(C + "demotions_total"), "demoted (host RAM to disk only)"),
            (rate(C + "promotions_total"), "promoted (disk to host RAM)"),
            (rate(C + "gpu_promotions_total"), "promoted to the GPU tier"),
            (rate(C + "gpu_demotions_total"), "demoted (GPU tier to host RAM)"),
        ), "ops", "Chunks evicted from host RAM that stay on disk, chunks read from disk back into RAM, chunks "
                  "copied into the GPU tier (--gpu-capacity) when published into free room or read, and chunks "
                  "the GPU tier evicted with no lower copy, stored back in host RAM."),
        ts("Lease grants, waits, expiries/s", targets(
            (rate(C + "lease_grants_total"), "granted"),
            (rate(C + "lease_waits_total"), "waited"),
            (rate(C + "lease_expiries_total"), "expired"),
        ), "ops", "Leases granted (a caller told to compute a missing chunk), Lease calls that waited for "
                  "another caller's computation, and leases that expired before their chunk was published."),
    ]
    integrity = [
        ts("Corrupt values by tier", targets(
            (f"sum by (instance, tier) (increase({C}corrupt_values_total{F()}[{RI}]))", "{{instance}} {{tier}}")),
           "short", "Stored chunks that failed their checksum and were dropped (DATA_LOSS to the caller)."),
        ts("Refused calls/s by reason", targets((rate(C + "rejected_total", by="reason"), "{{reason}}")), "ops",
           AUTH_DESC.split(" Workers:")[0] + " A reason appears after its first event.", stack=True),
        ts("Invalid-chunk reports/s", targets((rate(C + "invalid_reports_total", by="outcome"), "{{outcome}}")),
           "ops", "ReportInvalid calls from workers that refused a fetched chunk: dropped, stale (another "
                  "version stored), verified_good (this server checked it and kept it)."),
    ]
    return dashboard(
        "lazykv-cache-server",
        "LazyKV / Cache servers",
        "lazykv-cache-server: occupancy, traffic, eviction, leases, integrity and refused calls.",
        "label_values(lazykv_cache_capacity_bytes, job)",
        [
            row("Summary", top),
            row("Occupancy", occupancy),
            row("Traffic", traffic),
            row("Eviction and leases", eviction),
            row("Integrity and security", integrity),
        ],
    )


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, d in (("lazykv-overview", overview()), ("lazykv-worker", workers()),
                    ("lazykv-cache-server", cache_servers())):
        path = os.path.join(OUT_DIR, name + ".json")
        with open(path, "w") as f:
            json.dump(d, f, indent=2)
            f.write("\n")
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
