"""Parallel layouts, number formats, MoE and speculative decoding against the companion's numbers.

* Cost level: every step, capacity and acceptance check value of levers-parallel §2–§6, exact.
* Runs: every value of the twelve published check runs (``checks.json``), exact, and the three
  published per-request runs, every timestamp ``==``. The command lines are parsed by the CLI
  itself, so the flags' names and values are tested too.
* Properties: identity layouts and formats are the default run bit for bit; the acceptance
  process at α = 0 and α = 1 gives the token counts it must; energy adds up.

CI runs the per-request tests again as plain Python (``KVCARGO_JIT=0``).
"""

from __future__ import annotations

import csv
import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from kvcargo import catalog
from kvcargo.cli.options import config_from
from kvcargo.cli.simulate import command
from kvcargo.config import SimConfig, resolve
from kvcargo.cost import Pool, decode_parts, kv_capacity, model_coefficients, prefill_parts, roofline
from kvcargo.errors import KvcargoError
from kvcargo.formats import with_formats
from kvcargo.parallel import Layout, layout_coefficients, parallel_step, stage_coefficients
from kvcargo.simulation import REQUEST_COLUMNS, simulate
from kvcargo.speculative import accepted, make_draft, mulberry32, seed_state

DATA = Path(__file__).resolve().parent / "data" / "levers-parallel"
CAT = catalog.builtin()


@cache
def checks() -> dict:
    return json.loads((DATA / "checks.json").read_text())


def companion_config(args: list[str]) -> SimConfig:
    """The companion's command line, parsed by kvcargo's own ``simulate`` options."""
    ctx = command.make_context("simulate", list(args))
    return config_from(ctx.params)


@cache
def run(case: str):  # type: ignore[no-untyped-def]
    return simulate(companion_config(checks()[case]["args"]))


# ------------------------------------------------------------------------------- cost level


def _pass(model: str, device: str, n: int, layout: Layout | None, kind: str, arg, link: str | None = None,
          fmt: tuple[str, str] | None = None, compute: str = "bf16"):  # type: ignore[no-untyped-def]
    m = CAT.model(model)
    if fmt:
        m = with_formats(m, *fmt)
    pool = Pool(CAT.device(device), n, precision=compute)
    mi, mf = model_coefficients(m)
    if kind == "prefill":
        tokens = sum(arg)
        flops, w, o = prefill_parts(mi, mf, tokens, sum(s * (s + 1) for s in arg), len(arg))
    else:
        tokens, context = arg
        flops, w, o = decode_parts(mi, mf, tokens, context)
    if layout is None:
        t, _, _ = roofline(pool.coefficients(), flops, w + o)
        return t, flops, w + o, 0.0, 0.0
    lf = layout_coefficients(layout, m, CAT.link(link or pool.device.scale_up))
    t, _, _, nbytes, comm, joules = parallel_step(stage_coefficients(pool, layout.tp), lf, flops, w, o, tokens)
    return t, flops, nbytes, comm, joules


TP2PP2 = Layout(tp=2, pp=2, microbatches=3)


@pytest.mark.parametrize(("layout", "kind", "arg", "link", "want"), [
    (Layout(tp=4), "decode", (32, 64_000), None,
     (0.020503683598009952, 4_615_965_769_728, 159_985_958_912, 0.005079620266666668, 0.0201326592)),
    (None, "decode", (32, 64_000), None, (0.015424063331343284, 4_615_965_769_728, 159_985_958_912, 0.0, 0.0)),
    (Layout(tp=4), "prefill", [2048], None,
     (0.15656239658266627, 290_179_264_806_912, 139_708_071_936, 0.022695697066666666, 1.2884901888)),
    (TP2PP2, "prefill", [2048, 1000], "nvlink3",
     (0.28550561466079843, 430_494_724_390_912, 418_158_870_528, 0.02119783552, 0.64120946688)),
    (TP2PP2, "decode", (2, 5_000), "nvlink3",
     (0.042057838944477614, 291_119_300_608, 279_645_978_624, 0.0024282710400000003, 0.00042074112)),
    (TP2PP2, "decode", (16, 40_000), "nvlink3",
     (0.05731232157930349, 2_328_954_404_864, 430_123_515_904, 0.0033143718400000005, 0.00336592896)),
    (Layout(pp=4), "decode", (16, 40_000), None,
     (0.09344391236829186, 2_328_954_404_864, 569_127_206_912, 3.601944888888889e-05, 3.145728e-05)),
], ids=["tp4-decode", "none-decode", "tp4-prefill", "tp2pp2-prefill", "tp2pp2-decode-b2", "tp2pp2-decode-b16",
        "pp4-decode"])
def test_parallel_step_check_values(layout, kind, arg, link, want) -> None:  # type: ignore[no-untyped-def]
    """levers-parallel §5: time, FLOPs, bytes counted, communication time and scale-up energy."""
    assert _pass("llama3-70b", "h100", 4, layout, kind, arg, link) == want


@pytest.mark.parametrize(("layout", "prefill_s", "decode_s"), [
    (None, 0.049543350554574365, 0.016682061086567165),
    (Layout(tp=2), 0.05256944349679659, 0.01733138176212272),
    (Layout(tp=2, ep=2), 0.053762489967907695, 0.017336042099900497),
    (Layout(tp=2, ep=2, imbalance=1.3), 0.06646388377718442, 0.017336042099900497),
], ids=["none", "tp2", "tp2-ep2", "tp2-ep2-imbalance"])
def test_moe_step_check_values(layout: Layout | None, prefill_s: float, decode_s: float) -> None:
    """levers-parallel §4: Mixtral on 2×H100, TP all-reduces vs EP all-to-alls and imbalance."""
    assert _pass("mixtral-8x7b", "h100", 2, layout, "prefill", [2048])[0] == prefill_s
    assert _pass("mixtral-8x7b", "h100", 2, layout, "decode", (8, 20_000))[0] == decode_s


def test_moe_comm_and_weight_traffic() -> None:
    """§4: communication of the TP and EP prefill, and W_read(T) with τ by binary exponentiation."""
    assert _pass("mixtral-8x7b", "h100", 2, Layout(tp=2), "prefill", [2048])[3:] == (
        0.0030260929422222223, 0.08589934592)
    assert _pass("mixtral-8x7b", "h100", 2, Layout(tp=2, ep=2), "prefill", [2048])[3] == 0.004219139413333333
    mi, mf = model_coefficients(CAT.model("mixtral-8x7b"))
    assert prefill_parts(mi, mf, 1, 2, 1)[1] == 25_497_182_208
    assert prefill_parts(mi, mf, 2048, 2048 * 2049, 1)[1] == 93_159_686_144


def test_format_check_values() -> None:
    """§3.4: Llama-3-70B on 4×H100 with W8A8 and an FP8 KV cache; fp4/int4 and weight-only int4."""
    fp8 = ("fp8", "fp8")
    t, _, nbytes, _, _ = _pass("llama3-70b", "h100", 4, None, "prefill", [2048], fmt=fp8, compute="fp8")
    assert (nbytes, t) == (69_854_035_968, 0.0671833497579998)
    t, _, nbytes, _, _ = _pass("llama3-70b", "h100", 4, None, "decode", (16, 36_800), fmt=fp8, compute="fp8")
    assert (nbytes, t) == (75_533_778_944, 0.007546061468656716)
    assert kv_capacity(with_formats(CAT.model("llama3-70b"), *fp8), Pool(CAT.device("h100"), 4)) == 1_327_194
    assert kv_capacity(with_formats(CAT.model("llama3-8b"), "fp4", "int4"), Pool(CAT.device("b200"))) == 4_667_793
    assert kv_capacity(with_formats(CAT.model("llama3-8b"), "int4", "bf16"), Pool(CAT.device("a100"))) == 517_727


@pytest.mark.parametrize(("flags", "want"), [
    ({"tp": 4}, 448_288), ({"tp": 2, "pp": 2}, 448_288), ({"pp": 4}, 435_463),
    ({"tp": 4, "device": "h200", "weight_format": "int8", "kv_format": "fp8"}, 2_667_526),
    ({"tp": 2, "pp": 2, "device": "h200", "weight_format": "int8", "kv_format": "fp8"}, 2_667_526),
])
def test_stage_capacity_check_values(flags: dict, want: int) -> None:
    """§2.3: capacity checked per GPU and stage (the last stage holds the LM head)."""
    res = resolve(SimConfig(model="llama3-70b", devices_per_instance=4, requests=1, **flags))
    assert res.kv_capacity == res.levers.prefill.kv_capacity == want


@pytest.mark.parametrize(("draft", "want"), [("mtp", 410_628), ("llama3.2-1b", 323_139)])
def test_draft_capacity_check_values(draft: str, want: int) -> None:
    """§6.2: the draft's resident bytes and KV per token shrink Llama-3-8B's capacity on 1×H100."""
    assert resolve(SimConfig(speculative=draft, requests=1)).kv_capacity == want


def test_mtp_draft_shape() -> None:
    """§6.1: Llama-3-8B's MTP head keeps one layer resident, but runs as a 1-layer model."""
    d = make_draft(CAT.model("llama3-8b"), "mtp", CAT, None, None, None)
    assert (d.resident_bytes, d.kv_per_token, d.gamma, d.alpha, d.seed) == (436_207_616, 4096, 3, 0.7, 0)
    assert model_coefficients(d.model)[0][0] == 2 * 743_440_384


def test_mulberry32_and_acceptance_check_values() -> None:
    """§6.4: the generator's first five draws from state 0 and request 3's acceptance run."""
    a, seen = 0, []
    for _ in range(5):
        a, u = mulberry32(a)
        seen.append((a, u))
    assert seen == [(1831565813, 0.26642920868471265), (3663131626, 0.0003297457005828619),
                    (1199730143, 0.2232720274478197), (3031295956, 0.1462021479383111),
                    (567894473, 0.46732782293111086)]
    state, ks = seed_state(0, 3), []
    for _ in range(6):
        state, k = accepted(state, 3, 0.7)
        ks.append(k)
    assert ks == [3, 3, 1, 3, 2, 0]
    assert seed_state(-1, 0) == 2**32 - 1  # non-negative modulo


# ------------------------------------------------------------------------------ published runs

def _summary_value(summary: dict, key: str) -> float:
    key = key.removeprefix("new:")
    if key.startswith("busy_"):
        return next(r["busy"] for r in summary["instances"] if r["name"] == key.removeprefix("busy_"))
    return summary[key]


@pytest.mark.parametrize("case", list(checks()))
def test_published_check_run(case: str) -> None:
    """Every published value of the case, bit for bit."""
    summary = run(case).summary
    for key, want in checks()[case]["expect"].items():
        assert _summary_value(summary, key.removeprefix("new:")) == want, key


@pytest.mark.parametrize("case", ["tp2_pp2_mb3_70b_nvlink3", "mixtral_tp2_ep2_imb13_colocated", "spec_mtp_disagg_8b"])
def test_published_per_request_run(case: str) -> None:
    """Every timestamp of every request of the published runs, ``==`` on floats."""
    with open(DATA / f"{case}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    got = run(case).requests()
    for col in REQUEST_COLUMNS:
        want = np.array([float(r[col]) if r[col] else math.nan for r in rows])
        have = np.asarray(got[col], dtype=np.float64)
        assert ((want == have) | (np.isnan(want) & np.isnan(have))).all(), col


# ---------------------------------------------------------------------------------- properties

SMALL = {"requests": 200, "rate": 10.0}


@pytest.mark.parametrize("identity", [
    {"tp": 1}, {"pp": 1}, {"tp": 1, "pp": 1, "microbatches": 1}, {"weight_format": "bf16", "kv_format": "bf16"},
    {"tp": 1, "scale_up_link": "nvlink3"},
], ids=["tp1", "pp1", "tp1-pp1-m1", "bf16", "tp1-link"])
@pytest.mark.parametrize("base", [{}, {"mode": "colocated"}, {"prefill": 2, "link": "eth-25g", "decode_device": "a100"}],
                         ids=["disagg", "colocated", "2P1D"])
def test_identity_levers_equal_the_default_run(identity: dict, base: dict) -> None:
    """An identity layout or BF16 formats change nothing: same records, same summary (the only
    new figures are the zero scale-up energy and the per-pool communication of 0 s)."""
    _assert_same_run(simulate(**SMALL, **base), simulate(**SMALL, **base, **identity))


@pytest.mark.parametrize("base", [{}, {"prefill": 2, "link": "eth-25g", "decode_device": "a100"}],
                         ids=["disagg", "2P1D"])
def test_identity_pool_layouts_equal_the_default_run(base: dict) -> None:
    """Identity per-pool layouts change nothing either."""
    _assert_same_run(simulate(**SMALL, **base), simulate(**SMALL, **base, prefill_tp=1, decode_pp=1))


def _assert_same_run(plain, lever) -> None:  # type: ignore[no-untyped-def]
    """Same records, same summary; the lever run's communication figures are all 0."""
    for col in REQUEST_COLUMNS:
        a, b = plain.requests()[col], lever.requests()[col]
        assert ((a == b) | (np.isnan(a) & np.isnan(b))).all(), col
    extra = {k for k in lever.summary if k.startswith("comm_")}
    assert all(lever.summary[k] == 0.0 for k in extra)
    assert _same_summary(plain.summary, {k: lever.summary[k] for k in plain.summary})


@pytest.mark.parametrize(("alpha", "gamma"), [(0.0, 3), (1.0, 2)])
def test_acceptance_extremes(alpha: float, gamma: int) -> None:
    """α = 0 accepts nothing: one token per verify pass; α = 1 accepts every draft: γ + 1 per pass
    (the last pass of a request may need fewer)."""
    r = simulate(**SMALL, speculative="mtp", alpha=alpha, gamma=gamma)
    s, o = r.summary, r.output
    done = o.status == 1
    per_request = -(-(o.output[done] - 1) // (1 if alpha == 0 else gamma + 1))
    assert s["spec_verify_rows"] == int(per_request.sum())
    assert np.array_equal(o.verify_passes[done], per_request)
    assert s["spec_closed_form"] == (1.0 if alpha == 0 else gamma + 1)


def test_acceptance_counts_follow_the_seeded_streams() -> None:
    """Replaying every request's own stream gives the verify passes the engine counted."""
    r = simulate(**SMALL, speculative="llama3.2-1b", gamma=4, alpha=0.6, spec_seed=11)
    o = r.output
    for rid in np.nonzero(o.status == 1)[0][:50]:
        state, tokens, passes = seed_state(11, int(rid)), 1, 0
        while tokens < o.output[rid]:
            state, k = accepted(state, 4, 0.6)
            tokens += min(k + 1, int(o.output[rid]) - tokens)
            passes += 1
        assert o.verify_passes[rid] == passes


@pytest.mark.parametrize("flags", [{"tp": 4}, {"speculative": "mtp", "tp": 4}, {"pp": 2, "tp": 2, "mode": "colocated"}])
def test_energy_adds_up(flags: dict) -> None:
    """Total energy is static + compute + memory + link + scale-up, and the shares sum to one."""
    s = simulate(model="llama3-70b", devices_per_instance=4, **SMALL, **flags).summary
    parts = ("static", "compute", "memory", "link", "transit", "scale_up")
    assert s["energy_j"] == pytest.approx(sum(s[f"energy_{p}_j"] for p in parts), rel=1e-14)
    assert sum(s[f"share_{p}"] for p in parts) == pytest.approx(1.0, rel=1e-14)
    assert s["energy_scale_up_j"] > 0


# ------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("flags", "message"), [
    ({"tp": 2}, "prefill pool: parallel tp=2 x pp=1 needs 2 devices per instance (got 1)"),
    ({"ep": 2}, "prefill pool: ep must be 1"),
    ({"model": "mixtral-8x7b", "devices_per_instance": 2, "tp": 2, "ep": 2, "expert_imbalance": 1.2,
      "mode": "colocated", "pp": 2}, "colocated pool: parallel tp=2 x pp=2 needs 4"),
    ({"model": "llama3-70b", "devices_per_instance": 3, "pp": 3}, "has 80 layers: not divisible into 3 stages"),
    ({"ep": 1, "tp": 1, "model": "llama3-8b", "decode_pp": 2, "decode_devices_per_instance": 2,
      "prefill_tp": 1}, None),
    ({"compute_format": "fp8"}, "--compute-format must be bf16"),
    ({"weight_format": "fp4", "compute_format": "fp4"}, "prefill pool: H100-SXM has no fp4 units"),
    ({"weight_format": "int4", "compute_format": "int4"}, "has no int4 units"),
    ({"kv_format": "fp8", "kv_compress": "fp8"}, "assumes a BF16 KV cache"),
    ({"gamma": 4}, "--gamma applies only to --speculative"),
    ({"speculative": "llama3-70b-nope"}, "unknown draft"),
    ({"speculative": "mistral-7b"}, "32000-token vocabulary"),
    ({"speculative": "mtp", "pp": 1, "decode_pp": 2, "decode_devices_per_instance": 2}, "pipeline parallelism"),
    ({"speculative": "mtp", "kv_compress": "fp8"}, "the draft's KV would cross uncompressed"),
    ({"expert_imbalance": 1.5}, "--expert-imbalance needs a parallel layout"),
    ({"scale_up_link": "nvlink3"}, "--scale-up-link needs a parallel layout"),
    ({"tp": 1, "expert_imbalance": 1.2}, "--expert-imbalance applies only to a mixture-of-experts model"),
    ({"model": "mixtral-8x7b", "devices_per_instance": 2, "tp": 2, "expert_imbalance": 1.2}, "with --ep > 1"),
    ({"prefill_tp": 1, "mode": "colocated"}, "needs --mode disagg"),
    ({"transit_ops_per_byte": 2.0}, "applies only to --kv-compress in transit"),
    ({"kv_compress": "fp8", "transit_ops_per_byte": 0}, "--transit-ops-per-byte"),
    ({"tp": 1, "fast": True}, "--fast is the plain decode instance's fast path"),
    ({"model": "llama3-70b", "prefill_tp": 1},
     "prefill pool: Llama-3-70B does not fit: 141.1 GB of weights per GPU in stage 0 of 1 x 1 h100 (72.0 GB usable)"),
])
def test_refused_combinations(flags: dict, message: str | None) -> None:
    """The companion's rejections (levers-parallel §10) as one clear line (and one valid case)."""
    if message is None:
        resolve(SimConfig(requests=1, **flags))
        return
    with pytest.raises(KvcargoError) as err:
        resolve(SimConfig.build(requests=1, **flags))
    assert message in str(err.value) and "\n" not in str(err.value)


def _same_summary(a: dict, b: dict) -> bool:
    return all(k == "instances" or a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))
               for k in a) and a.keys() == b.keys()


def test_fast_is_accepted_where_it_changes_nothing() -> None:
    """``--fast`` on a plain run, or colocated with any lever, is the same run."""
    assert _same_summary(simulate(**SMALL, fast=True).summary, simulate(**SMALL).summary)
    assert _same_summary(simulate(**SMALL, mode="colocated", tp=1, fast=True).summary,
                         simulate(**SMALL, mode="colocated", tp=1).summary)


def test_calculator_follows_kv_format_and_draft() -> None:
    """``kvcargo handoff``: the KV crosses in its storage format; a draft's prompt KV crosses too."""
    from kvcargo.handoff import calculate_config
    from kvcargo.params import HandoffConfig

    def calculate_keys(cat, model, prompt, link, **options):  # type: ignore[no-untyped-def]
        return calculate_config(HandoffConfig(model=model, prompt=prompt, link=link, **options), cat)

    plain = calculate_keys(CAT, "llama3-8b", 2048, "ib-ndr")[0]
    fp8 = calculate_keys(CAT, "llama3-8b", 2048, "ib-ndr", kv_format="fp8")[0]
    mtp = calculate_keys(CAT, "llama3-8b", 2048, "ib-ndr", speculative="mtp")[0]
    assert (plain.kv_bytes, fp8.kv_bytes, mtp.kv_bytes) == (268_435_456, 134_217_728, 2048 * (131_072 + 4096))
    assert fp8.transfer_s == 10e-6 + 134_217_728 / 50e9
    assert mtp.prefill_s > plain.prefill_s == fp8.prefill_s
    with pytest.raises(KvcargoError, match="BF16 KV cache"):
        calculate_keys(CAT, "llama3-8b", 2048, "ib-ndr", kv_compress="fp8", kv_format="fp8")


def test_capacity_bounds_include_communication() -> None:
    """The planner's analytic ceilings price a layout's steps with their all-reduces."""
    from kvcargo import parallel
    from kvcargo.planner.capacity import ceilings

    base = {"model": "llama3-70b", "devices_per_instance": 4}
    plain, tp4 = ceilings(SimConfig(**base)), ceilings(SimConfig(**base, tp=4))
    pool = Pool(CAT.device("h100"), 4)
    want = parallel.prefill_time(CAT.model("llama3-70b"), pool, Layout(tp=4), CAT.link("nvlink4"), [2048] * 4)
    assert tp4.prefill_step_s == want > plain.prefill_step_s
    assert tp4.decode < plain.decode


def test_trace_names_the_layout_and_its_communication() -> None:
    """The Perfetto trace's pool tracks say their layout and communication share."""
    from kvcargo.report.perfetto import trace_events

    r = simulate(model="llama3-70b", devices_per_instance=4, tp=4, requests=50)
    names = [e["args"]["name"] for e in trace_events(r) if e.get("name") == "process_name"]
    share = 100 * r.summary["comm_frac_decode"]
    assert f"decode pool (4× h100, tp 4 × pp 1, {share:.1f}% of busy time communicating over NVLink 4)" in names


# ------------------------------------------------------------------------- against the oracle

try:
    from oracle import run_oracle
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.oracle import run_oracle  # type: ignore[no-redef]

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402


@hst.composite
def lever_configs(draw) -> dict:  # type: ignore[no-untyped-def]
    """Small runs with a layout, formats and/or a draft (every combination the companion accepts)."""
    model = draw(hst.sampled_from(["llama3-8b", "mixtral-8x7b"]))
    n = draw(hst.sampled_from([2, 4]))
    mode = draw(hst.sampled_from(["disagg", "colocated"]))
    spec = draw(hst.sampled_from([None, "mtp", "llama3.2-1b"])) if model == "llama3-8b" else draw(
        hst.sampled_from([None, "mtp"]))
    pp = 1 if spec else draw(hst.sampled_from([1, 2]))
    tp = n // pp
    c = {"model": model, "devices_per_instance": n, "mode": mode, "tp": tp, "pp": pp,
         "requests": draw(hst.integers(20, 80)), "rate": draw(hst.sampled_from([4.0, 20.0, 80.0])),
         "seed": draw(hst.integers(0, 99)), "prompt": draw(hst.sampled_from([300.0, 2048.0])),
         "output": draw(hst.sampled_from([8.0, 64.0])), "max_batch": draw(hst.sampled_from([4, 256]))}
    if draw(hst.booleans()):
        c["microbatches"] = draw(hst.integers(1, 3))
    if model == "mixtral-8x7b" and tp > 1 and draw(hst.booleans()):
        c |= {"ep": tp, "expert_imbalance": draw(hst.sampled_from([1.0, 1.4]))}
    fmt = draw(hst.sampled_from(["bf16", "fp8", "int4"]))
    c |= {"weight_format": fmt, "kv_format": draw(hst.sampled_from(["bf16", "fp8", "fp4"]))}
    if fmt == "fp8" and draw(hst.booleans()):
        c["compute_format"] = "fp8"
    if spec:
        c |= {"speculative": spec, "gamma": draw(hst.integers(1, 5)), "alpha": draw(hst.sampled_from([0.0, 0.5, 0.9, 1.0])),
              "spec_seed": draw(hst.integers(-3, 3))}
    if draw(hst.booleans()):
        c["power_cap"], c["dvfs"] = 450.0, True
    return c


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lever_configs())
def test_engine_agrees_with_the_oracle_under_levers(flags: dict) -> None:
    """Layouts, formats, MoE expert parallelism and speculation: every timestamp and every
    per-instance total of the engine equals the independent SimPy oracle's."""
    from kvcargo.engine.cluster import run as run_engine

    res = resolve(SimConfig(**flags))
    out = run_engine(res)
    c = res.config
    ora = run_oracle(res.workload, model=res.model, prefill_pool=res.prefill_pool, decode_pool=res.decode_pool,
                     n_prefill=c.prefill, n_decode=c.decode, link=res.link, channels=res.channels, mode=c.mode,
                     n_colocated=c.colocated_instances, lm_head=c.lm_head, token_budget=c.token_budget,
                     max_batch=c.max_batch, levers=res.levers)
    for col in ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish"):
        a, b = getattr(out, col), getattr(ora, col)
        assert ((a == b) | (np.isnan(a) & np.isnan(b))).all(), col
    assert out.stats[:, 0].tolist() == ora.busy_s
    assert out.stats[:, 2].tolist() == ora.bytes
    assert out.stats[:, 3].tolist() == ora.compute_j and out.stats[:, 4].tolist() == ora.memory_j
    if res.levers.draft is not None:
        done = ~np.isnan(out.finish) & (out.output >= 2)
        assert [len(ora.itls[i]) for i in np.nonzero(done)[0]] == (out.output[done] - 1).tolist()


def test_plan_searches_splits_and_formats() -> None:
    """``plan --splits --formats``: every tp × pp split of each pool's devices (stages dividing the
    layers) in every format, each a valid configuration with its own label."""
    from kvcargo.planner import plan as plan_mod

    base = SimConfig(model="llama3-70b", requests=100)
    space = plan_mod.build_space(base, set(), plan_mod.Budget(gpus=8), tp=(4,), max_instances=1,
                                 formats=("bf16", "fp8"), splits=True)
    cands = plan_mod.enumerate_candidates(base, space, plan_mod.Budget(gpus=8))
    layouts = {(c.config.prefill_tp, c.config.prefill_pp, c.config.decode_tp, c.config.decode_pp) for c in cands}
    assert layouts == {(a, b, c, d) for a, b in ((4, 1), (2, 2), (1, 4)) for c, d in ((4, 1), (2, 2), (1, 4))}
    assert {c.config.weight_format for c in cands} == {"bf16", "fp8"}
    assert len({c.label for c in cands}) == len(cands) == 18
    with pytest.raises(KvcargoError, match="--splits searches the layouts"):
        plan_mod.build_space(SimConfig(tp=1), {"tp"}, plan_mod.Budget(gpus=8), splits=True)


def test_speculative_pools_route_at_hand_off() -> None:
    """Disaggregated speculation: every hand-off is routed when its prefill ends and reserves decode
    memory before it moves (the pull model), so both decode instances serve and nothing waits for
    memory after landing."""
    r = simulate(requests=300, rate=16.0, prefill=2, decode=2, speculative="mtp")
    o = r.output
    assert r.summary["completed"] == 300
    assert set(o.decode_inst.tolist()) == {0, 1}
    assert (o.reserved <= o.kv_start).all() and (o.decode_start >= o.kv_ready).all()


def test_scale_up_link_from_a_user_catalog(tmp_path: Path) -> None:
    """A user's catalog link can carry the scale-up traffic: half the bandwidth, longer all-reduces."""
    path = tmp_path / "links.toml"
    path.write_text('[links.slow-nvl]\nname = "Half NVLink 4"\nbandwidth = 225e9\nlatency = 5e-6\npj_per_bit = 5\n')
    base = {"model": "llama3-70b", "devices_per_instance": 4, "tp": 4, "requests": 60}
    own = simulate(**base).summary
    slow = simulate(**base, scale_up_link="slow-nvl", catalog=(str(path),)).summary
    assert slow["comm_s_decode"] > own["comm_s_decode"]
    assert slow["energy_scale_up_j"] == pytest.approx(own["energy_scale_up_j"], rel=0.05)
    with pytest.raises(KvcargoError, match="unknown link 'nope'"):
        resolve(SimConfig(**base, scale_up_link="nope"))


def test_capacity_bounds_with_speculation() -> None:
    """With a draft the decode ceiling counts the expected tokens per verify pass and the draft's
    passes; the prefill ceiling the draft's prefill; the link ceiling the draft's KV."""
    from kvcargo.planner.capacity import ceilings

    plain, spec = ceilings(SimConfig()), ceilings(SimConfig(speculative="mtp"))
    assert spec.decode > plain.decode and spec.prefill < plain.prefill
    assert spec.transfer_s == 10e-6 + 2048 * (131_072 + 4096) / 50e9


def test_ppa_area_only_for_the_reference_dies() -> None:
    """``--ppa``: H100-SXM and A100-SXM have an area model; an H200 pool makes the cluster's area and
    silicon dollars unknown (null), as in the companion."""
    s = simulate(requests=50, ppa=True, decode_device="a100").summary
    assert (s["ppa_total_mm2"], s["silicon_usd"]) == (814.0 + 826.0, 339.09863688464617 + 348.1625474720805)
    h200 = simulate(requests=50, ppa=True, decode_device="h200").summary
    assert all(math.isnan(h200[k]) for k in ("ppa_total_mm2", "ppa_perf_per_mm2", "silicon_usd", "tok_per_s_per_kusd"))
