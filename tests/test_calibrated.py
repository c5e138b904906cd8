"""The calibrated cost model and the measured link model (opt-in; the defaults stay the reference).

Oracles: the kernel tables' own held-out measurements, direct sums of the measured kernels (the
engine reads a tabulation of them), single-request runs whose timestamps are closed forms of the
step costs, the published Splitwise/Mooncake/Vidur figures, and the plain-Python engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcargo import SimConfig, catalog, simulate
from kvcargo.calibrate import calibrate
from kvcargo.calibrated import (
    CS_DECODE_OVERHEAD,
    CS_LARGE_STEP,
    CS_PREFILL_SCALE,
    KNEE_TOKENS,
    N_GRID,
    N_SCALARS,
    N_TABLES,
    T_GENERATION,
    T_TOKENS,
    CalibratedPool,
    calibrated_mixed_step,
    calibrated_pool,
    calibrated_step,
    grid,
    past_knee,
    pj_scale,
    tabulate,
    tp_factor,
)
from kvcargo.calibration_fit import (
    Framework,
    KernelTime,
    StepRow,
    builtin_constants,
    fit,
    framework,
    kernel_time,
    parse_constants,
    read_splitwise,
    read_steps,
)
from kvcargo.cli import main
from kvcargo.cost import Pool
from kvcargo.errors import KvcargoError
from kvcargo.kernel_tables import ARRAYS, builtin_arrays, from_arrays, load
from kvcargo.linkmodel import layerwise_exposed, message_s, rate, read_send_recv, transfer_s
from kvcargo.steps import step
from kvcargo.validate import run as validate_run
from kvcargo.validate_calibrated import merged_arrays, step_rows
from kvcargo.workload import Workload

CAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "calibration"
needs_data = pytest.mark.skipif(not CAL.is_dir(), reason="shared/data/calibration not available")


def _one_request(prompt: int, output: int) -> Workload:
    return Workload(arrival=np.array([0.0]), prompt=np.array([prompt]), output=np.array([output]))


# ------------------------------------------------------------------------- the step costs


def test_engine_lookup_matches_direct_kernel_sum() -> None:
    """The tabulated lookup the engine uses stays within 1.5% of summing the measured kernels (8 grid
    points per doubling; the all-reduce curve bends between 4 and 16 MiB), the large-step term
    included (its kink at the knee is computed, not tabulated): 2,048–8,192 tokens per step at TP
    2, 4 and 8. Except on the H100 up to 4,353 tokens, whose measured GEMMs step up every 256
    tokens (m = 2,048 → 2,049: +6% at TP4), between grid points: there within 4%."""
    cat = catalog.builtin()
    model = cat.model("llama2-70b")
    shapes = [(1, p) for p in range(2048, 8193, 64)]
    shapes += [(2, 1025), (3, 777), (3, 1800), (8, 512), (4, 2048), (8, 1024)]
    for dev, tp in ((d, t) for d in ("h100", "a100") for t in (2, 4, 8)):
        cp = calibrated_pool(model, Pool(cat.device(dev), tp))
        fw = framework(dev, tp)
        for batch, prompt in shapes:
            b = np.array([float(batch)])
            m = b * prompt
            compute = (cp.layer_compute_s(m) + cp.logits_s(m) + cp.context_s(b, np.array([float(prompt)])))[0]
            past = compute * past_knee(float(m[0])) * tp_factor(tp)
            direct = fw.prefill_s(KernelTime(compute, cp.layer_reduce_s(m)[0], past), model.layers)
            got = step("llama2-70b", dev, tp, "prefill", batch, prompt, "calibrated")["time_s"]
            tol = 0.04 if dev == "h100" and m[0] <= 4353 else 0.015
            assert got == pytest.approx(direct, rel=tol), (dev, tp, batch, prompt)
    cp = calibrated_pool(model, Pool(cat.device("h100"), 4))
    fw = framework("h100", 4)
    for batch, prompt in ((1, 100), (3, 777), (8, 2048), (1, 30000)):
        b = np.array([float(batch)])
        m = b * prompt
        compute = (cp.layer_compute_s(m) + cp.logits_s(m) + cp.context_s(b, np.array([float(prompt)])))[0]
        past = compute * past_knee(m[0]) * tp_factor(4)
        direct = fw.prefill_s(KernelTime(compute, cp.layer_reduce_s(m)[0], past), model.layers)
        got = step("llama2-70b", "h100", 4, "prefill", batch, prompt, "calibrated")["time_s"]
        assert got == pytest.approx(direct, rel=0.015)
    for batch, ctx in ((1, 10), (16, 2048), (200, 900)):
        b = np.array([float(batch)])
        compute = (cp.layer_compute_s(b) + cp.logits_s(b) + cp.generation_s(b, np.array([ctx + 1.0])))[0]
        got = step("llama2-70b", "h100", 4, "decode", batch, ctx, "calibrated")["time_s"]
        assert got == pytest.approx(fw.decode_s(KernelTime(compute, cp.layer_reduce_s(b)[0])), rel=0.01)


def test_mixed_step_is_the_direct_kernel_sum() -> None:
    """A chunked step (decode rows and prompt chunks in one pass) under the calibrated model: the
    GEMMs and all-reduces over every token, the LM head over the rows and the prompt tokens, the
    chunks' context attention at the length of the same query-key pairs plus the rows' generation
    attention, with the prefill framework; whole prompts alone and rows alone are the plain
    steps, bit for bit."""
    cat = catalog.builtin()
    model = cat.model("llama3-70b")
    for dev, tp in (("h100", 4), ("a100", 8)):
        pool = Pool(cat.device(dev), tp)
        ct, cs = tabulate(model, pool)
        hf = pool.coefficients()
        cp, fw = calibrated_pool(model, pool), framework(dev, tp)
        for rows, ctx, chunks in ((32, 1500, [(1024, 512)]), (200, 900, [(0, 300), (4000, 3000)]), (1, 50, [(0, 9000)])):
            tokens = rows + sum(c for _, c in chunks)
            attn = sum(c * (2 * p0 + c + 1) for p0, c in chunks)
            s = (np.sqrt(1.0 + 4.0 * attn / len(chunks)) - 1.0) / 2.0
            m, r = np.array([float(tokens)]), np.array([float(rows)])
            compute = (cp.layer_compute_s(m) + cp.logits_s(m) + cp.context_s(np.array([float(len(chunks))]), np.array([s]))
                       + cp.generation_s(r, np.array([ctx + 1.0])))[0]
            past = compute * past_knee(float(tokens)) * tp_factor(tp)
            direct = fw.prefill_s(KernelTime(compute, cp.layer_reduce_s(m)[0], past), model.layers)
            direct += fw.decode_overhead_s  # the rows' per-step decode work
            got, _, _ = calibrated_mixed_step(ct, cs, hf, float(rows), float(rows * ctx), float(tokens - rows),
                                              float(attn), float(len(chunks)), 1.0, 0.0, 0.0)
            assert got == pytest.approx(direct, rel=0.04), (dev, tp, rows, chunks)
        prompts = (700, 1300)
        quad = sum(p * (p + 1) for p in prompts)
        assert (calibrated_mixed_step(ct, cs, hf, 0.0, 0.0, 2000.0, float(quad), 2.0, 2.0, 1e15, 1e10)
                == calibrated_step(ct, cs, hf, True, 2000.0, 2.0, float(quad), 0.0, 1e15, 1e10))
        assert (calibrated_mixed_step(ct, cs, hf, 16.0, 16000.0, 0.0, 0.0, 0.0, 0.0, 1e12, 1e11)
                == calibrated_step(ct, cs, hf, False, 16.0, 16.0, 0.0, 16000.0, 1e12, 1e11))


def test_a_chunk_never_makes_a_decode_step_cheaper() -> None:
    """Adding prompt tokens to a decode step keeps its decode overhead and adds work; a chunk that
    ends no prompt runs no LM head under ``--lm-head last``."""
    cat = catalog.builtin()
    for key, dev, tp in (("llama3-70b", "h100", 4), ("llama2-70b", "a100", 8), ("llama3-8b", "h100", 1),
                         ("llama3-8b", "b200", 2)):
        model, pool = cat.model(key), Pool(cat.device(dev), tp)
        ct, cs = tabulate(model, pool)
        hf = pool.coefficients()
        for rows in (1.0, 8.0, 64.0, 256.0):
            decode, _, _ = calibrated_mixed_step(ct, cs, hf, rows, rows * 600.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            for c in (1.0, 16.0, 512.0):
                mixed, _, _ = calibrated_mixed_step(ct, cs, hf, rows, rows * 600.0, c, c * (1000.0 + c + 1.0), 1.0,
                                                    0.0, 0.0, 0.0)
                assert mixed > decode, (key, dev, tp, rows, c)
    model, pool = cat.model("llama3-8b"), Pool(cat.device("h100"), 1)
    ct, cs = tabulate(model, pool, "last")
    hf = pool.coefficients()
    args = (0.0, 0.0, 8192.0, 8192.0 * 8193.0, 1.0)  # GPU-bound: above the host floor
    mid, _, _ = calibrated_mixed_step(ct, cs, hf, *args, 0.0, 0.0, 0.0)
    end, _, _ = calibrated_mixed_step(ct, cs, hf, *args, 1.0, 0.0, 0.0)
    assert end > mid


def test_single_request_timestamps_are_the_step_costs() -> None:
    """One request alone: TTFT is one calibrated prefill step, decoding the sum of its decode
    steps at contexts P+1 … P+O−1 (``kvcargo step`` is the oracle)."""
    p, o = 1000, 6
    r = simulate(SimConfig(cost_model="calibrated", model="llama3-8b"), workload=_one_request(p, o))
    rq = r.requests()
    assert rq["first_token"][0] == step("llama3-8b", "h100", 1, "prefill", 1, p, "calibrated")["time_s"]
    steps = [step("llama3-8b", "h100", 1, "decode", 1, p + 1 + k, "calibrated")["time_s"] for k in range(o - 1)]
    t = rq["decode_start"][0]
    for s in steps:
        t += s
    assert rq["finish"][0] == t


def test_held_out_kernel_shapes_meet_the_targets() -> None:
    """Interpolation error on measurements the tables never saw: median ≤ 5%, p90 ≤ 15%."""
    rows = [r for r in validate_run(["calibrated"]) if r.what.split(":")[0] in ("h100", "a100", "h200", "b200")]
    # per device and format: GEMMs, context and generation attention, whole steps (fp8: not the A100)
    assert len(rows) == 16 + 3 * 4
    for r in rows:
        # The B200's measured W8A8 GEMMs at small m jump between ~7 and ~20 µs from one k to the
        # next (one k: 0.0073 ms, its neighbours 0.022 ms): no interpolant follows that (p90 33%)
        gap = r.what.startswith("b200: fp8 (W8A8) GEMMs")
        assert r.status == ("gap" if gap else "ok"), (r.what, r.kvcargo)


def test_held_out_models_step_times_meet_the_targets() -> None:
    """Whole steps of Qwen2.5-7B/32B and Gemma-2-9B at TP 1–8 (dimensions and head configurations
    held out of the tables) against the same steps from every measured kernel."""
    merged = from_arrays(merged_arrays("h100"))
    g = builtin_arrays("heldout_h100")["gemm"][::997]
    for m, n, k, ms in g:
        assert merged.gemms["bf16"](np.array([m]), n, k)[0] == pytest.approx(ms * 1e-3, rel=1e-9)
    for m, n, k, ms in builtin_arrays("heldout_h100")["gemm_fp8"][::997]:
        assert merged.gemms["fp8"](np.array([m]), n, k)[0] == pytest.approx(ms * 1e-3, rel=1e-9)
    rows = step_rows()
    assert len(rows) == 7 and all(r.status == "ok" for r in rows)  # bf16 on 4 devices, fp8 on 3


def test_prefill_is_host_bound_then_gpu_bound() -> None:
    """Short prompts sit on the host floor (layers × host time per layer, the same at every TP
    degree); long ones are the scaled kernels."""
    fw = framework("h100", 8)
    floor = 80 * fw.prefill_host_s_per_layer
    short = [step("llama2-70b", "h100", tp, "prefill", 1, p, "calibrated", "last")["time_s"]
             for tp in (4, 8) for p in (16, 128)]
    assert short == pytest.approx([floor] * 4, rel=1e-9)
    assert step("llama3-8b", "h100", 8, "prefill", 1, 16, "calibrated")["time_s"] == pytest.approx(32 / 80 * floor)
    long = step("llama2-70b", "h100", 8, "prefill", 4, 1024, "calibrated", "last")
    parts = long["parts_s"]
    assert long["time_s"] > floor
    compute = parts["layers"] + parts["attention"] + parts["logits"]
    large = parts["framework_large_step_scale"] * past_knee(4 * 1024)  # half the step's tokens are past the knee
    gpu = (fw.prefill_scale + large) * compute + fw.comm_scale * parts["all_reduce"]
    assert parts["framework_large_step_scale"] == 2 * fw.large_step  # log2(8 / 2) = 2
    assert long["time_s"] == pytest.approx(gpu, rel=0.015)


def _without_large_step(device: str) -> Pool:
    """An H100 whose framework constants are the built-in ones at TP 1–8 with ``large_step`` 0."""
    dev = catalog.builtin().device(device)
    fields = {f"tp{tp}": {**vars(framework(device, tp)), "large_step": 0.0} for tp in (1, 2, 4, 8)}
    return dev.model_copy(update={"framework": fields})


def test_large_step_term_is_zero_at_tp_2_and_below_the_knee() -> None:
    """At TP ≤ 2 (log2(TP/2) ≤ 0), and at any TP for steps of at most 2,048 prompt tokens, a prefill
    costs exactly what it costs without the term; past the knee at TP 4 and 8 it costs more."""
    from kvcargo.steps import step_cost

    model = catalog.builtin().model("llama2-70b")
    plain = _without_large_step("h100")
    assert builtin_constants()[("h100", 8)].large_step > 0 and tp_factor(1) == tp_factor(2) == 0.0

    def t(device: object, tp: int, batch: int, prompt: int) -> float:
        return step_cost(model, Pool(device, tp), "prefill", batch, prompt, "calibrated")["time_s"]  # type: ignore[arg-type]

    h100 = catalog.builtin().device("h100")
    for tp in (1, 2):
        for batch, prompt in ((1, 4096), (8, 512), (1, 30000)):
            assert t(h100, tp, batch, prompt) == t(plain, tp, batch, prompt)
    for tp in (4, 8):
        for batch, prompt in ((1, 2048), (4, 512), (2, 1024), (1, 100)):
            assert t(h100, tp, batch, prompt) == t(plain, tp, batch, prompt)
        assert t(h100, tp, 1, 2049) > t(plain, tp, 1, 2049)


def test_large_step_term_is_linear_in_the_tokens_past_the_knee() -> None:
    """With compute kernels of exactly a seconds per token (and nothing else), a prefill of m tokens
    costs scale·a·m + large·a·max(0, m − 2,048): the term adds a·large per token past the knee."""
    a, scale, large = 2e-5, 1.3, 0.8
    ct = np.full((N_TABLES, N_GRID, N_GRID), np.log(1e-300))
    ct[T_TOKENS] = np.log(a * grid())[:, None]
    cs = np.zeros(N_SCALARS)
    cs[CS_PREFILL_SCALE], cs[CS_LARGE_STEP] = scale, large
    hf = Pool(catalog.builtin().device("h100")).coefficients()
    for m in (512.0, 2048.0, 2049.0, 3000.0, 4096.0, 8192.0, 100000.0):
        t, _, _ = calibrated_step(ct, cs, hf, True, m, 1.0, m * (m + 1), 0.0, 0.0, 0.0)
        assert t == pytest.approx(scale * a * m + large * a * max(0.0, m - KNEE_TOKENS), rel=1e-9)


def test_fit_recovers_a_known_large_step(tmp_path: Path) -> None:
    """Step times made by the model itself (scale 1.3, all-reduces 2×, host 0.6 ms per layer,
    large_step 0.8) at TP 2/4/8 with steps on both sides of the knee: the fit finds them again,
    and the overlay it writes carries large_step."""
    truth = Framework(prefill_scale=1.3, prefill_host_s_per_layer=0.0006, comm_scale=2.0, large_step=0.8)
    lines = [STEPS.strip()]
    for tp in (2, 4, 8):
        for batch, prompt in ((1, 64), (1, 512), (1, 1024), (2, 1024), (4, 1024), (1, 3000), (8, 512), (2, 4096)):
            row = StepRow("llama2-70b", "h100", tp, "prefill", batch, float(prompt), 1.0)
            lines.append(f"llama2-70b,h100,{tp},prefill,{batch},{prompt},{truth.prefill_s(kernel_time(row), 80)!r}")
    text, reports = calibrate(steps=str(_write(tmp_path, "\n".join(lines) + "\n", "steps.csv")))
    f = parse_constants({"h100": catalog.load([str(_write(tmp_path, text))]).device("h100").framework})[("h100", 8)]
    assert f.large_step == pytest.approx(0.8, rel=5e-3)
    assert f.prefill_scale == pytest.approx(1.3, rel=5e-3)
    assert f.comm_scale == pytest.approx(2.0, rel=0.02)
    assert f.prefill_host_s_per_layer == pytest.approx(0.0006, rel=1e-2)
    assert [(r.what, r.rows) for r in reports if "large_step" in r.what] == [
        (f"h100: large_step {f.large_step:.3g} (fitted to the prefill steps past 2,048 tokens at TP > 2)", 8)]


@pytest.mark.parametrize("rows", [
    # past the knee only at TP 2, where the term is 0 by its form
    [(2, 1, 4096, 0.3), (2, 1, 1024, 0.08), (2, 1, 256, 0.05)],
    # TP 8, but no step past the knee (2,048 tokens is not past it)
    [(8, 1, 2048, 0.15), (8, 1, 1024, 0.08), (8, 4, 512, 0.15), (8, 1, 128, 0.05)],
])
def test_calibrate_sets_large_step_to_0_without_steps_past_the_knee(tmp_path: Path, rows: list) -> None:
    """A user's engine need not jump past 2,048 tokens: without a prefill step past the knee at
    TP > 2 there is nothing to fit, so large_step is 0 and the report says so."""
    body = "".join(f"llama2-70b,h100,{tp},prefill,{b},{p},{t}\n" for tp, b, p, t in rows)
    text, reports = calibrate(steps=str(_write(tmp_path, STEPS + body, "steps.csv")))
    fw = catalog.load([str(_write(tmp_path, text))]).device("h100").framework
    assert {tp: f["large_step"] for tp, f in fw.items()} == {f"tp{rows[0][0]}": 0.0}
    assert [r.what for r in reports if "large_step" in r.what] == [
        "h100: large_step 0 (no prefill step past 2,048 tokens at TP > 2 to fit it)"]


def test_overlays_without_large_step_load_as_0(tmp_path: Path) -> None:
    """An overlay written before the term existed has no large_step: it loads, as 0 (the step of
    4,096 tokens at TP 8 then costs what the built-in constants without the term give)."""
    fields = {k: v for k, v in vars(builtin_constants()[("h100", 8)]).items() if k != "large_step"}
    old = H100_ENTRY + "framework = { tp8 = { " + ", ".join(f"{k} = {v!r}" for k, v in fields.items()) + " } }\n"
    path = _write(tmp_path, old, "old.toml")
    assert parse_constants({"h100": catalog.load([str(path)]).device("h100").framework})[("h100", 8)].large_step == 0.0
    base = builtin_constants()[("h100", 8)]
    got = step("llama2-70b", "h100", 8, "prefill", 8, 512, "calibrated", catalog=(str(path),))["time_s"]
    row = StepRow("llama2-70b", "h100", 8, "prefill", 8, 512.0, 1.0)
    k = kernel_time(row)
    assert got == pytest.approx(Framework(**fields).prefill_s(k, 80), rel=0.015)
    assert got < base.prefill_s(k, 80) / 1.1


def test_all_reduce_sizes_are_bf16_values() -> None:
    """aiconfigurator's 1 Gi-value all-reduce over 8 H100s is 2 GiB at NVLink 4's bus bandwidth."""
    t = load("h100")
    seconds = float(t.all_reduce(8, np.array([2.0 * 2**30]))[0])
    bus_bw = 2 * 7 / 8 * 2 * 2**30 / seconds
    assert 400e9 < bus_bw < 500e9


def test_tables_are_tabulated_once_per_pool() -> None:
    """A planner search reuses a pool's tables; a device with its own constants gets its own."""
    cat = catalog.builtin()
    m = cat.model("llama3-8b")
    assert tabulate(m, Pool(cat.device("h100"), 2)) is tabulate(m, Pool(cat.device("h100"), 2))
    own = cat.device("h100").model_copy(update={"framework": {"tp2": {"decode_overhead_s": 0.5}}})
    assert tabulate(m, Pool(own, 2))[1][CS_DECODE_OVERHEAD] == 0.5


def test_tensor_parallel_splits_the_work() -> None:
    """More devices: per-device GEMMs shrink, an all-reduce appears (none on one device)."""
    cat = catalog.builtin()
    m, dev = cat.model("llama2-70b"), cat.device("h100")
    tables = load("h100")
    one, eight = CalibratedPool(m, dev, 1, tables), CalibratedPool(m, dev, 8, tables)
    assert (one.heads, one.kv_heads, eight.heads, eight.kv_heads) == (64, 8, 8, 1)
    assert tables.all_reduce(1, np.array([1e6]))[0] == 0.0
    assert tables.all_reduce(8, np.array([1e6]))[0] > 0.0
    x = np.array([4096.0])
    assert eight.layer_tokens_s(x)[0] < one.layer_tokens_s(x)[0] / 3


def test_sliding_window_caps_the_attention() -> None:
    """Mistral-7B with a 4,096-token window: decode attention at 32k context equals the full
    model's at 4,096 tokens; below the window the two models cost the same."""
    cat = catalog.builtin()
    full, swa = cat.model("mistral-7b"), cat.model("mistral-7b-swa")
    pool = Pool(cat.device("h100"))
    a, b = calibrated_pool(full, pool), calibrated_pool(swa, pool)
    w = float(swa.sliding_window)
    one = np.array([1.0])
    assert b.generation_s(one, np.array([8 * w]))[0] == pytest.approx(a.generation_s(one, np.array([w]))[0])
    assert b.generation_s(one, np.array([w / 2]))[0] == a.generation_s(one, np.array([w / 2]))[0]
    assert b.context_s(one, np.array([2 * w]))[0] == pytest.approx(a.context_s(one, np.array([2 * w]))[0] / 2)


def test_power_is_consistent_with_the_calibrated_rate() -> None:
    """Uncapped, a compute-bound calibrated prefill stays under the power budget (not throttled);
    capped, it is stretched to energy / budget and its dynamic power is the budget."""
    free = step("llama3-8b", "h100", 1, "prefill", 4, 2048, "calibrated")
    pool = Pool(catalog.builtin().device("h100"))
    assert free["time_s"] > free["parts_s"]["framework_floor"]  # GPU-bound, not at the host floor
    assert free["energy_j"] / free["time_s"] < pool.dynamic_budget_w
    tables = load("h100")
    assert pj_scale(pool, tables) == pytest.approx(0.55 / (tables.gemms["bf16"].peak_rate / 989e12))
    capped = SimConfig(cost_model="calibrated", power_cap=250, requests=1)
    r = simulate(capped, workload=_one_request(8192, 1))
    e = r.output.stats[0, 3] + r.output.stats[0, 4]
    assert r.requests()["first_token"][0] == pytest.approx(e / (250 - 100))


# ------------------------------------------------------------------------- number formats


FP8 = {"weight_format": "fp8", "kv_format": "fp8", "compute_format": "fp8"}


def test_fp8_tables_are_the_measured_cells() -> None:
    """The H100, H200 and B200 tables hold W8A8 GEMMs and attention over an fp8 KV cache; the
    A100 (no FP8 units) bf16 only. At a measured grid point a lookup is the measured latency."""
    for dev in ("a100", "b200", "h100", "h200"):
        t = load(dev)
        formats = ["bf16"] if dev == "a100" else ["bf16", "fp8"]
        assert (list(t.gemms), list(t.contexts), list(t.generations)) == (formats, formats, formats), dev
    raw, t = builtin_arrays("h100"), load("h100")
    for i, j, k in ((10, 5, 7), (40, 12, 13), (73, 17, 3)):
        ms = float(raw["gemm_fp8_ms"][i, j, k])
        got = t.gemms["fp8"](np.array([float(raw["gemm_fp8_m"][i])]), raw["gemm_fp8_n"][j], raw["gemm_fp8_k"][k])[0]
        assert got == pytest.approx(ms * 1e-3, rel=1e-12)
    cfg, ms = raw["ctx_fp8_cfg"], raw["ctx_fp8_ms"]
    c, b, s = next(zip(*np.nonzero(~np.isnan(ms[:, 3:, 5:]))))
    h, kv, d = (int(v) for v in cfg[c])
    got = t.contexts["fp8"](h, kv, d, np.array([float(raw["ctx_fp8_b"][b + 3])]),
                            np.array([float(raw["ctx_fp8_s"][s + 5])]))[0]
    assert got == pytest.approx(float(ms[c, b + 3, s + 5]) * 1e-3, rel=1e-12)
    assert not np.array_equal(raw["ctx_fp8_ms"], raw["ctx_ms"], equal_nan=True)


def test_w8a8_prefill_matches_direct_kernel_sum() -> None:
    """A W8A8 prefill step with an fp8 KV cache on the H100 (TP 2, 4, 8) against the measured fp8
    kernels' sum, and faster than the bf16 steps (at TP 8, whose per-device GEMMs gain least,
    one step of 2,880 tokens comes out 0.3% slower: in total 10% faster). The measured W8A8 GEMMs step up by as much as
    30% every 256 tokens (Llama-2-70B's gate+up at TP 2: m = 2,560 → 2,561, 0.98 → 1.28 ms), which
    the engine's table (8 points per doubling) averages: up to 4,353 tokens one step is within
    16% (bf16: 4%), beyond within 4% (bf16: 1.5%), and over every 64th prompt length the mean
    error is within 1%. Only the layers' GEMMs and the attention change: the LM head, elementwise
    kernels and all-reduces stay bf16."""
    cat = catalog.builtin()
    model, dev, tables = cat.model("llama2-70b"), cat.device("h100"), load("h100")
    for tp in (2, 4, 8):
        cp, bf = CalibratedPool(model, dev, tp, tables, "fp8", "fp8"), CalibratedPool(model, dev, tp, tables)
        fw = framework("h100", tp)
        errors, times = [], []
        for batch, prompt in [(1, p) for p in range(2048, 8193, 64)] + [(3, 777), (8, 512), (4, 2048), (8, 1024)]:
            b = np.array([float(batch)])
            m = b * prompt
            compute = (cp.layer_compute_s(m) + cp.logits_s(m) + cp.context_s(b, np.array([float(prompt)])))[0]
            past = compute * past_knee(float(m[0])) * tp_factor(tp)
            direct = fw.prefill_s(KernelTime(compute, cp.layer_reduce_s(m)[0], past), model.layers)
            got = step("llama2-70b", "h100", tp, "prefill", batch, prompt, "calibrated", **FP8)["time_s"]
            assert got == pytest.approx(direct, rel=0.16 if m[0] <= 4353 else 0.04), (tp, batch, prompt)
            times.append((got, step("llama2-70b", "h100", tp, "prefill", batch, prompt, "calibrated")["time_s"]))
            errors.append(got / direct - 1)
        assert abs(np.mean(errors)) < 0.01
        fp8, bf16 = np.array(times).T
        assert (fp8 < bf16).all() if tp < 8 else fp8.sum() < 0.9 * bf16.sum()
        x = np.array([4096.0])
        d, hd, ff = model.d_model, model.head_dim, -(-model.d_ff // tp)
        q, kv = cp.heads * hd, cp.kv_heads * hd
        gemm_shapes = ((q + 2 * kv, d), (d, q), (2 * ff, d), (d, ff))
        extra = sum(tables.gemms["fp8"](x, n, k) - tables.gemms["bf16"](x, n, k) for n, k in gemm_shapes)
        assert cp.layer_compute_s(x)[0] == pytest.approx(bf.layer_compute_s(x)[0] + model.layers * extra[0], rel=1e-12)
        assert (cp.logits_s(x)[0], cp.layer_reduce_s(x)[0]) == (bf.logits_s(x)[0], bf.layer_reduce_s(x)[0])


def test_fp8_kv_prices_its_attention_and_halves_its_bytes() -> None:
    """A decode step over an fp8 KV cache: attention from the fp8-KV tables, the bytes (hence
    memory energy) those of the model in its storage formats, as the roofline counts them."""
    cat = catalog.builtin()
    pool = Pool(cat.device("h100"), 4)
    cp = CalibratedPool(cat.model("llama3-70b"), pool.device, 4, load("h100"), "bf16", "fp8")
    fp8 = step("llama3-70b", "h100", 4, "decode", 64, 4096, "calibrated", kv_format="fp8")
    bf16 = step("llama3-70b", "h100", 4, "decode", 64, 4096, "calibrated")
    assert fp8["parts_s"]["attention"] == cp.generation_s(np.array([64.0]), np.array([4097.0]))[0]
    assert fp8["parts_s"]["attention"] != bf16["parts_s"]["attention"]
    assert fp8["bytes"] == step("llama3-70b", "h100", 4, "decode", 64, 4096, kv_format="fp8")["bytes"]
    kv_bytes = bf16["bytes"] - fp8["bytes"]  # one byte less per KV value: 64 × (4,096 cached + the new token)
    assert kv_bytes == 64 * 4097 * 80 * 2 * 8 * 128 * 1.0
    assert (fp8["parts_s"]["layers"], fp8["flops"]) == (bf16["parts_s"]["layers"], bf16["flops"])


def test_w8a8_energy_keeps_the_reference_power() -> None:
    """The FLOP-energy scale uses the measured W8A8 rate (bf16's times the fp8 GEMMs' median
    speed-up where both are compute-bound) against the fp8 peak, so a compute-bound W8A8 prefill
    runs at the bf16 step's power, not throttled."""
    t = load("h100")
    raw = builtin_arrays("h100")
    big = ((raw["gemm_m"] >= 4096)[:, None, None] & (raw["gemm_n"] >= 4096)[None, :, None]
           & (raw["gemm_k"] >= 4096)[None, None, :])
    speedup = np.nanmedian((raw["gemm_ms"] / raw["gemm_fp8_ms"])[big])  # the few unmeasured cells left out
    assert t.rate("fp8") == pytest.approx(t.gemms["bf16"].peak_rate * speedup, rel=0.01)
    pool = Pool(catalog.builtin().device("h100"), precision="fp8")
    assert pj_scale(pool, t) == pytest.approx(0.55 / (t.rate("fp8") / (2 * 989e12)), rel=1e-12)
    w8a8 = step("llama3-8b", "h100", 1, "prefill", 4, 4096, "calibrated", weight_format="fp8", compute_format="fp8")
    bf16 = step("llama3-8b", "h100", 1, "prefill", 4, 4096, "calibrated")
    assert w8a8["energy_j"] / w8a8["time_s"] < pool.dynamic_budget_w
    assert w8a8["power_w"] == pytest.approx(bf16["power_w"], rel=0.10)


def test_fp8_pools_tabulate_apart() -> None:
    """The engine's tables are keyed by the formats: a W8A8 pool has its own (the same object
    again for the same formats), with cheaper per-token layers than the bf16 pool's."""
    from kvcargo.formats import with_formats

    cat = catalog.builtin()
    m = cat.model("llama3-8b")
    fp8 = with_formats(m, "fp8", "fp8")
    a = tabulate(fp8, Pool(cat.device("h100"), 2, precision="fp8"))
    assert a is tabulate(fp8, Pool(cat.device("h100"), 2, precision="fp8"))
    b = tabulate(m, Pool(cat.device("h100"), 2))
    assert a is not b and a[0][T_TOKENS, -1, 0] < b[0][T_TOKENS, -1, 0]
    kv_only = tabulate(with_formats(m, "bf16", "fp8"), Pool(cat.device("h100"), 2))
    assert np.array_equal(kv_only[0][T_TOKENS], b[0][T_TOKENS])
    assert not np.array_equal(kv_only[0][T_GENERATION], b[0][T_GENERATION])


def test_tables_without_fp8_refuse_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tables file written before fp8 was converted (bf16 arrays only) still runs bf16 and
    refuses fp8 with one line naming what it measured."""
    raw = builtin_arrays("h100")
    np.savez(tmp_path / "old.npz", **{k: raw[k] for k in ARRAYS})
    overlay = tmp_path / "old.toml"
    overlay.write_text(H100_ENTRY + f'lowp_speedup = {{ fp8 = 2.0 }}\nkernel_tables = "{tmp_path / "old.npz"}"\n')
    base = ["step", "--phase", "decode", "--context", "512", "--cost-model", "calibrated", "--catalog", str(overlay)]
    main(base)
    capsys.readouterr()
    for flags, message in ((["--kv-format", "fp8"], "no measured attention over fp8 KV caches (measured: bf16)"),
                           (["--weight-format", "fp8", "--compute-format", "fp8"],
                            "no measured fp8 GEMMs (measured: bf16)")):
        with pytest.raises(SystemExit) as exc:
            main(base + flags)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_planner_tries_w8a8_under_the_calibrated_model(capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --formats bf16,fp8`` with the calibrated model: the fp8 candidate is W8A8 with an
    fp8 KV cache (the only fp8 weights it measures), simulated beside the bf16 one."""
    main(["plan", "--cost-model", "calibrated", "--model", "llama3-8b", "--gpus", "2", "--tp", "1",
          "--max-instances", "1", "--formats", "bf16,fp8", "--requests", "50", "--tpot-slo", "0.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    labels = sorted(c["label"] for c in out["candidates"] if c["status"] == "simulated")
    assert labels == ["1P1D h100x1 -> h100x1 ib-ndr",
                      "1P1D h100x1 -> h100x1 ib-ndr (formats weight fp8, kv fp8, compute fp8)"]


# ---------------------------------------------------------------------------- the link


@needs_data
def test_measured_link_follows_the_vidur_curve() -> None:
    sizes, times = read_send_recv(CAL / "vidur-network" / "h100_dgx" / "send_recv.csv")
    ndr = catalog.builtin().link("ib-ndr")
    err = np.abs(message_s(ndr, sizes) / times - 1)
    assert np.median(err) <= 0.10
    frac = lambda n: n / float(message_s(ndr, n)) / ndr.bandwidth  # noqa: E731
    assert frac(2**20) == pytest.approx(0.39, rel=0.2)
    assert frac(64 * 2**20) == pytest.approx(0.72, rel=0.2)
    assert float(message_s(ndr, 2048)) == pytest.approx(17e-6, rel=0.2)


def test_measured_link_figures_within_20_percent() -> None:
    checks = {r.what: r for r in validate_run(["calibrated"]) if "GB/s" in r.published or " ms" in r.published}
    assert len(checks) == 4
    for r in checks.values():
        assert abs(r.rel_diff) <= 0.2, (r.what, r.kvcargo)


def test_layerwise_exposed_counts_the_per_layer_cost() -> None:
    ndr = catalog.builtin().link("ib-ndr")
    tau = float(message_s(ndr, 80e6 / 80))
    assert layerwise_exposed(ndr, 80e6, 1.0, 80) == pytest.approx(tau + 80 * 3.1 * 19.1e-6)
    line = ndr.model_copy(update={"message_overhead_s": None, "efficiency": None})
    assert rate(line) == line.bandwidth and float(message_s(line, 1e6)) == line.latency + 1e6 / line.bandwidth


def test_transfer_s_stripes_over_channels() -> None:
    """Multi-rail: each channel carries one message of n / channels bytes, started together."""
    ndr = catalog.builtin().link("ib-ndr")
    assert float(transfer_s(ndr, 64e6, 4)) == pytest.approx(float(message_s(ndr, 16e6)))
    assert float(transfer_s(ndr, 2048)) == pytest.approx(19.1e-6 + 2048 / (50e9 * 0.719))
    with pytest.raises(KvcargoError, match="channels"):
        transfer_s(ndr, 1.0, 0)


def test_measured_whole_transfer_is_one_message() -> None:
    """A lone hand-off over ib-ndr holds the link overhead + bytes / (bandwidth · efficiency)."""
    p = 2000
    r = simulate(SimConfig(link_model="measured"), workload=_one_request(p, 4))
    rq = r.requests()
    ndr = catalog.builtin().link("ib-ndr")
    kv = p * 131072
    assert rq["kv_ready"][0] - rq["kv_start"][0] == pytest.approx(19.1e-6 + kv / (50e9 * 0.719), rel=1e-12)
    assert ndr.efficiency == 0.719


# ------------------------------------------------------------------ fitting and overlays


@needs_data
def test_splitwise_meets_the_targets_in_and_out_of_sample() -> None:
    """Per phase and TP degree: in-sample, leave one configuration out, larger steps held out;
    and BLOOM-176B's prompt times with constants fitted to Llama-2-70B alone."""
    rows = [r for r in validate_run(["calibrated"]) if "Llama-2-70B" in r.what or "BLOOM" in r.what]
    by = {(what, tp) for r in rows for what in ("in-sample", "configuration out", "larger steps")
          for tp in (2, 4, 8) if what in r.what and f"TP{tp}," in r.what}
    assert len(by) == 9
    held = [r for r in rows if "in-sample" in r.what or "configuration out" in r.what or "larger steps" in r.what
            or ("BLOOM" in r.what and "prompt" in r.what)]
    assert len(held) == 3 * 2 * 3 + 1
    assert all(r.status == "ok" for r in held), [r.what for r in held if r.status != "ok"]
    # the large-step term carried to the other device and to a held-out TP degree (prompt times only)
    carried = [r for r in rows if "of the other device" in r.what or "one TP degree's batch 8" in r.what]
    assert len(carried) == 6 and all("prompt time" in r.what for r in carried)
    assert all(r.status == "ok" for r in carried), [(r.what, r.kvcargo) for r in carried if r.status != "ok"]


@needs_data
def test_calibrate_overlay_reproduces_the_builtin_constants(tmp_path: Path) -> None:
    text, reports = calibrate(steps=str(CAL / "splitwise" / "perf_model_fit.csv"))
    out = tmp_path / "overlay.toml"
    out.write_text(text)
    cat = catalog.load([str(out)])
    fitted = parse_constants({"h100": cat.device("h100").framework})
    for tp in (2, 4, 8):
        assert fitted[("h100", tp)] == builtin_constants()[("h100", tp)]
    base = step("llama2-70b", "h100", 4, "decode", 4, 1000, "calibrated")["time_s"]
    assert step("llama2-70b", "h100", 4, "decode", 4, 1000, "calibrated", catalog=(str(out),))["time_s"] == base
    assert any(r.what.startswith("skipped: bloom-176b") for r in reports)
    rows = read_splitwise(CAL / "splitwise" / "perf_model_fit.csv")
    assert len([r for r in rows if r.model == "llama2-70b"]) == 2 * 60  # 6 (device, TP) × 10 shapes × 2 phases


def test_calibrate_from_per_request_times_recovers_the_constants(tmp_path: Path) -> None:
    """TTFT/TPOT made from the model with known constants (two prompts at the host floor of
    32 × 0.5 ms, two GPU-bound; all-reduces 2× the measured): the fit finds them again."""
    lines = ["model,device,tp,prompt,output,ttft_s,tpot_s,batch"]
    for p, o, b in ((256, 64, 1), (1024, 128, 4), (3000, 200, 16), (600, 33, 8)):
        pre = step("llama3-8b", "h100", 2, "prefill", 1, p, "calibrated", "last")["parts_s"]  # as the fit
        k_pre = 1.3 * (pre["layers"] + pre["attention"] + pre["logits"]) + 2.0 * pre["all_reduce"]
        dec = step("llama3-8b", "h100", 2, "decode", b, int(p + o / 2), "calibrated")["parts_s"]
        k_dec = dec["layers"] + dec["attention"] + dec["logits"] + 2.0 * dec["all_reduce"]
        lines.append(f"llama3-8b,h100,2,{p},{o},{max(32 * 0.0005, k_pre)!r},{k_dec + 0.002!r},{b}")
    path = tmp_path / "bench.csv"
    path.write_text("\n".join(lines) + "\n")
    text, reports = calibrate(steps=str(path))
    f = parse_constants({"h100": catalog.load([str(_write(tmp_path, text))]).device("h100").framework})[("h100", 2)]
    assert f.prefill_scale == pytest.approx(1.3, rel=5e-3)
    assert f.prefill_host_s_per_layer == pytest.approx(0.0005, rel=1e-2)
    assert f.comm_scale == pytest.approx(2.0, rel=0.05)
    assert f.decode_overhead_s == pytest.approx(0.002, rel=1e-2)
    assert f.large_step == 0.0  # TP 2: the 3,000-token prompt is past the knee, but the term is 0 there
    assert all(r.median < 0.01 for r in reports if r.rows)
    assert [r.what for r in reports if not r.rows] == [
        "h100: large_step 0 (no prefill step past 2,048 tokens at TP > 2 to fit it)"]


def _write(tmp_path: Path, text: str, name: str = "overlay.toml") -> Path:
    out = tmp_path / name
    out.write_text(text)
    return out


def test_a_degree_measured_in_one_phase_takes_the_other_phase_from_its_neighbours(tmp_path: Path) -> None:
    """Prefill measured at TP 1 only, decode at TP 1 and 2: TP 2 shares TP 1's prefill constants
    (they are per device), so TP 4 does not extrapolate them towards 0, which priced a prefill at
    its all-reduces alone; decode measured at TP 1 only gives TP 2 the same overhead."""
    path = tmp_path / "steps.csv"
    path.write_text("model,device,tp,phase,batch,tokens,time_s\n"
                    "llama3-8b,h200,1,prefill,1,512,0.03\nllama3-8b,h200,1,prefill,1,2048,0.09\n"
                    "llama3-8b,h200,1,decode,8,600,0.012\nllama3-8b,h200,2,decode,8,600,0.010\n"
                    "llama3-8b,h100,1,decode,8,600,0.012\nllama3-8b,h100,2,prefill,1,2048,0.05\n")
    table = fit(read_steps(path))
    tp1, tp2 = table[("h200", 1)], table[("h200", 2)]
    assert (tp2.prefill_scale, tp2.prefill_host_s_per_layer) == (tp1.prefill_scale, tp1.prefill_host_s_per_layer)
    assert tp1.prefill_scale > 1 and tp2.decode_overhead_s != tp1.decode_overhead_s
    assert framework("h200", 4, table).prefill_scale == tp1.prefill_scale
    assert table[("h100", 2)].decode_overhead_s == table[("h100", 1)].decode_overhead_s > 0


def test_framework_interpolates_in_log_tp() -> None:
    t = {("x", 2): parse_constants({"x": {"tp2": {"decode_overhead_s": 0.01}}})[("x", 2)],
         ("x", 8): parse_constants({"x": {"tp8": {"decode_overhead_s": 0.03}}})[("x", 8)]}
    assert framework("x", 4, t).decode_overhead_s == pytest.approx(0.02)
    assert framework("x", 1, t).decode_overhead_s == pytest.approx(0.0)
    assert framework("x", 16, t).decode_overhead_s == pytest.approx(0.04)
    assert framework("y", 4, t).decode_overhead_s == 0.0


# ----------------------------------------------------------------------- refusals and CLI


@pytest.mark.parametrize("args, message", [
    (["step", "--phase", "prefill", "--prompt", "10", "--model", "mixtral-8x7b", "--cost-model", "calibrated",
      "--devices-per-instance", "2"], "mixture of experts"),
    (["step", "--phase", "prefill", "--prompt", "10", "--device", "optical", "--cost-model", "calibrated"],
     "measured kernel tables for"),
    (["step", "--phase", "decode", "--prompt", "10"], "--phase decode takes --context"),
    (["step", "--phase", "decode"], "needs --context"),
    (["step", "--phase", "prefill", "--prompt", "0"], "--prompt must be"),
    (["simulate", "--cost-model", "calibrated", "--dvfs"], "--dvfs"),
    (["simulate", "--link-model", "measured", "--mode", "colocated"], "needs --mode disagg"),
    (["simulate", "--cost-model", "calibrated", "--model", "mixtral-8x7b", "--devices-per-instance", "2"],
     "mixture of experts"),
    (["simulate", "--cost-model", "calibrated", "--model", "gemma2-9b", "--device", "a100"], "head size 256"),
    (["simulate", "--cost-model", "calibrated", "--model", "llama3-70b", "--ced-encoder-layers", "4",
      "--devices-per-instance", "2"], "runs here as a causal encoder-decoder"),
    (["simulate", "--cost-model", "calibrated", "--tp", "2"], "need --cost-model roofline"),
    (["simulate", "--cost-model", "calibrated", "--kv-format", "int8"], "bf16 and fp8 KV caches only, not int8"),
    (["simulate", "--cost-model", "calibrated", "--weight-format", "fp8"], "no measured weight-only GEMMs"),
    (["simulate", "--cost-model", "calibrated", "--weight-format", "int4", "--compute-format", "int4"],
     "bf16 and fp8 GEMMs only, not int4"),
    (["simulate", "--cost-model", "calibrated", "--device", "a100", "--weight-format", "fp8", "--compute-format",
      "fp8"], "A100-SXM has no fp8 units (--cost-model calibrated measures no weight-only GEMMs"),
    (["simulate", "--cost-model", "calibrated", "--device", "a100", "--kv-format", "fp8"],
     "the a100 kernel tables have no measured attention over fp8 KV caches (measured: bf16)"),
    (["step", "--phase", "decode", "--context", "10", "--cost-model", "calibrated", "--device", "a100",
      "--weight-format", "fp8", "--compute-format", "fp8"], "has no fp8 units"),
    (["step", "--phase", "decode", "--context", "10", "--cost-model", "calibrated", "--weight-format", "fp8"],
     "no measured weight-only GEMMs"),
    (["step", "--phase", "decode", "--context", "10", "--compute-format", "fp8"], "--compute-format must be bf16"),
    (["plan", "--cost-model", "calibrated", "--gpus", "4", "--formats", "bf16,int4"],
     "measured bf16 and fp8 kernels only, not int4"),
    (["plan", "--cost-model", "calibrated", "--gpus", "4", "--formats", "bf16,fp8", "--compute-format", "bf16"],
     "drop --compute-format"),
    (["calibrate"], "give --steps"),
    (["calibrate", "--import-aiconfigurator", "h100_sxm"], "go together"),
    (["calibrate", "--import-aiconfigurator", "l40s", "--device", "h100", "--tables", "x.npz",
      "--aiconfigurator-data", "."], "has no vLLM GEMM table"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


STEPS = "model,device,tp,phase,batch,tokens,time_s\n"
REQUESTS = "model,device,tp,prompt,output,ttft_s,tpot_s,batch\n"
SPLITWISE = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel\n"
SEND_RECV = "size,devices_per_node,time_stats.send_recv.median\n4096,1,0.02\n"


@pytest.mark.parametrize("flags, content, message", [
    ([], b"\xff\xfe\x00garbage\n", "not UTF-8 text"),
    ([], STEPS + "llama2-70b,h100,2,prefill,1,512\n", "line 2: time_s must be a finite number > 0, got nothing"),
    ([], STEPS + "llama2-70b,h100,2,prefill,1,512,inf\n", "line 2: time_s must be a finite number > 0, got 'inf'"),
    ([], STEPS + "llama2-70b,h100,0,prefill,1,512,0.05\n", "line 2: tp must be an integer >= 1, got '0'"),
    ([], STEPS + "llama2-70b,h100,2,prefill,1.5,512,0.05\n", "line 2: batch must be an integer >= 1, got '1.5'"),
    ([], STEPS + "llama2-70b,h100,2,prefill,1,0.5,0.05\n", "line 2: tokens must be >= 1, got '0.5'"),
    ([], STEPS + "llama2-70b,h100,2,both,1,512,0.05\n", "line 2: phase must be prefill or decode, got 'both'"),
    ([], REQUESTS + "llama2-70b,h100,2,512,128,0.05\n", "line 2: tpot_s must be a finite number > 0, got nothing"),
    ([], REQUESTS + "llama2-70b,h100,2,512,128,0.05,0.02,0\n", "line 2: batch must be an integer >= 1"),
    ([], SPLITWISE + "llama2-70b,h100-80gb,512,1,128,-5,50,2\n", "line 2: prompt_time must be a finite number > 0"),
    ([], SPLITWISE + "llama2-70b,h100-80gb,512,1,128,100,50,0\n", "line 2: tensor_parallel must be an integer >= 1"),
    ([], SPLITWISE + "llama2-70b,v100,512,1,128,100,50,2\n", "no rows of hardware a100-80gb, h100-80gb (found v100)"),
    ([], "model,hardware,prompt_time\n", "not a Splitwise perf_model CSV (missing columns tensor_parallel"),
    (["--link", "ib-ndr"], SEND_RECV + "8192,1,nan\n", "line 3: time_stats.send_recv.median must be a finite"),
    (["--link", "ib-ndr"], "size,devices_per_node\n", "not a Vidur send_recv CSV (missing columns"),
])
def test_malformed_measurements_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                             content: str | bytes, message: str) -> None:
    """A malformed measurement file, row or cell is refused naming the line and the cell, never
    fitted (an infinite or negative time would give constants of nan or 0)."""
    path = tmp_path / "m.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--send-recv" if flags else "--steps", str(path), *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


H100_ENTRY = ('[devices."h100"]\nname = "H100"\npeak_flops = 989e12\nhbm_bw = 3.35e12\ncapacity = 80e9\n'
              'tdp_w = 700.0\nidle_w = 100.0\npj_per_flop = 1.0\npj_per_byte = 60.0\n')


@pytest.mark.parametrize("fields, message", [
    ("framework = { tp2 = { prefill_scale = -1.0 } }", "prefill_scale must be a finite number > 0 (a slowdown factor)"),
    ("framework = { tp2 = { comm_scale = 0.0 } }", "comm_scale must be a finite number > 0"),
    ("framework = { tp2 = { decode_overhead_s = nan } }", "decode_overhead_s must be a finite number >= 0 (seconds)"),
    ("framework = { tp2 = { large_step = -0.5 } }", "large_step must be a finite number >= 0 (a factor)"),
    ("framework = { tp0 = { prefill_scale = 1.0 } }", "expected a table named tpN (N >= 1)"),
    ('kernel_tables = "JUNK"', "is not a .npz of arrays"),
    ('kernel_tables = "NPZ"', "lacks gemm_m, gemm_n"),
])
def test_bad_calibration_overlay_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: str,
                                             message: str) -> None:
    """Framework constants that would price a step at nothing or nan (a scale <= 0, a non-finite
    overhead, TP 0) and kernel-table files that are not the converter's are refused, not tracebacks."""
    (tmp_path / "junk.npz").write_bytes(b"junk")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    fields = fields.replace("JUNK", str(tmp_path / "junk.npz")).replace("NPZ", str(tmp_path / "other.npz"))
    overlay_file = tmp_path / "overlay.toml"
    overlay_file.write_text(H100_ENTRY + fields + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["step", "--phase", "prefill", "--prompt", "512", "--devices-per-instance", "2",
              "--cost-model", "calibrated", "--catalog", str(overlay_file)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("change, message", [
    ({"gemm_ms": np.zeros((2, 2, 2))}, "gemm_ms has shape (2, 2, 2), its axes say"),
    ({"gemm_ms": "nan"}, "gemm_ms must hold positive milliseconds (NaN where unmeasured), at least one measured"),
    ({"ctx_b": "reversed"}, "ctx_b must list at least two increasing positive numbers"),
    ({"gen_fp8_ms": None}, "gen_fp8_b, gen_fp8_s, gen_fp8_cfg missing beside gen_fp8_ms"),
    ({"ar_ms": "negative"}, "ar_ms must hold positive milliseconds"),
])
def test_malformed_kernel_tables_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict,
                                              message: str) -> None:
    """A user's tables file with arrays of the wrong shape, no measured cell, unsorted axes or half
    a format is named in one line (it raised IndexError or ZeroDivisionError)."""
    raw = {k: v for k, v in builtin_arrays("h100").items() if k in ARRAYS}
    for key, how in change.items():
        if how is None:
            raw[key] = builtin_arrays("h100")[key]
        elif isinstance(how, str):
            raw[key] = {"nan": np.full_like(raw[key], np.nan, dtype=np.float64), "reversed": raw[key][::-1],
                        "negative": -raw[key]}[how]
        else:
            raw[key] = how
    np.savez(tmp_path / "bad.npz", **raw)
    overlay = tmp_path / "bad.toml"
    overlay.write_text(H100_ENTRY + f'kernel_tables = "{tmp_path / "bad.npz"}"\n')
    with pytest.raises(SystemExit) as exc:
        main(["step", "--phase", "decode", "--context", "512", "--cost-model", "calibrated", "--catalog", str(overlay)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_non_bf16_models_are_refused(tmp_path: Path) -> None:
    cat = tmp_path / "fp8.toml"
    cat.write_text('[models.small-fp8]\nlayers = 2\nd_model = 1024\nheads = 8\nkv_heads = 8\nd_ff = 4096\n'
                   'vocab = 32000\nweight_bytes = 1.0\n')
    with pytest.raises(KvcargoError, match=r"bf16 and fp8 \(W8A8\) GEMMs only; small-fp8 keeps 1-byte weights "
                       "with bf16 compute"):
        step("small-fp8", "h100", 1, "decode", 1, 10, "calibrated", catalog=(str(cat),))


def test_step_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["step", "--phase", "decode", "--batch", "8", "--context", "512", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["time_s"] == step("llama3-8b", "h100", 1, "decode", 8, 512)["time_s"]
    assert r["energy_j"] == pytest.approx(r["compute_j"] + r["memory_j"])


def test_step_text_shows_scales_as_factors(capsys: pytest.CaptureFixture[str]) -> None:
    main(["step", "--phase", "prefill", "--prompt", "512", "--cost-model", "calibrated"])
    lines = {ln.split("  ")[0]: ln.split()[-1] for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["framework comm scale"] == f"{framework('h100', 1).comm_scale:.4g}"
    assert lines["framework scale"] == f"{framework('h100', 1).prefill_scale:.4g}"
    assert lines["framework large step scale"] == "0"  # TP 1


def test_a_tp_degree_that_does_not_divide_the_heads_rounds_up() -> None:
    """The busiest device of TP 3 over 32 heads computes 11 of them, not 10."""
    cat = catalog.builtin()
    cp = CalibratedPool(cat.model("llama3-8b"), cat.device("h100"), 3, load("h100"))
    assert (cp.heads, cp.kv_heads) == (11, 3)


def test_calibrated_run_with_every_handoff_option() -> None:
    """The calibrated and measured models compose with layer-wise sending, topologies, fair sharing,
    reservation and codecs (every request finishes, costs differ from the roofline)."""
    base = dict(requests=60, rate=4.0, cost_model="calibrated", link_model="measured")
    for extra in ({"send": "layerwise"}, {"topology": "nic", "link_sharing": "fair"},
                  {"topology": "nvlink-domain", "kv_reserve": "at-transfer"},
                  {"kv_compress": "fp8", "kv_compress_at": "endpoint"}, {"mode": "colocated", "link_model": "line-rate"},
                  {"send": "layerwise", "layer_groups": 4}, {"kv_compress": "freq-keep-k", "kv_keep": 0.5},
                  {"power_cap": 300.0, "lm_head": "last"}, {"prefill_device": "a100", "decode_device": "h200"}):
        s = simulate(SimConfig(**{**base, **extra})).summary
        assert s["completed"] == 60, extra
    assert simulate(requests=60).summary != simulate(requests=60, cost_model="calibrated").summary
    trace = SimConfig(workload_file="azure-conv-2023", limit=50, cost_model="calibrated", link_model="measured")
    assert simulate(trace).summary["completed"] == 50
    cached = SimConfig(workload_file="mooncake-conversation", limit=50, decode_prefix_cache=True,
                       cost_model="calibrated", link_model="measured")
    assert simulate(cached).summary["completed"] == 50


def test_calibrated_runs_the_serving_levers_and_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    """Chunked prefill, paged KV with swap, prefix caching, sessions and presets run under the
    calibrated and measured models (every request once, costs differ from the roofline's), and the
    planner searches with them."""
    base = dict(requests=80, rate=6.0, cost_model="calibrated", link_model="measured")
    for extra in ({"batch_policy": "chunked", "max_num_batched_tokens": 512},
                  {"kv_policy": "paged", "preemption": "swap", "decode": 2},
                  {"workload": "coding-agent", "prefix_caching": True, "rate": 0.5},
                  {"turns": 3, "think": 0.5, "system_prompts": 2, "system_len": 400, "prefix_caching": True},
                  {"mode": "colocated", "link_model": "line-rate", "batch_policy": "decode-priority"}):
        c = SimConfig(**{**base, **extra})
        s = simulate(c).summary
        assert s["completed"] + s["rejected"] == 80, extra
        assert s != simulate(c.replace(cost_model="roofline", link_model="line-rate")).summary, extra
    main(["capacity", "--cost-model", "calibrated", "--link-model", "measured", "--batch-policy", "chunked",
          "--requests", "150", "--json"])
    assert json.loads(capsys.readouterr().out)["search"]["feasible"] is True


def test_planner_searches_with_the_calibrated_models(capsys: pytest.CaptureFixture[str]) -> None:
    main(["capacity", "--cost-model", "calibrated", "--link-model", "measured", "--requests", "200", "--json"])
    search = json.loads(capsys.readouterr().out)["search"]
    assert search["rate"] > 0 and search["feasible"] is True


@pytest.mark.slow
def test_compiled_and_plain_engines_agree_on_a_calibrated_run() -> None:
    pytest.importorskip("numba")  # without it both runs are plain Python: nothing to compare
    args = ["simulate", "--cost-model", "calibrated", "--link-model", "measured", "--send", "layerwise",
            "--requests", "40", "--json", "--summary-only"]
    code = "import sys; from kvcargo.cli import main; main(sys.argv[1:])"
    outs = []
    for jit in ("1", "0"):
        env = {**os.environ, "KVCARGO_JIT": jit}
        outs.append(subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                                   check=True).stdout)
    assert outs[0] == outs[1]


def test_unknown_cost_model_is_refused() -> None:
    with pytest.raises(KvcargoError, match="--cost-model"):
        SimConfig.build(cost_model="magic")
