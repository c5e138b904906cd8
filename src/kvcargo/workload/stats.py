"""Statistics of a request stream (``kvcargo trace-stats``): size, lengths, burstiness, prefix reuse,
and — given a model — the bandwidth its KV hand-offs ask of the link.

All values are plain numbers in SI units (seconds, bytes, bytes per second, requests per second);
percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvcargo.catalog import Link, Model
from kvcargo.errors import KvcargoError
from kvcargo.workload.stream import BLOCK_TOKENS, Workload
from kvcargo.workload.traces import mean_rate

BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""Candidate widths of the arrival-rate timeline; the smallest giving at most 60 buckets wins."""
MAX_BUCKETS = 60


MIN_BUCKET_S = 1e-6
"""Narrowest --bucket: a microsecond, as --rate's range (narrower, one arrival is an infinite rate)."""
MOST_BUCKETS = 1_000_000
"""Most buckets a given --bucket may cut the timeline into (a typo must not exhaust the machine)."""


def auto_bucket(duration: float) -> float:
    """A round bucket width (s) that cuts ``duration`` into at most 60 buckets."""
    for b in BUCKETS_S:
        if duration / b <= MAX_BUCKETS:
            return float(b)
    return float(math.ceil(duration / MAX_BUCKETS))


def _lengths(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "median": float(np.median(x)), "p99": float(np.percentile(x, 99)),
            "min": int(x.min()), "max": int(x.max()), "total": int(x.sum())}


def timeline(arrival: np.ndarray, bucket_s: float, weights: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Per-bucket sums (of 1, or of ``weights``) per second, from the first arrival to the last.

    Returns (values, full): the first ``full`` buckets are ``bucket_s`` wide; a trailing partial
    bucket (up to the last arrival) is divided by its own width.
    """
    t = arrival - arrival[0]
    duration = float(t[-1])
    full = int(math.floor(duration / bucket_s))
    tail = duration - full * bucket_s if full else duration  # (not 0 * bucket_s: NaN for an infinite bucket)
    n = full + 1 if tail > 0 or full == 0 else full
    idx = np.minimum((t // bucket_s).astype(np.int64), n - 1)
    sums = np.bincount(idx, weights=weights, minlength=n).astype(np.float64)
    widths = np.full(n, float(bucket_s))
    if tail > 0:
        widths[-1] = tail
    return sums / widths, full


def _extremes(values: np.ndarray, full: int) -> tuple[float, float]:
    """(max, min) over the full-width buckets (all buckets when none is full)."""
    v = values[:full] if full > 0 else values
    return float(v.max()), float(v.min())


def trace_stats(w: Workload, bucket_s: float | None = None, model: Model | None = None,
                links: Iterable[Link] = ()) -> dict[str, Any]:
    """Every statistic of ``trace-stats`` as a dict (see the module docstring for units).

    ``blocks.reused_share``: the share of prompt blocks (Mooncake ``hash_ids``) whose id already
    appeared in an earlier request — an upper bound on what a prefix cache could skip. With a
    ``model``: the hand-off demand by arrival time (mean and busiest bucket) and, for each link,
    whether one channel carries the busiest bucket.
    """
    n = len(w)
    arrival = w.arrival
    duration = float(arrival[-1] - arrival[0])
    gaps = np.diff(arrival)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else math.nan
    bucket = auto_bucket(duration) if bucket_s is None else float(bucket_s)
    if not (bucket > 0 and math.isfinite(bucket)):
        raise KvcargoError(f"--bucket must be a positive number of seconds, got {bucket_s!r}")
    if duration / bucket > MOST_BUCKETS:
        raise KvcargoError(f"--bucket {bucket:g} cuts the trace's {duration:g} s into more than {MOST_BUCKETS:,} "
                           f"buckets: use at least {duration / MOST_BUCKETS:.3g} s")
    if bucket < MIN_BUCKET_S:
        raise KvcargoError(f"--bucket {bucket:g} is below {MIN_BUCKET_S:g} s: one arrival in it is a rate beyond any "
                           "the timeline can show")
    rates, full = timeline(arrival, bucket)
    peak, low = _extremes(rates, full)
    out: dict[str, Any] = {
        "source": w.source,
        "requests": n,
        "duration_s": duration,
        "mean_rate": mean_rate(arrival),
        "prompt": _lengths(w.prompt),
        "output": _lengths(w.output),
        "interarrival_cv": cv,
        "timeline": {"bucket_s": bucket, "start_s": float(arrival[0]), "rate": rates.tolist(),
                     "full_buckets": full, "peak_rate": peak, "min_rate": low},
        "blocks": None,
    }
    if w.block_ids is not None and len(w.block_ids):
        total = len(w.block_ids)
        unique = len(np.unique(w.block_ids))
        out["blocks"] = {"block_tokens": BLOCK_TOKENS, "total": total, "unique": unique,
                         "reused": total - unique, "reused_share": (total - unique) / total}
    if model is not None:
        out["handoff"] = handoff_demand(w, model, bucket, links)
    return out


def handoff_demand(w: Workload, model: Model, bucket_s: float, links: Iterable[Link] = ()) -> dict[str, Any]:
    """Bytes per second the trace's KV hand-offs put on the link, by arrival time."""
    from kvcargo.cost import shape

    s = shape(model)
    nbytes = s.handoff_bytes(np.asarray(w.prompt, dtype=np.int64)).astype(np.float64)
    total = float(nbytes.sum())
    duration = float(w.arrival[-1] - w.arrival[0])
    per_bucket, full = timeline(w.arrival, bucket_s, nbytes)
    mean = total / duration if duration > 0 else math.nan
    peak = _extremes(per_bucket, full)[0]
    rows = []
    for ln in links:
        cap = ln.bandwidth * ln.channels
        rows.append({"link": ln.key, "name": ln.name, "bandwidth": cap, "mean_load": mean / cap,
                     "peak_load": peak / cap, "carries_peak": bool(peak <= cap)})
    rows.sort(key=lambda r: r["bandwidth"])
    smallest = next((r["link"] for r in rows if r["carries_peak"]), None)
    return {"model": model.key, "kv_bytes_per_token": s.kv_per_token, "bytes_total": total,
            "mean_bytes_per_s": mean, "peak_bytes_per_s": peak, "bucket_s": bucket_s,
            "mean_bytes_per_request": float(nbytes.mean()), "links": rows, "smallest_sufficient_link": smallest}
