"""``plan``: the search space, budgets, analytic pruning, the Pareto front and the best split."""

from __future__ import annotations

import pytest

from kvcargo import SimConfig
from kvcargo.errors import KvcargoError
from kvcargo.planner.capacity import search
from kvcargo.planner.plan import (
    Budget,
    Candidate,
    build_space,
    enumerate_candidates,
    pareto_front,
    plan,
)
from kvcargo.report.command import command_line

BASE = SimConfig(requests=400)


def small_plan(**kw):
    budget = kw.pop("budget", Budget(gpus=4))
    space = build_space(BASE, set(), budget, tp=kw.pop("tp", (1,)), links=kw.pop("links", None),
                        devices=kw.pop("devices", None))
    return plan(BASE, budget, space, **kw)


def test_space_enumerates_every_split_within_the_budget() -> None:
    budget = Budget(gpus=4)
    space = build_space(BASE, set(), budget, tp=(1,))
    cands = enumerate_candidates(BASE, space, budget)
    splits = sorted((c.config.prefill, c.config.decode) for c in cands)
    assert splits == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]
    assert all(c.gpus == c.config.prefill + c.config.decode for c in cands)
    assert all(c.usd == 30_000 * c.gpus for c in cands)  # the catalog's illustrative H100 price
    assert all(c.power_w == 700 * c.gpus for c in cands)  # TDP when nothing caps it


def test_auto_devices_per_instance_start_where_the_model_fits() -> None:
    base = SimConfig(model="llama3-70b")
    space = build_space(base, set(), Budget(gpus=16))
    assert space.tp["h100"] == (2, 4)  # 1x H100 cannot hold 70B; 2x just does (8,835 KV tokens)


def test_fixed_flags_fix_that_dimension() -> None:
    base = SimConfig(prefill=2, decode_device="a100")
    space = build_space(base, {"prefill", "decode_device"}, Budget(gpus=6), tp=(1,), devices=("h100", "a100"))
    cands = enumerate_candidates(base, space, Budget(gpus=6))
    assert {c.config.prefill for c in cands} == {2}
    assert {c.config.decode_device or c.config.device for c in cands} == {"a100"}
    assert {c.config.device for c in cands} == {"h100", "a100"}


def test_plan_front_best_and_the_command_that_reproduces_it() -> None:
    r = small_plan()
    assert r.counts["candidates"] == 6 and r.counts["simulated"] + r.counts["dominated"] == 6
    assert r.best is r.front[-1]  # the highest capacity is the front's last (most expensive) point
    caps = [c.capacity for c in r.front]
    costs = [c.gpus for c in r.front]
    assert caps == sorted(caps) and costs == sorted(costs) and len(set(costs)) == len(costs)
    simulated = [c for c in r.candidates if c.capacity is not None]
    assert r.best.capacity == max(c.capacity for c in simulated)
    # no simulated candidate beats a front point on both axes
    for f in r.front:
        assert not any(c.gpus <= f.gpus and c.capacity > f.capacity for c in simulated)
    # the printed command reproduces the capacity exactly
    cmds = r.commands()
    assert cmds["capacity"] == "kvcargo capacity " + command_line(r.best.config, exclude=("rate",))
    assert "--requests 400" in cmds["capacity"] and f"--rate {r.best.capacity!r}" in cmds["simulate"]
    assert search(r.best.config).rate == r.best.capacity


def test_plan_with_a_load_to_serve_picks_the_cheapest_that_sustains_it() -> None:
    r = small_plan(target_rate=20.0)
    assert r.best is not None and r.best.capacity >= 20.0
    cheaper = [c for c in r.candidates if c.capacity is not None and c.gpus < r.best.gpus]
    assert all(c.capacity < 20.0 for c in cheaper)
    assert r.best.gpus >= 3  # one prefill H100 tops out near 16 req/s
    far = small_plan(target_rate=500.0)
    assert far.best is None and far.counts["below_target"] > 0
    assert any("no configuration within the budget sustains 500" in n for n in far.notes)


def test_pruning_does_not_change_the_front() -> None:
    budget = Budget(gpus=6)
    space = build_space(BASE, set(), budget, tp=(1,))
    pruned = plan(BASE, budget, space, wave=3, steady=False)
    full = plan(BASE, budget, space, wave=10_000, steady=False)
    assert full.counts["dominated"] == 0 and pruned.counts["dominated"] > 0
    assert [(c.label, c.capacity) for c in pruned.front] == [(c.label, c.capacity) for c in full.front]


def test_steady_searches_use_more_requests_when_the_run_is_a_transient() -> None:
    budget, base = Budget(gpus=6), BASE.replace(prefill=4)
    space = build_space(base, {"prefill"}, budget, tp=(1,))
    short = plan(base, budget, space, steady=False)
    assert [c.steady for c in short.candidates] == [False, False]  # 400 requests: about one lifetime
    r = plan(base, budget, space, steady=True)
    assert all(c.steady and c.config.requests > 400 for c in r.candidates)
    assert all(c.capacity < s.capacity for c, s in zip(r.candidates, short.candidates))
    assert f"--requests {r.best.config.requests}" in r.commands()["capacity"]
    assert search(r.best.config).rate == r.best.capacity


def test_dollar_budget_and_heterogeneous_pools() -> None:
    r = small_plan(budget=Budget(usd=80_000), devices=("h100", "a100"))
    assert all(c.usd <= 80_000 for c in r.candidates)
    pairs = {(c.config.device, c.config.decode_device or c.config.device) for c in r.candidates}
    assert ("h100", "a100") in pairs and ("a100", "h100") in pairs
    assert r.cost == "usd" and r.front


@pytest.mark.parametrize("budget, message", [
    (dict(gpus=1), r"impossible budget \(1 GPU\).*needs 2 GPUs"),
    (dict(usd=40_000), r"impossible budget \(\$40,000\).*\$60,000"),
    (dict(power_w=1000), r"impossible budget \(1,000 W\).*1,400 W"),
])
def test_impossible_budgets(budget: dict, message: str) -> None:
    b = Budget(**budget)
    with pytest.raises(KvcargoError, match=message):
        plan(BASE, b, build_space(BASE, set(), b, tp=(1,)))


def test_budget_errors() -> None:
    with pytest.raises(KvcargoError, match="needs a budget"):
        Budget()
    with pytest.raises(KvcargoError, match="--gpus must be a positive"):
        Budget(gpus=0)
    with pytest.raises(KvcargoError, match="no price_usd in the catalog for optical"):
        b = Budget(usd=1e6)
        plan(BASE, b, build_space(BASE, set(), b, devices=("optical",), tp=(1,)))
    with pytest.raises(KvcargoError, match="does not fit any configuration"):
        b = Budget(gpus=2)
        plan(SimConfig(model="llama3-70b"), b, build_space(SimConfig(model="llama3-70b"), set(), b, tp=(1,)))
    with pytest.raises(KvcargoError, match="--links conflicts with --link"):
        build_space(BASE, {"link"}, Budget(gpus=4), links=("ib-ndr",))
    with pytest.raises(KvcargoError, match="unknown device"):
        build_space(BASE, set(), Budget(gpus=4), devices=("h1000",))


def test_pareto_front_of_made_up_points() -> None:
    def cand(label: str, gpus: int, cap: float | None) -> Candidate:
        return Candidate(SimConfig(), label, gpus, None, 0.0, capacity=cap)

    pts = [cand("a", 2, 10), cand("b", 2, 12), cand("c", 3, 11), cand("d", 4, 20), cand("e", 4, 20),
           cand("f", 5, None), cand("g", 6, 0.0)]
    assert [c.label for c in pareto_front(pts, "gpus")] == ["b", "d"]


def test_command_line_lists_only_what_differs_from_the_defaults() -> None:
    cfg = SimConfig(model="llama3-70b", devices_per_instance=4, prefill=2, rate=6.0, dvfs=True, prompt=1024.5)
    assert command_line(cfg) == ("--model llama3-70b --devices-per-instance 4 --prefill 2 --rate 6 "
                                 "--prompt 1024.5 --dvfs")
    assert command_line(cfg, exclude=("rate",)).count("--rate") == 0
    assert command_line(SimConfig()) == ""
    assert command_line(SimConfig(rate=5.969472280967484)) == "--rate 5.969472280967484"


def test_colocated_candidates_are_the_twin_without_the_hand_off() -> None:
    """--with-colocated keeps the workload and the cost model but drops what only the KV link uses."""
    from kvcargo.config import colocated_twin

    base = BASE.replace(link_model="measured", cost_model="calibrated", send="layerwise", kv_reserve="at-transfer")
    given = {"link_model", "cost_model", "send", "kv_reserve"}
    space = build_space(base, given, Budget(gpus=2), tp=(1,), with_colocated=True)
    cands = enumerate_candidates(base, space, Budget(gpus=2))
    colo = [c.config for c in cands if c.config.mode == "colocated"]
    assert [c.instances for c in colo] == [1, 2]
    assert all(c == colocated_twin(base).replace(instances=c.instances) for c in colo)
    assert all(c.cost_model == "calibrated" and c.link_model == "line-rate" and c.send == "whole" for c in colo)
    assert {c.config.send for c in cands if c.config.mode == "disagg"} == {"layerwise"}
