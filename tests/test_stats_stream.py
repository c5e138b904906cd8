"""Exact statistics of a sample received in chunks: the same figures as the whole sample's, bit
for bit, in memory or spilled to a file, and the workload drawn in chunks from one stream."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcargo.metrics import describe, describe_weighted
from kvcargo.stats import ExactSum, Sample, exact_sum, exact_weighted_mean
from kvcargo.workload.generator import LengthDist, generate, generate_chunks


def samples(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.lognormal(-3, 1, 5000),
        np.round(rng.lognormal(-3, 0.5, 5000), 4),  # many ties
        np.concatenate([np.zeros(100), rng.uniform(0, 1e-300, 100), rng.uniform(1e3, 1e5, 3000)]),
        np.full(3001, 0.125),
        rng.normal(0, 1, 4001),  # negative values too
    ]


def cut(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    edges = np.sort(rng.integers(0, len(x), 20))
    return np.split(x, edges)


@pytest.mark.parametrize("limit", [0, 1 << 30], ids=["spilled", "in-memory"])
@pytest.mark.parametrize("which", range(5))
def test_a_chunked_sample_describes_as_the_whole(which: int, limit: int) -> None:
    rng = np.random.default_rng(which)
    x = samples(7)[which]
    s = Sample(limit=limit)
    for part in cut(x, rng):
        s.add(part)
    assert s.describe("x") == describe(x, "x")


@pytest.mark.parametrize("limit", [0, 1 << 30], ids=["spilled", "in-memory"])
@pytest.mark.parametrize("which", range(5))
def test_a_chunked_weighted_sample_describes_as_the_whole(which: int, limit: int) -> None:
    rng = np.random.default_rng(which + 10)
    x = samples(8)[which]
    w = rng.integers(0, 40, len(x))
    w[::7] = 0
    s = Sample(weighted=True, limit=limit)
    edges = np.sort(rng.integers(0, len(x), 20))
    for part, pw in zip(np.split(x, edges), np.split(w, edges)):
        s.add(part, pw)
    got, want = s.describe("x"), describe_weighted(x.copy(), w.copy(), "x")
    assert got == want and list(got) == list(want)


def test_the_radix_selection_reaches_whole_keys() -> None:
    """Many equal values hold one rank bucket through every pass down to the full key."""
    import kvcargo.stats as stats

    x = np.concatenate([np.full(1000, 0.3), np.nextafter(np.full(999, 0.3), 1), [0.2, 0.4]])
    s = Sample(limit=0)
    s.add(x)
    old, stats.GATHER = stats.GATHER, 1
    try:
        assert s.describe("x") == describe(x, "x")
    finally:
        stats.GATHER = old


def test_exact_sums_accumulate_in_any_chunking() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1e10, 2000), rng.normal(0, 1e-10, 2000), [1e300, -1e300]])
    w = rng.integers(0, 1000, len(x))
    total, weighted = ExactSum(), ExactSum()
    for part, pw in zip(np.array_split(x, 13), np.array_split(w, 13)):
        total.add(part)
        weighted.add(part, pw)
    assert total.value() == exact_sum(x) == math.fsum(x.tolist())
    assert weighted.value() / int(w.sum()) == exact_weighted_mean(x, w)
    special = ExactSum()
    special.add(np.array([1.0, math.inf]))
    assert special.value() == math.inf


@pytest.mark.parametrize("size", [1, 999, 10_000, 20_001])
def test_the_workload_drawn_in_chunks_is_the_whole_workload(size: int) -> None:
    p, o = LengthDist(2048), LengthDist(256, 0.5, hi=300)
    whole = generate(20_001, 100.0, p, o, 3)
    parts = list(generate_chunks(20_001, 100.0, p, o, 3, size))
    assert all(len(c) == size for c in parts[:-1])
    for name in ("arrival", "prompt", "output"):
        assert np.array_equal(np.concatenate([getattr(c, name) for c in parts]), getattr(whole, name))
    assert sum(c.clipped_outputs for c in parts) == whole.clipped_outputs > 0
