"""The engine against the truth: the published per-request runs and the SimPy oracle.

* Every request of the seven published runs, bit for bit (``==`` on floats; one run's decode
  stamps to one ulp, see :data:`ONE_ULP`).
* Hypothesis-generated configurations (pools, heterogeneous devices, links, channels, codecs,
  placements, power caps and DVFS, small batch limits and budgets, rates from light to
  overloaded, rejections, fixed lengths and simultaneous arrivals that create exact ties): the
  engine and the independent SimPy oracle agree on every timestamp and every per-instance total.

CI runs this file twice: compiled with numba and as plain Python (``KVCARGO_JIT=0``).
"""

from __future__ import annotations

import csv
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcargo.config import SimConfig, resolve
from kvcargo.engine.cluster import EngineOutput, run
from kvcargo.engine.state import LOG_FULL, REJECTED
from kvcargo.workload import Workload

try:
    from oracle import OracleResult, run_resolved
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.oracle import OracleResult, run_resolved  # type: ignore[no-redef]

DATA = Path(__file__).resolve().parent / "data" / "reference-runs"
STAMPS = ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish")

PUBLISHED = {
    "s14_gqa_ib-ndr_rate8": {},
    "s14_gqa_eth-25g_rate8": {"link": "eth-25g"},
    "s15_sweep_eth25g_rate14_none_transit": {"link": "eth-25g", "rate": 14.0},
    "s15_sweep_eth25g_rate14_fp8_transit": {"link": "eth-25g", "rate": 14.0, "kv_compress": "fp8"},
    "s15_sweep_eth25g_rate14_fp8_endpoint": {"link": "eth-25g", "rate": 14.0, "kv_compress": "fp8",
                                             "kv_compress_at": "endpoint"},
    "s10_h100p_a100d": {"decode_device": "a100"},
    "s10_2xa100p_h100d": {"prefill_device": "a100", "prefill": 2},
}
ONE_ULP = {"s10_h100p_a100d": ("decode_start", "finish")}
"""Stamps that may differ by one ulp: this run's A100 decode steps follow a memory time of
``(bytes/1e12)/(2.039·0.8)``, where reference-semantics §2 (and every random-configuration run of
the companion) has ``bytes/((2.039 × 1e12 · 0.8)·n)``; its summary figures are equal either way."""


@cache
def _reference(name: str) -> tuple[dict[str, str], ...]:
    with open(DATA / f"{name}.csv", newline="") as f:
        return tuple(csv.DictReader(f))


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_engine_reproduces_published_run(name: str) -> None:
    out = run(resolve(SimConfig.build(**PUBLISHED[name])))
    rows = _reference(name)
    assert len(rows) == len(out.arrival) == 800
    for col in STAMPS:
        ref = np.array([float(r[col]) if r[col] else math.nan for r in rows])
        ok = _same(getattr(out, col), ref)
        if col in ONE_ULP.get(name, ()):
            ulp = np.array([math.ulp(x) for x in ref])
            ok |= np.abs(getattr(out, col) - ref) <= ulp
        assert ok.all(), f"{col}: first differing request {int(np.argmin(ok))}"


def test_engine_pauses_and_resumes_with_a_tiny_step_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine pauses when its step log is full; resuming with a larger log changes nothing."""
    res = resolve(SimConfig.build(link="eth-25g", requests=300))
    whole = run(res)
    import kvcargo.engine.cluster as cluster

    real_new, real_grown, grew = cluster.new_state, cluster.grown, []
    monkeypatch.setattr(cluster, "new_state", lambda *a, **k: real_new(*a, **{**k, "log_capacity": 3}))
    monkeypatch.setattr(cluster, "grown", lambda st, code: grew.append((code, len(st.logf))) or real_grown(st, code))
    paused = run(res)
    logs = [cap for code, cap in grew if code == LOG_FULL]
    assert logs[:3] == [3, 6, 12]  # it really started from a 3-step log and doubled it
    for col in STAMPS:
        assert _same(getattr(paused, col), getattr(whole, col)).all()
    assert np.array_equal(paused.steps, whole.steps) and paused.horizon == whole.horizon


# ------------------------------------------------------------------- differential vs the oracle


def assert_agree(out: EngineOutput, ora: OracleResult) -> None:
    """Every timestamp bit for bit; per-instance totals and link totals too."""
    assert np.array_equal(out.status == REJECTED, ora.rejected)
    for col in STAMPS:
        ok = _same(getattr(out, col), getattr(ora, col))
        assert ok.all(), f"{col}: first differing request {int(np.argmin(ok))}"
    assert out.horizon == ora.horizon
    assert out.stats[:, 0].tolist() == ora.busy_s
    assert out.stats[:, 3].tolist() == ora.compute_j and out.stats[:, 4].tolist() == ora.memory_j
    assert out.transfers == ora.n_transfers
    assert out.link_j == ora.link_j and out.transit_j == ora.transit_j
    assert out.link_busy_s == ora.link_busy_s
    # every token gap: the engine logs steps, the oracle keeps per-request lists
    for r in np.flatnonzero(~np.isnan(out.finish) & (out.output >= 2))[:50]:
        d, k, n = out.decode_inst[r], out.first_step[r], out.output[r] - 1
        ends = out.steps[out.step_inst[:, 0] == d, 1]
        gaps = [ends[k] - out.first_token[r]] + [ends[j] - ends[j - 1] for j in range(k + 1, k + n)]
        assert gaps == ora.itls[r]


DEVICES = ["h100", "a100", "h200", "b200", "a100-40g"]
LINKS = ["ib-ndr", "eth-25g", "eth-100g", "nvlink4", "cpo-optical", "pcie5"]


@st.composite
def configs(draw: st.DrawFn) -> tuple[SimConfig, bool]:
    colocated = draw(st.booleans()) and draw(st.booleans())
    model, device = draw(st.sampled_from([
        ("llama3-8b", "h100"), ("llama3-8b", "a100"), ("llama3.2-1b", "h100"), ("mistral-7b", "a100"),
        ("opt-13b", "a100-40g"),  # 11,969 KV tokens: long requests are rejected
    ]))
    kw: dict = dict(
        model=model, device=device, seed=draw(st.integers(0, 10_000)),
        requests=draw(st.integers(1, 120)), rate=draw(st.sampled_from([0.5, 2.0, 8.0, 25.0, 200.0])),
        prompt=float(draw(st.sampled_from([16, 300, 2048, 6000]))), prompt_cv=draw(st.sampled_from([0.0, 0.5, 1.5])),
        output=float(draw(st.sampled_from([1, 2, 20, 200]))), output_cv=draw(st.sampled_from([0.0, 0.5, 1.0])),
        max_batch=draw(st.sampled_from([1, 3, 256])), token_budget=draw(st.sampled_from([512, 8192])),
    )
    if draw(st.booleans()):
        kw["dvfs"] = True
    if draw(st.booleans()):
        kw["power_cap"] = float(draw(st.sampled_from([250, 400, 650])))
    if colocated:
        kw |= dict(mode="colocated", instances=draw(st.integers(1, 3)))
    else:
        kw |= dict(
            prefill=draw(st.integers(1, 3)), decode=draw(st.integers(1, 3)),
            link=draw(st.sampled_from(LINKS)), link_channels=draw(st.integers(1, 3)),
        )
        if draw(st.booleans()):
            kw["decode_device"] = draw(st.sampled_from(["h100", "h200", "b200"])) if model != "opt-13b" else device
        if draw(st.booleans()):
            kw["kv_compress"] = draw(st.sampled_from(["none", "fp8", "fp4-block", "freq-keep-k"]))
            kw["kv_compress_at"] = draw(st.sampled_from(["transit", "endpoint"]))
    return SimConfig.build(**kw), draw(st.booleans())


def _with_ties(w: Workload) -> Workload:
    """Arrivals rounded to 0.25 s: simultaneous arrivals, as in real traces."""
    return Workload(np.round(w.arrival * 4) / 4, w.prompt, w.output, source="rounded")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_engine_agrees_with_oracle(case: tuple[SimConfig, bool]) -> None:
    config, ties = case
    res = resolve(config)
    if ties:
        res = resolve(config, _with_ties(res.workload))
    assert_agree(run(res), run_resolved(res))


@pytest.mark.parametrize("kw", [
    dict(prompt=512.0, prompt_cv=0.0, output=64.0, output_cv=0.0, link_channels=3, decode=2, rate=30.0),
    dict(mode="colocated", instances=3, prompt=256.0, prompt_cv=0.0, output=32.0, output_cv=0.0, rate=50.0),
    dict(model="opt-13b", device="a100-40g", prompt=4000.0, prompt_cv=1.0, rate=4.0),
    dict(max_batch=2, decode=2, rate=20.0, requests=200),
], ids=["fixed-lengths-3-channels", "colocated-fixed", "rejections", "batch-limit"])
def test_engine_agrees_with_oracle_on_edge_cases(kw: dict) -> None:
    res = resolve(SimConfig.build(requests=kw.pop("requests", 150), **kw))
    out = run(res)
    assert_agree(out, run_resolved(res))
    if "a100-40g" in kw.values():
        assert (out.status == REJECTED).any()


def test_simultaneous_arrivals_agree_with_oracle() -> None:
    res = resolve(SimConfig.build(requests=200, rate=20.0, prefill=2, decode=2, link_channels=2))
    res = resolve(res.config, _with_ties(res.workload))
    assert len(np.unique(res.workload.arrival)) < 100
    assert_agree(run(res), run_resolved(res))


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    [],
    ["--link", "eth-25g", "--prefill", "2", "--decode", "2", "--link-channels", "2", "--kv-compress", "fp8",
     "--kv-compress-at", "endpoint"],
    ["--mode", "colocated", "--power-cap", "500", "--dvfs"],
    ["--link", "eth-25g", "--send", "layerwise", "--link-sharing", "fair", "--kv-reserve", "at-transfer"],
    ["--model", "llama3-70b", "--devices-per-instance", "4", "--tp", "2", "--pp", "2", "--weight-format", "fp8",
     "--rate", "3"],
    ["--model", "mixtral-8x7b", "--devices-per-instance", "2", "--mode", "colocated", "--tp", "2", "--ep", "2",
     "--expert-imbalance", "1.3", "--speculative", "mtp", "--gamma", "2"],
    ["--speculative", "llama3.2-1b", "--prefill", "2", "--decode", "2", "--rate", "16", "--alpha", "0.9"],
], ids=["base", "2P2D-endpoint", "colocated-capped", "beyond", "tp-pp-fp8", "moe-ep-speculative", "2P2D-speculative"])
def test_compiled_and_plain_python_runs_are_bit_identical(tmp_path: Path, flags: list[str]) -> None:
    """The fast paths (numba ahead of time, numba's JIT) and the plain-Python path are one engine:
    same records, same summary."""
    pytest.importorskip("numba")  # without it every path is plain Python: nothing to compare
    import os
    import subprocess
    import sys

    outputs = []
    for jit in ("1", "jit", "0"):
        csv_path = tmp_path / f"jit{jit}.csv"
        p = subprocess.run([sys.executable, "-m", "kvcargo", "simulate", "--requests", "300", *flags,
                            "--requests-csv", str(csv_path), "--json"], capture_output=True, text=True,
                           env={**os.environ, "KVCARGO_JIT": jit}, timeout=600, check=True)
        outputs.append((p.stdout, csv_path.read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]
