"""The calculator: the chapter's closed forms, and the layer-wise formula against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcargo import catalog
from kvcargo.cost import Pool
from kvcargo.errors import KvcargoError
from kvcargo.handoff import calculate, exposed_after_prefill
from kvcargo.transfer import Compression, endpoint_work, transfers

CAT = catalog.builtin()
H100 = Pool(CAT.device("h100"))


def _calc(link: str = "eth-25g", codec: str | None = None, send: str = "whole", model: str = "llama3-8b",
          prompt: int = 2048, pool: Pool = H100):
    comp = Compression(CAT.codec(codec)) if codec else None
    return calculate(CAT.model(model), prompt, CAT.link(link), pool, comp, send)


def test_chapter_panel_over_25_gbe() -> None:
    r = _calc()
    assert (r.kv_bytes_per_token, r.kv_bytes, r.wire_bytes) == (131_072, 268_435_456, 268_435_456.0)
    assert round(r.transfer_s * 1e3, 1) == 85.9 and r.exposed_s == r.transfer_s
    assert round(r.prefill_s * 1e3, 3) == 59.033
    assert round(r.link_full_rps, 1) == 11.6
    assert _calc(model="llama3-70b", pool=Pool(CAT.device("h100"), 4)).kv_bytes == 671_088_640


@pytest.mark.parametrize("link, ms, joules", [
    ("nvlink4", 0.6015, 0.01074), ("cpo-optical", 1.3472, 0.006442), ("ib-ndr", 5.3787, 0.03221),
    ("eth-100g", 21.4948, 0.03221), ("eth-25g", 85.9193, 0.03221),
])
def test_link_table_of_spec_4(link: str, ms: float, joules: float) -> None:
    assert round(_calc(link).transfer_s * 1e3, 4) == ms
    t = transfers(CAT.link(link), None, np.array([268_435_456.0]), 2.0)
    assert round(float(t.link_j[0]), 6 if joules < 0.01 else 5) == joules


def test_layerwise_and_compression_of_the_chapter() -> None:
    assert round(_calc(send="layerwise").exposed_s * 1e3, 1) == 28.7
    assert round(_calc(send="layerwise", codec="fp8").exposed_s * 1e3, 2) == 1.36
    assert round(_calc(codec="fp4-block").ratio, 2) == 3.76
    assert _calc(codec="fp4-block").ratio == 64 / 17
    assert _calc(link="ib-ndr", send="layerwise").exposed_s < _calc(link="ib-ndr").exposed_s


def _brute_force_layerwise(latency: float, wire_s: float, prefill_s: float, layers: int) -> float:
    """Per layer: its KV is ready when its prefill share ends; slices leave in order, one at a
    time, each taking wire_s/L. Returns the time the last slice lands after the prefill ends."""
    link_free = 0.0
    for layer in range(1, layers + 1):
        start = max(layer * prefill_s / layers, link_free)
        link_free = start + wire_s / layers
    return latency + link_free - prefill_s


@settings(max_examples=300, deadline=None)
@given(latency=st.floats(0, 1e-3), wire=st.floats(1e-6, 5.0), prefill=st.floats(1e-4, 5.0),
       layers=st.integers(1, 128))
def test_layerwise_formula_matches_a_per_layer_pipeline(latency: float, wire: float, prefill: float, layers: int) -> None:
    closed = exposed_after_prefill(latency, wire, prefill, layers, "layerwise")
    assert math.isclose(closed, _brute_force_layerwise(latency, wire, prefill, layers), rel_tol=1e-9, abs_tol=1e-12)
    assert closed <= exposed_after_prefill(latency, wire, prefill, layers, "whole") + 1e-12


def test_transit_and_endpoint_figures_of_spec_5() -> None:
    n = np.array([162_004_992.0])  # 1,236 tokens of Llama-3-8B
    link = CAT.link("eth-25g")
    fp8 = transfers(link, Compression(CAT.codec("fp8")), n, 2.0)
    assert fp8.duration[0] == 20e-6 + 1e-6 + (n[0] / 2) / 3.125e9 and not fp8.transit_bound[0]
    fp4 = transfers(link, Compression(CAT.codec("fp4-block")), n, 2.0)
    assert fp4.transit_bound[0] and fp4.duration[0] == 21e-6 + (2 * n[0] / 2) / (1.6 * 3.125e9)
    assert fp4.transit_j[0] == n[0] * 8 * 1e-12
    ops, nbytes = endpoint_work(Compression(CAT.codec("freq-keep-k"), "endpoint"), n, np.array([1236]), 2.0)
    assert ops[0] == (1 + 5 * 11) * n[0] / 2 and nbytes[0] == n[0] + n[0] / 2
    assert Compression(CAT.codec("freq-keep-k"), keep=0.25).ratio == 4.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=0), "prompt must be a positive whole number"),
    (dict(prompt=-3), "prompt must be a positive whole number"),
    (dict(model="llama3-70b"), "does not fit the prefill pool"),
    (dict(send="sideways"), "unknown send mode 'sideways'; valid choices: layerwise, whole"),
])
def test_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(KvcargoError, match=message):
        _calc(**kwargs)


def test_kv_keep_only_for_frequency_codec() -> None:
    with pytest.raises(KvcargoError, match="--kv-keep applies only to freq-keep-k"):
        Compression(CAT.codec("fp8"), keep=0.5)
    with pytest.raises(KvcargoError, match=r"--kv-keep must be in \(0, 1\]"):
        Compression(CAT.codec("freq-keep-k"), keep=1.5)
