"""A capacity search's probes: built once per configuration, each rate's figures equal to a full
simulation's summary bit for bit, and a plan's shared workload leaves every ceiling unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from kvcargo import SimConfig, simulate
from kvcargo.config import load_workload, resolve
from kvcargo.engine.cluster import build_params
from kvcargo.metrics import probe_figures
from kvcargo.planner.capacity import (
    FLOOR_MARGIN,
    PROBE_KEYS,
    RateProbe,
    ceilings,
    probe_summary,
    search,
    ttft_floor,
)

CONFIGS = [
    SimConfig(model="llama3-70b", devices_per_instance=4, prefill=2, requests=300),
    SimConfig(requests=300),
    SimConfig(requests=300, link="eth-25g", kv_compress="fp8"),
    SimConfig(requests=300, mode="colocated"),
    SimConfig(requests=300, link="eth-25g", send="layerwise"),
    SimConfig(requests=300, prefill=2, decode=3, topology="nic"),
]
SLOW_PREFILL = SimConfig(model="llama3-70b", device="a100", devices_per_instance=2,
                         decode_devices_per_instance=4, prefill=3, requests=300)
"""Long prompts miss the TTFT SLO on 2 A100s even alone (about a quarter of the requests)."""


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mode + "-" + c.link + "-" + str(c.prefill))
def test_rate_probe_equals_a_full_simulation(config: SimConfig) -> None:
    assert RateProbe.applies(config)
    probe = RateProbe(config)
    for rate in (3.0, 11.5, 40.0):
        assert probe(rate) == probe_summary(config.replace(rate=rate))


def test_probe_figures_are_the_summary_s() -> None:
    r = simulate(SimConfig(requests=300, rate=14.0))
    figures, summary = probe_figures(r.output), r.summary
    assert {k: figures[k] for k in PROBE_KEYS} == {k: summary[k] for k in PROBE_KEYS}


def test_search_probes_the_same_with_either_probe() -> None:
    config = CONFIGS[0]
    assert search(config).probes == search(config, probe=probe_summary).probes


def test_workloads_the_rate_does_not_only_scale_are_simulated_whole() -> None:
    assert not RateProbe.applies(SimConfig(workload="chat"))
    assert not RateProbe.applies(SimConfig(batch_policy="chunked"))


def test_a_shared_workload_leaves_the_ceilings_unchanged() -> None:
    config = SimConfig(model="llama3-70b", devices_per_instance=4, prefill=3, decode=2)
    assert ceilings(config, load_workload(config)) == ceilings(config)


@pytest.mark.parametrize("config", [*CONFIGS[:4], SLOW_PREFILL],
                         ids=lambda c: c.mode + "-" + c.link + "-" + str(c.prefill) + "-" + c.device)
def test_deciding_probes_give_the_same_answer(config: SimConfig) -> None:
    """Probes that stop once their failure is certain: the same verdicts, rates and answer."""
    full, decided = search(config), search(config, decide=True)
    assert decided.rate == full.rate and decided.simulations == full.simulations
    for a, b in zip(full.probes, decided.probes):
        assert (a["rate"], a["ok"]) == (b["rate"], b["ok"])
        if b["ok"]:
            assert a == b
        else:
            assert b["slo_attainment"] >= a["slo_attainment"]  # a bound that already misses
    strict = RateProbe(config, decide=0.9999)
    for rate in (2.0, 8.0, 30.0):
        whole = probe_summary(config.replace(rate=rate))
        got = strict(rate)
        assert (got["slo_attainment"] >= 0.9999) == (whole["slo_attainment"] >= 0.9999)
        assert got["slo_attainment"] >= whole["slo_attainment"]


@pytest.mark.parametrize("config", [SLOW_PREFILL, CONFIGS[0], CONFIGS[2], CONFIGS[4]],
                         ids=("slow-prefill", "70b", "fp8-codec", "layerwise"))
def test_the_ttft_floor_is_below_every_simulated_ttft(config: SimConfig) -> None:
    """At a low rate (nearly every request alone) the floor is nearly every TTFT itself, up to
    the clock's rounding; at a high rate (batches, queues) below it."""
    res = resolve(config)
    floor = ttft_floor(res, build_params(res)[0])
    assert floor is not None
    for rate in (0.01, 50.0):
        out = simulate(config.replace(rate=rate)).output
        ttft = out.first_token - out.arrival
        assert (floor <= ttft * (1 + FLOOR_MARGIN)).all()
        if rate < 1:
            assert np.mean(ttft - floor <= 1e-9 * ttft) > 0.95


def test_a_search_whose_failures_are_certain_runs_no_probe() -> None:
    probe = RateProbe(SLOW_PREFILL, decide=0.9)
    res = resolve(SLOW_PREFILL)
    doomed = ttft_floor(res, build_params(res)[0]) > SLOW_PREFILL.ttft_slo
    got = probe(0.01)  # decided before the run: figures NaN, the bound counts only the doomed
    assert got["ttft_p99"] != got["ttft_p99"] and got["slo_attainment"] < 0.9
    steady = doomed[int(0.1 * len(doomed)):]  # arrival order at any rate; the first 10% warm up
    assert got["slo_attainment"] == (len(steady) - steady.sum()) / len(steady)
    assert search(SLOW_PREFILL).rate == search(SLOW_PREFILL, decide=True).rate == 0.0


def test_no_floor_where_the_prefill_step_is_not_the_roofline_s() -> None:
    layout = SimConfig(model="llama3-70b", devices_per_instance=4, prefill_tp=2, prefill_pp=2, requests=50)
    colocated = SimConfig(requests=50, mode="colocated")
    calibrated = SimConfig(requests=50, cost_model="calibrated")
    for config in (colocated, calibrated, layout):
        res = resolve(config)
        assert ttft_floor(res, build_params(res)[0]) is None
