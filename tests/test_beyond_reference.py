"""Opt-in modelling beyond the reference: streaming, topologies, sharing, reservation, codecs.

Each feature is checked against a closed form or an invariant it must keep; the default
behaviour stays bit-identical (test_engine_parity.py, test_reproduce.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcargo import catalog, simulate
from kvcargo.config import SimConfig
from kvcargo.cost import Pool, kv_capacity
from kvcargo.engine.state import DONE, REJECTED
from kvcargo.errors import KvcargoError
from kvcargo.handoff import calculate, exposed_after_prefill
from kvcargo.transfer import Compression
from kvcargo.workload import Workload

CAT = catalog.builtin()


def _one(prompt: int = 2048, **kw):  # type: ignore[no-untyped-def]
    return simulate(workload=Workload(np.array([0.0]), np.array([prompt]), np.array([8])), **kw).output


# ------------------------------------------------------------------------ layer-wise streaming


@pytest.mark.parametrize("link, codec, model, prompt", [
    ("eth-25g", None, "llama3-8b", 2048), ("eth-25g", "fp8", "llama3-8b", 2048), ("ib-ndr", None, "llama3-8b", 8000),
    ("eth-100g", None, "llama3-70b", 3000), ("eth-25g", None, "mistral-7b", 500),
])
def test_one_request_on_an_idle_link_matches_the_closed_form(link: str, codec: str | None, model: str, prompt: int) -> None:
    pool = Pool(CAT.device("h100"), 4 if model == "llama3-70b" else 1)
    comp = Compression(CAT.codec(codec), "endpoint") if codec else None
    want = calculate(CAT.model(model), prompt, CAT.link(link), pool, comp, "layerwise").exposed_s
    kw = {"kv_compress": codec, "kv_compress_at": "endpoint"} if codec else {}
    out = _one(prompt, link=link, model=model, devices_per_instance=pool.n, send="layerwise", **kw)
    got = out.kv_ready[0] - out.first_token[0]
    if codec:  # the GPU pass lengthens the prefill step the slices are spread over
        step = out.first_token[0] - out.prefill_start[0]
        ln = CAT.link(link)
        want = exposed_after_prefill(ln.latency, (prompt * 131072 / 2) / ln.bandwidth, step, 32, "layerwise")
    assert math.isclose(got, want, rel_tol=1e-9)
    whole = _one(prompt, link=link, model=model, devices_per_instance=pool.n, **kw)
    assert got < whole.kv_ready[0] - whole.first_token[0]


def test_layer_groups_trade_fidelity_for_speed() -> None:
    link = CAT.link("eth-25g")
    wire = 2048 * 131072 / link.bandwidth
    step = _one().first_token[0]
    for groups in (1, 4, 8, 32):
        out = _one(send="layerwise", layer_groups=groups, link="eth-25g")
        want = exposed_after_prefill(link.latency, wire, step, groups, "layerwise")
        assert math.isclose(out.kv_ready[0] - out.first_token[0], want, rel_tol=1e-9)


def test_streaming_under_load_queues_slices_of_many_requests() -> None:
    whole = simulate(link="eth-25g", rate=14.0, requests=400).summary
    streamed = simulate(link="eth-25g", rate=14.0, requests=400, send="layerwise").summary
    assert streamed["exposed_p50"] < whole["handoff_p50"]
    assert streamed["link_busy"] == pytest.approx(whole["link_busy"], rel=0.05)  # same bytes to move
    assert streamed["completed"] == 400


# ------------------------------------------------------------------------------- fair sharing


def _together(k: int, **kw):  # type: ignore[no-untyped-def]
    """One tiny request keeps the prefill busy while k equal ones queue: they form one batch,
    so their hand-offs become ready at the same instant."""
    wl = Workload(np.array([0.0] + [1e-4] * k), np.array([16] + [1024] * k), np.array([2] * (k + 1)))
    return simulate(workload=wl, **kw).output


@pytest.mark.parametrize("k", [2, 3, 5])
def test_fair_link_finishes_k_equal_transfers_together_at_k_times_one(k: int) -> None:
    ln = CAT.link("eth-25g")
    one = 1024 * 131072 / ln.bandwidth
    out = _together(k, link="eth-25g", link_sharing="fair")
    start = out.first_token[1:]
    assert np.all(start == start[0]) and np.all(out.kv_start[1:] == start[0])
    landed = out.kv_ready[1:] - start
    assert np.allclose(landed, k * one + ln.latency, rtol=1e-9)
    fcfs = _together(k, link="eth-25g").kv_ready[1:] - start
    assert np.allclose(np.sort(fcfs), (np.arange(k) + 1) * (one + ln.latency), rtol=1e-9)


def test_fcfs_and_fair_same_throughput_different_tails() -> None:
    runs = {s: simulate(link="eth-25g", rate=10.0, requests=1500, link_sharing=s).summary for s in ("fcfs", "fair")}
    fcfs, fair = runs["fcfs"], runs["fair"]
    assert fair["output_tok_per_s"] == pytest.approx(fcfs["output_tok_per_s"], rel=0.02)
    assert fair["link_bytes"] == fcfs["link_bytes"]
    assert fair["link_busy"] == pytest.approx(fcfs["link_busy"], rel=0.02)
    assert abs(fair["handoff_p99"] - fcfs["handoff_p99"]) > 0.05 * fcfs["handoff_p99"]
    assert fair["handoff_p50"] > fcfs["handoff_p50"]  # everyone shares: no one finishes early


# --------------------------------------------------------------------------------- topologies


def _max_overlap(starts: np.ndarray, ends: np.ndarray) -> int:
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("nics", [1, 2])
def test_nic_topology_runs_pairs_in_parallel_within_each_nic(nics: int) -> None:
    r = simulate(link="eth-25g", rate=14.0, requests=500, prefill=2, decode=2, topology="nic", nics_per_instance=nics)
    out = r.output
    moved = ~np.isnan(out.kv_start)
    for p in range(2):
        mine = moved & (out.prefill_inst == p)
        assert _max_overlap(out.kv_start[mine], out.kv_ready[mine]) <= nics
    for d in range(2):
        mine = moved & (out.decode_inst == d)
        assert _max_overlap(out.kv_start[mine], out.kv_ready[mine]) <= nics
    assert _max_overlap(out.kv_start[moved], out.kv_ready[moved]) > 1  # more than one link's worth
    shared = simulate(link="eth-25g", rate=14.0, requests=500, prefill=2, decode=2).summary
    assert r.summary["handoff_p99"] < shared["handoff_p99"] / 3


def test_nvlink_domain_uses_nvlink_inside_a_domain() -> None:
    inside = simulate(link="eth-25g", requests=200, topology="nvlink-domain", domain_size=8)
    apart = simulate(link="eth-25g", requests=200, topology="nvlink-domain", domain_size=1)
    nv, eth = CAT.link("nvlink4"), CAT.link("eth-25g")
    o = inside.output
    moved = o.kv_start == o.kv_start
    assert np.allclose((o.kv_ready - o.kv_start)[moved], nv.latency + o.prompt[moved] * 131072 / nv.bandwidth)
    a = apart.output
    assert np.allclose((a.kv_ready - a.kv_start)[moved], eth.latency + a.prompt[moved] * 131072 / eth.bandwidth)
    assert inside.summary["link_j_per_request"] < apart.summary["link_j_per_request"]


# ----------------------------------------------------------------- memory-aware hand-off (pull)


def test_at_transfer_reservation_waits_for_decode_memory() -> None:
    kw = {"model": "llama3-70b", "prefill_devices_per_instance": 4, "decode_devices_per_instance": 2,
          "rate": 3.0, "requests": 300, "prompt": 1024.0}
    cap = kv_capacity(CAT.model("llama3-70b"), Pool(CAT.device("h100"), 2))
    pull = simulate(kv_reserve="at-transfer", **kw)
    o, s = pull.output, pull.summary
    done = o.status == DONE
    assert done.sum() + (o.status == REJECTED).sum() == 300
    assert s["memory_wait_p99"] > 0 and (o.kv_start[done & (o.output > 1)] >= o.reserved[done & (o.output > 1)]).all()
    # decode memory held (reserved until finish) never exceeds the capacity
    need = (o.prompt + o.output)[~np.isnan(o.reserved)]
    t0, t1 = o.reserved[~np.isnan(o.reserved)], o.finish[~np.isnan(o.reserved)]
    events = sorted([(a, n) for a, n in zip(t0, need)] + [(b, -n) for b, n in zip(t1, need)], key=lambda e: (e[0], e[1]))
    held = np.cumsum([n for _, n in events])
    assert held.max() <= cap
    pre = s["instances"][0]
    assert 0 < pre["kv_held_mean"] <= pre["kv_held_peak"] <= kv_capacity(CAT.model("llama3-70b"), Pool(CAT.device("h100"), 4))
    push = simulate(**kw).summary
    assert push["completed"] == s["completed"]


# ------------------------------------------------------------------------- codecs with costs


def test_codec_wire_bytes() -> None:
    n = np.array([2048 * 131072.0])
    assert Compression(CAT.codec("int4-g16")).ratio == 64 / 17
    kivi = Compression(CAT.codec("kivi-2bit"))
    # 1,920 tokens at 2 bits + an FP16 scale and zero per 32 values (3 bits), 128 tokens in BF16
    want = 65536 * (1920 * 3 / 8 + 128 * 2)
    assert kivi.wire_bytes(n, np.array([2048]), 2.0)[0] == pytest.approx(want, rel=1e-15)
    assert kivi.wire_bytes(np.array([100 * 131072.0]), np.array([100]), 2.0)[0] == 100 * 131072.0  # all recent
    assert Compression(CAT.codec("ratio"), given_ratio=7.5).wire_bytes(n, np.array([2048]), 2.0)[0] == n[0] / 7.5
    with pytest.raises(KvcargoError, match="--kv-ratio applies only to a 'ratio' codec"):
        Compression(CAT.codec("fp8"), given_ratio=3.0)


def test_decode_cost_lengthens_the_first_decode_step_only() -> None:
    plain = _one(kv_compress="fp8", kv_compress_at="endpoint")
    costly = _one(kv_compress="int4-g16", kv_compress_at="endpoint")
    d_plain, d_costly = np.diff(plain.steps, axis=1)[:, 0], np.diff(costly.steps, axis=1)[:, 0]
    extra = 1 * 2048 * 131072 / 2 / (989e12 * 0.55)  # 1 op per value on the decode GPU
    extra = max(extra, (2048 * 131072 / (64 / 17) + 2048 * 131072) / (3.35e12 * 0.8))  # or its bytes
    assert d_costly[0] == pytest.approx(d_plain[0] + extra, rel=1e-9)
    assert np.allclose(d_costly[1:], d_plain[1:], rtol=1e-12)


def test_kivi_in_the_calculator_depends_on_the_prompt() -> None:
    r_long = calculate(CAT.model("llama3-8b"), 8192, CAT.link("eth-25g"), Pool(CAT.device("h100")),
                       Compression(CAT.codec("kivi-2bit")))
    r_short = calculate(CAT.model("llama3-8b"), 256, CAT.link("eth-25g"), Pool(CAT.device("h100")),
                        Compression(CAT.codec("kivi-2bit")))
    assert r_long.ratio > r_short.ratio > 1


# ------------------------------------------------------------------------ invariants, any mix


@st.composite
def beyond(draw: st.DrawFn) -> SimConfig:
    kw = {
        "requests": draw(st.integers(5, 120)), "rate": draw(st.sampled_from([2.0, 10.0, 40.0])),
        "seed": draw(st.integers(0, 99)), "prompt": float(draw(st.sampled_from([64, 1024, 4096]))),
        "output": float(draw(st.sampled_from([1, 8, 64]))), "link": draw(st.sampled_from(["eth-25g", "ib-ndr"])),
        "prefill": draw(st.integers(1, 3)), "decode": draw(st.integers(1, 3)),
        "link_channels": draw(st.integers(1, 2)),
        "send": draw(st.sampled_from(["whole", "layerwise"])),
        "topology": draw(st.sampled_from(["shared", "nic", "nvlink-domain"])),
        "link_sharing": draw(st.sampled_from(["fcfs", "fair"])),
        "kv_reserve": draw(st.sampled_from(["at-decode", "at-transfer"])),
    }
    if kw["topology"] == "nvlink-domain":
        kw["domain_size"] = draw(st.sampled_from([1, 2, 8]))
    if kw["send"] == "layerwise" and draw(st.booleans()):
        kw["layer_groups"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        kw["kv_compress"] = draw(st.sampled_from(["fp8", "int4-g16", "kivi-2bit", "ratio"]))
        kw["kv_compress_at"] = draw(st.sampled_from(["transit", "endpoint"]))
    return SimConfig.build(**kw)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(beyond())
def test_conservation_and_causality_hold_for_every_mix(config: SimConfig) -> None:
    out = simulate(config).output
    done = out.status == DONE
    assert (done | (out.status == REJECTED)).all()
    d = done & (out.output > 1)
    assert (out.kv_ready[d] >= out.first_token[d]).all() and (out.kv_ready[d] >= out.kv_start[d]).all()
    assert (out.decode_start[d] >= out.kv_ready[d]).all() and (out.finish[d] > out.decode_start[d]).all()
    assert (out.first_token[done] > out.prefill_start[done]).all()
