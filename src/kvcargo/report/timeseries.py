"""Per-request records → what the plots show: latency CDFs and the KV link over time.

* :func:`latency_cdf` — quantiles of a sample at evenly spaced percentiles, computed exactly as
  the summary computes its percentiles (:func:`kvcargo.stats.percentiles`), so the curve passes
  through the summary's p50 and p99.
* :func:`interval_series` — the time-average of a count of open intervals over equal bins,
  integrated exactly (no sampling): the mean over all bins times the span is the sum of the
  interval lengths inside it.
* :func:`link_series` — the link's busy channels (``kv_start → kv_ready``) and its queue
  (``first_token → kv_start``) over the run, so their overall means equal the summary's
  ``link_busy`` and ``link_mean_wait_s × transfers / horizon_s`` (Little's law).
* :func:`plot_data` — both for a :class:`~kvcargo.simulation.SimResult` (the web page's plots).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvcargo.stats import percentiles as quantiles

if TYPE_CHECKING:
    from kvcargo.simulation import SimResult

CDF_PERCENTILES = np.linspace(0.0, 100.0, 201)
"""0, 0.5, 1, …, 100: the curve includes p50, p90 and p99 themselves."""


def latency_cdf(sample: np.ndarray, percentiles: np.ndarray = CDF_PERCENTILES) -> list[float]:
    """The sample's quantiles at ``percentiles`` (empty list for an empty sample)."""
    x = np.asarray(sample, dtype=np.float64)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return []
    return quantiles(x, tuple(percentiles.tolist()))


def _area(points: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``Σ_i max(0, t − points_i)`` at each ``t`` of ``edges`` (sorted cumulative sums)."""
    p = np.sort(points)
    csum = np.concatenate([[0.0], np.cumsum(p)])
    k = np.searchsorted(p, edges, side="left")
    return edges * k - csum[k]


def interval_series(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean number of open ``[start_i, end_i)`` intervals in each bin ``[edges_k, edges_k+1)``.

    Pairs where either end is NaN are ignored. Exact: the count is a step function, its integral
    ``A(t) = Σ_i (max(0, t − s_i) − max(0, t − e_i))`` is evaluated at the bin edges.
    """
    s = np.asarray(start, dtype=np.float64)
    e = np.asarray(end, dtype=np.float64)
    ok = ~(np.isnan(s) | np.isnan(e))
    edges = np.asarray(edges, dtype=np.float64)
    area = _area(s[ok], edges) - _area(e[ok], edges)
    return np.maximum(np.diff(area) / np.diff(edges), 0.0)  # a count: no rounding below zero


def link_series(ready: np.ndarray, kv_start: np.ndarray, kv_ready: np.ndarray, horizon: float,
                channels: int, bins: int = 200) -> dict[str, Any]:
    """The KV link over ``[0, horizon]`` in ``bins`` equal bins.

    ``t``: bin centres (s); ``busy``: mean fraction of the ``channels`` in use; ``queue``: mean
    number of hand-offs waiting for a channel (``ready``: when each could start, see
    :func:`kvcargo.metrics.handoff_start`; a layer-wise one whose first slice left earlier never
    waits).
    """
    if bins < 1:
        raise ValueError("bins must be at least 1")
    horizon = float(horizon) if horizon > 0 else 1.0
    edges = np.linspace(0.0, horizon, bins + 1)
    busy = interval_series(kv_start, kv_ready, edges) / channels
    queue = interval_series(ready, np.fmax(kv_start, ready), edges)
    return {
        "t": ((edges[:-1] + edges[1:]) / 2).tolist(),
        "bin_s": horizon / bins,
        "channels": int(channels),
        "busy": busy.tolist(),
        "queue": queue.tolist(),
    }


def latency_samples(result: SimResult) -> dict[str, np.ndarray]:
    """The samples behind the run's summary ttft, tpot and handoff figures (seconds; see
    :func:`kvcargo.metrics.latency_samples`): TTFT and TPOT over the steady requests (warm-up
    excluded, TPOT for outputs of 2+ tokens); hand-off over every request that had one."""
    from kvcargo import metrics

    out = result.output
    return metrics.latency_samples(out, metrics.steady_requests(out))


def plot_data(result: SimResult, bins: int = 200) -> dict[str, Any]:
    """What the web page plots for one run: ``cdf`` (percentiles and each latency's quantiles,
    seconds) and ``link`` (see :func:`link_series`)."""
    from kvcargo.metrics import handoff_start

    out = result.output
    res = out.resolved
    cdf: dict[str, Any] = {"percentiles": CDF_PERCENTILES.tolist()}
    cdf |= {k: latency_cdf(v) for k, v in latency_samples(result).items()}
    return {
        "cdf": cdf,
        "link": link_series(handoff_start(out), out.kv_start, out.kv_ready, out.horizon, res.channels, bins),
    }
