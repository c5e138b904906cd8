"""A windowed summary-only run (engine/window.py) has the whole run's summary, bit for bit.

Tiny chunks make the engine pause before almost every arrival and give settled requests' pages
back to the system, so a handler reading a settled request's rows (zeros once given back) or a
resumed arrival out of its place in the event order would change the figures.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import pytest

from kvcargo.config import SimConfig, resolve
from kvcargo.engine.cluster import run
from kvcargo.engine.window import Pages, run_windowed, windowable
from kvcargo.metrics import summarize
from kvcargo.simulation import simulate


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two summaries differ: keys, types, or values (``==``; NaN equals NaN)."""
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [(path, sorted(a), sorted(b))]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [(path, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [(path, a, b)]


CASES = {
    "default": dict(requests=700, rate=20),
    "saturated": dict(requests=700, rate=200, max_batch=3),  # the queue grows: settling lags arrivals
    "rejections": dict(model="opt-13b", device="a100-40g", requests=700, rate=8, prompt=6000, prompt_cv=1.5,
                       output=20, output_cv=1.0),  # 11,969 KV tokens: the long prompts are turned away
    "one-token outputs": dict(requests=500, rate=30, output=2, output_cv=1.0),
    "colocated": dict(requests=500, rate=10, mode="colocated"),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("chunk", [16, 64])
def test_windowed_summary_equals_whole(name: str, chunk: int) -> None:
    res = resolve(SimConfig.build(**CASES[name]))
    assert windowable(res)
    whole = summarize(run(res))
    # a held sample of a few kilobytes goes to its temporary file: the radix selection is exercised
    windowed = summarize(run_windowed(res, chunk=chunk, held_bytes=4096))
    assert differences(whole, windowed) == []
    if name == "rejections":
        assert whole["rejected"] > 0 and whole["completed"] > 0


def test_summary_only_is_windowed_and_equal() -> None:
    config = SimConfig.build(requests=300, rate=25)
    result = simulate(config, summary_only=True)
    assert result.output.figures is not None and len(result.output.arrival) == 0
    assert differences(simulate(config).summary, result.summary) == []


@pytest.mark.parametrize("option", [dict(kv_compress="fp8"), dict(send="layerwise"),
                                    dict(link_sharing="fair"), dict(kv_reserve="at-transfer")])
def test_opt_in_models_run_whole(option: dict) -> None:
    """Options with extra per-request arrays are not windowed; their summary is the same."""
    config = SimConfig.build(requests=200, rate=25, **option)
    assert not windowable(resolve(config))
    result = simulate(config, summary_only=True)
    assert result.output.figures is None
    assert differences(simulate(config).summary, result.summary) == []


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="pages are given back on Linux only")
def test_pages_below_the_settled_requests_are_given_back() -> None:
    per_page = mmap.PAGESIZE // 64  # rows of 64 bytes
    pages = Pages()
    a = pages.zeros((4 * per_page, 8))
    a[:] = 1.0
    pages.give_back(3 * per_page - 1)  # whole pages only: two go back and read as zeros
    assert not a[:2 * per_page].any() and (a[2 * per_page:] == 1.0).all()
