"""Random default-path configurations: the engine and the spec-only oracle agree bit for bit.

The oracle (:mod:`oracle`) restates the step costs, hand-offs, statistics and summary from
reference-semantics alone, so a rounding rule that kvcargo gets wrong shows up here. Hypothesis
draws what the reference's flags allow — models, pool sizes, devices per pool, per-pool devices,
links and channels, codecs and placements, power caps (global and per pool), DVFS, lengths,
rates, seeds, the colocated mode — and every request timestamp, every per-instance total and
every summary key must be equal (``==``; NaN only where both are NaN).

CI runs this file compiled with numba and as plain Python (``KVCARGO_JIT=0``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from kvcargo.config import SimConfig, resolve
from kvcargo.engine.cluster import EngineOutput, run
from kvcargo.errors import KvcargoError
from kvcargo.metrics import summarize

try:
    from oracle import OracleResult, run_resolved
    from oracle import summarize as oracle_summary
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.oracle import OracleResult, run_resolved  # type: ignore[no-redef]
    from tests.oracle import summarize as oracle_summary  # type: ignore[no-redef]

STAMPS = ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish")
MODELS = ["llama3-8b", "llama3-70b", "mistral-7b", "yi-34b", "opt-13b", "mixtral-8x7b", "llama3.2-1b"]
DEVICES = ["h100", "a100", "a100-40g", "h200", "b200"]
LINKS = ["ib-ndr", "nvlink4", "pcie5", "pcie4", "eth-100g", "eth-25g", "cpo-optical", "nvlink3", "nvlink5"]
CAPS = [250.0, 300.0, 350.0, 450.0, 550.0, 650.0, 900.0]
"""Per-device caps: every one is above every preset's static power."""
LEVER_KEYS = {"prefix_saved_bytes", "prefix_hit_rate", "energy_scale_up_j", "share_scale_up", "clipped_prompts",
              "clipped_outputs", "kv_cap_prefill", "kv_cap_decode", "kv_cap_colocated", "link_gbytes_per_s", "silicon_mm2"}
"""Summary keys of options beyond the reference (their default values are not spec figures)."""


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    kw: dict[str, Any] = dict(
        model=draw(st.sampled_from(MODELS)), devices_per_instance=draw(st.sampled_from([1, 2, 4, 8])),
        seed=draw(st.integers(0, 2**20)), requests=draw(st.integers(1, 160)),
        rate=draw(st.sampled_from([0.3, 1.0, 3.0, 8.0, 20.0, 60.0])),
        prompt=float(draw(st.sampled_from([8, 100, 441, 1200, 2048, 3600]))),
        prompt_cv=draw(st.sampled_from([0.0, 0.3, 0.5, 1.0])),
        output=float(draw(st.sampled_from([1, 2, 17, 120, 300]))), output_cv=draw(st.sampled_from([0.0, 0.5, 0.9])),
        prefill=draw(st.integers(1, 4)), decode=draw(st.integers(1, 3)),
    )
    if draw(st.booleans()):
        kw["dvfs"] = True
    if draw(st.booleans()):
        kw["power_cap"] = draw(st.sampled_from(CAPS))
    if draw(st.booleans()) and draw(st.booleans()):
        kw |= dict(mode="colocated", device=draw(st.sampled_from(DEVICES)))
        return SimConfig.build(**kw)
    kw |= dict(link=draw(st.sampled_from(LINKS)), link_channels=draw(st.integers(1, 3)))
    for pool in ("prefill", "decode"):
        if draw(st.booleans()):
            kw[f"{pool}_device"] = draw(st.sampled_from(DEVICES))
        if draw(st.booleans()) and draw(st.booleans()):
            kw[f"{pool}_devices_per_instance"] = draw(st.sampled_from([1, 2, 4, 8]))
        if draw(st.booleans()) and draw(st.booleans()):
            kw[f"{pool}_power_cap"] = draw(st.sampled_from(CAPS))
    if draw(st.booleans()):
        kw["kv_compress"] = codec = draw(st.sampled_from(["none", "fp8", "fp4-block", "freq-keep-k"]))
        kw["kv_compress_at"] = draw(st.sampled_from(["transit", "endpoint"]))
        if codec == "freq-keep-k" and draw(st.booleans()):
            kw["kv_keep"] = draw(st.sampled_from([0.125, 0.25, 0.3, 0.5, 0.75]))
    return SimConfig.build(**kw)


def _equal(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assert_same_run(out: EngineOutput, ora: OracleResult) -> None:
    """Stamps, per-instance totals and every summary key, bit for bit."""
    for col in STAMPS:
        a, b = getattr(out, col), getattr(ora, col)
        ok = (a == b) | (np.isnan(a) & np.isnan(b))
        assert ok.all(), f"{col}: first differing request {int(np.argmin(ok))}: {a[~ok][0]!r} vs {b[~ok][0]!r}"
    totals = out.totals
    assert totals.busy_s.tolist() == ora.busy_s
    assert totals.compute_j.tolist() == ora.compute_j and totals.memory_j.tolist() == ora.memory_j
    assert totals.bytes.tolist() == ora.bytes
    assert [int(s) for s in totals.steps.tolist()] == [i.steps for i in ora.instances]
    got, want = summarize(out), oracle_summary(ora, out.resolved.config.ttft_slo, out.resolved.config.tpot_slo)
    assert set(got) - set(want) <= LEVER_KEYS
    bad = {k: (got[k], v) for k, v in want.items() if k != "instances" and not _equal(got[k], v)}
    assert not bad, f"summary keys differ (engine, oracle): {bad}"
    for mine, theirs in zip(got["instances"], want["instances"], strict=True):
        bad = {k: (mine[k], v) for k, v in theirs.items() if not _equal(mine[k], v)}
        assert not bad, f"{theirs['name']}: {bad}"


@settings(max_examples=40, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(configs())
def test_engine_equals_spec_oracle_on_random_configurations(config: SimConfig) -> None:
    """No shrinking (a failing configuration is printed whole; shrinking one takes minutes)."""
    try:
        res = resolve(config)
    except KvcargoError:  # the model does not fit an instance of this size
        assume(False)
    assert_same_run(run(res), run_resolved(res))
