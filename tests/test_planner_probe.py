"""A capacity search's probes: built once per configuration, each rate's figures equal to a full
simulation's summary bit for bit, and a plan's shared workload leaves every ceiling unchanged."""

from __future__ import annotations

import pytest

from kvcargo import SimConfig, simulate
from kvcargo.config import load_workload
from kvcargo.metrics import probe_figures
from kvcargo.planner.capacity import PROBE_KEYS, RateProbe, ceilings, probe_summary, search

CONFIGS = [
    SimConfig(model="llama3-70b", devices_per_instance=4, prefill=2, requests=300),
    SimConfig(requests=300),
    SimConfig(requests=300, link="eth-25g", kv_compress="fp8"),
    SimConfig(requests=300, mode="colocated"),
    SimConfig(requests=300, link="eth-25g", send="layerwise"),
    SimConfig(requests=300, prefill=2, decode=3, topology="nic"),
]


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


@pytest.mark.parametrize("config", CONFIGS[:4], ids=lambda c: c.mode + "-" + c.link + "-" + str(c.prefill))
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
