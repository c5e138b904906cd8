"""Metrics: the spec's percentiles and exact means, exact ITLs without per-token lists, and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcargo import simulate
from kvcargo.config import SimConfig, resolve
from kvcargo.engine.cluster import run
from kvcargo.engine.state import DONE, REJECTED
from kvcargo.metrics import describe, describe_weighted, stage_times, steady_requests, summarize
from kvcargo.stats import exact_sum

try:
    from oracle import run_resolved
    from oracle.summary import describe as oracle_describe
except ImportError:  # pragma: no cover
    from tests.oracle import run_resolved  # type: ignore[no-redef]
    from tests.oracle.summary import describe as oracle_describe  # type: ignore[no-redef]

floats = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, min_size=1, max_size=300))
def test_describe_follows_the_spec_formulas(xs: list[float]) -> None:
    """Percentiles by §7's formula and the mean by ``fmean``, restated in the oracle."""
    assert describe(np.array(xs), "x") == oracle_describe(xs, "x")


def test_percentile_is_not_numpys() -> None:
    """numpy interpolates down from the upper sample when the fraction is ≥ 0.5 (k = 3.96 here)."""
    xs = [0.13, 0.474, 0.581, 0.593, 0.916]
    assert describe(np.array(xs), "x")["x_p99"] == 0.593 + (0.916 - 0.593) * (3.96 - 3) == 0.9030800000000001
    assert float(np.percentile(xs, 99)) == 0.90308


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(floats, st.integers(0, 300)), min_size=1, max_size=40))
def test_weighted_percentiles_equal_the_expanded_sample(pairs: list[tuple[float, int]]) -> None:
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    if weights.sum() == 0:
        return
    expanded = np.repeat(values, weights)
    assert describe_weighted(values, weights, "x") == describe(expanded, "x")


@pytest.mark.parametrize("kw", [dict(link="eth-25g"), dict(mode="colocated"), dict(decode=2, prefill=2, rate=14.0)],
                         ids=["disagg", "colocated", "2P2D"])
def test_itl_from_step_log_equals_pooled_per_token_gaps(kw: dict) -> None:
    res = resolve(SimConfig.build(requests=400, **kw))
    out = run(res)
    ora = run_resolved(res)
    pooled = np.array([g for r in steady_requests(out) for g in ora.itls[r]])
    s, ref = summarize(out), describe(pooled, "itl")
    assert {k: s[k] for k in ref} == ref


INVARIANT_RUNS = pytest.mark.parametrize("kw", [
    dict(link="eth-25g", rate=14.0), dict(mode="colocated", rate=10.0), dict(model="opt-13b", device="a100-40g", prompt=4000.0, prompt_cv=1.0, rate=3.0),
    dict(prefill=2, decode=3, link_channels=2, rate=20.0, max_batch=16),
], ids=["saturated-link", "colocated", "rejections", "multi"])


def _run600(kw: dict):  # type: ignore[no-untyped-def]
    return run(resolve(SimConfig.build(requests=600, **kw)))


@INVARIANT_RUNS
def test_conservation_every_request_settles_and_its_stages_sum_to_its_latency(kw: dict) -> None:
    out = _run600(kw)
    done = out.status == DONE
    assert (done | (out.status == REJECTED)).all()
    assert np.isnan(out.first_token[~done]).all()
    e2e = out.finish[done] - out.arrival[done]
    stages = sum(v[done] for v in stage_times(out).values())
    assert np.allclose(stages, e2e, rtol=1e-12, atol=1e-12)
    s = summarize(out)
    assert s["completed"] + s["rejected"] == 600


@INVARIANT_RUNS
def test_causality_every_stage_starts_after_the_one_before(kw: dict) -> None:
    out = _run600(kw)
    done = out.status == DONE
    for a, b in (("arrival", "prefill_start"), ("prefill_start", "first_token"), ("first_token", "decode_start"),
                 ("decode_start", "finish")):
        assert (getattr(out, b)[done] >= getattr(out, a)[done]).all()


@INVARIANT_RUNS
def test_littles_law_holds_in_the_decode_pools(kw: dict) -> None:
    """Batch-weighted step time from the step log equals the requests' time in decode from their
    own records (colocated: plus the prefill steps that interleave, which the log of decode steps
    does not hold)."""
    out = _run600(kw)
    done = out.status == DONE
    in_steps = float(np.sum(out.step_inst[:, 1] * (out.steps[:, 1] - out.steps[:, 0])))
    multi = done & (out.output >= 2)
    in_decode = float(np.sum(out.finish[multi] - out.decode_start[multi]))
    if kw.get("mode") == "colocated":
        assert in_steps < in_decode
    else:
        assert math.isclose(in_steps, in_decode, rel_tol=1e-9)
    s = summarize(out)
    assert math.isclose(s["littles_population"], s["littles_expected"], rel_tol=1e-9)


@pytest.mark.slow
def test_link_waiting_time_matches_md1(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Fixed prompts → deterministic link service; short prompts on a slow link → the prefill
    (a few ms) barely delays Poisson arrivals. Mean wait must match M/D/1: Wq = ρS/(2(1 − ρ))."""
    slow = tmp_path / "slow.toml"
    slow.write_text('[links.slow]\nbandwidth = 1e8\nlatency = 1e-5\n')
    res = resolve(SimConfig.build(requests=20_000, rate=6.0, decode=2, link="slow", prompt=64.0, prompt_cv=0.0,
                                  output=2.0, output_cv=0.0, seed=3, catalog=(str(slow),)))
    out = run(res)
    service = float(res.link.latency + 64 * 131072 / res.link.bandwidth)
    rho = 6.0 * service
    wq = rho * service / (2 * (1 - rho))
    waits = (out.kv_start - out.first_token)[1000:]
    assert abs(float(np.mean(waits)) - wq) / wq < 0.06
    assert (out.prefill_start == out.arrival).mean() > 0.95  # the prefill rarely queues


def test_layerwise_link_wait_is_never_negative() -> None:
    """Streamed layer by layer, a hand-off's first slice leaves before the first token: that is
    no wait (as in the kv_wait stage), not a negative one. The summary's mean wait and the link
    plot's queue (Little's law) both count only the time after the first token."""
    from kvcargo.report.timeseries import plot_data

    r = simulate(SimConfig.build(send="layerwise", link="eth-25g", requests=120, rate=8.0))
    out, s = r.output, r.summary
    early = out.kv_start < out.first_token
    assert 0 < early.sum() < s["transfers"]  # some start inside their prefill step, some queue
    wait = np.maximum(out.kv_start - out.first_token, 0.0)
    assert s["link_mean_wait_s"] == exact_sum(wait) / s["transfers"] > 0.0
    queue = plot_data(r)["link"]["queue"]
    assert np.mean(queue) * s["horizon_s"] == pytest.approx(s["link_mean_wait_s"] * s["transfers"], rel=1e-9)


SUMMARY_100 = {
    "completed": 100, "rejected": 0, "horizon_s": 14.681334589434622, "ttft_p50": 0.07190536405299897,
    "ttft_p99": 0.2716267887554697, "tpot_p50": 0.008065879774491962, "tpot_p99": 0.008692450981690691,
    "itl_p99": 0.008772523080596173, "e2e_p99": 4.375845885903995, "handoff_p99": 0.0183110231424001,
    "slo_attainment": 1.0, "goodput_rps": 9.146781054029907, "output_tok_per_s": 1787.23533886918,
    "j_per_token": 0.3348109858389974, "avg_power_w": 598.3860257330847, "link_busy": 0.03588322811327519,
    "link_j_per_request": 0.031548820684799986, "kv_share_of_e2e": 0.002672869455440071,
}
"""The documented keys of the default run with 100 requests, bit for bit (the default path is the
reference's: any change here is a change of published behaviour)."""


def test_summary_has_the_documented_keys_and_values() -> None:
    s = simulate(requests=100).summary
    assert {key: s[key] for key in SUMMARY_100} == SUMMARY_100


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-1e300, max_value=1e300, allow_nan=False), min_size=0, max_size=600))
def test_exact_sum_is_math_fsum(xs: list[float]) -> None:
    assert exact_sum(np.array(xs)) == math.fsum(xs)


def test_exact_sum_on_cancellation_and_half_even_cases() -> None:
    for xs in ([1e100, 1.0, -1e100, 1e-100] * 100, [0.1] * 1000, [1.0, 1e-16, 1e-16] * 200, [2.0**53, 1.0, 1e-300] * 100):
        assert exact_sum(np.array(xs)) == math.fsum(xs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 1.5, 2.0]) | floats, st.integers(0, 9)), min_size=1, max_size=400))
def test_compiled_weighted_selection_equals_sorting(pairs: list[tuple[float, int]]) -> None:
    from kvcargo import stats

    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    if weights.sum() == 0:
        return
    got = stats.weighted_percentiles(values, weights, (0, 13, 50, 90, 99, 100))
    assert got == stats.percentiles(np.repeat(values, weights), (0, 13, 50, 90, 99, 100))
