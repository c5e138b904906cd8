"""FFT-mixing models, causal encoder-decoders and optical transform engines (levers-mixers spec).

* The spec's step-level check values, exactly.
* An independent restatement of the op ledger (a loop over layers, written from the spec's
  text) against the packed kernels, on random batches.
* Every value of the companion's 11 check configurations and every request of its three
  published runs, bit for bit (``==`` on floats).
* Properties: a 0-encoder CED is the plain model; the hybrid's attention K/V is the attention
  layers' share of the transformer's; a transformer on an engine device runs the H100's steps.
"""

from __future__ import annotations

import csv
import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcargo import catalog
from kvcargo.cli import main
from kvcargo.cli.options import given_params
from kvcargo.cli.simulate import command as simulate_command
from kvcargo.config import SimConfig, resolve
from kvcargo.cost import Pool, kv_capacity, roofline, shape, silicon_cost_usd
from kvcargo.engine.cluster import run
from kvcargo.optical import with_overrides
from kvcargo.simulation import simulate
from kvcargo.stepcost import decode_step, prefill_step

DATA = Path(__file__).resolve().parent / "data" / "reference-runs" / "levers-mixers"
CHECKS = json.loads((DATA / "checks.json").read_text())
CAT = catalog.builtin()
H100 = Pool(CAT.device("h100"))
HYENA, DIST, HYBRID, CIRC = "llama3-8b-hyena", "llama3-8b-hyena-dist", "llama3-8b-hybrid", "llama3-8b-hyena-circ"
FFT_MODELS = (HYENA, DIST, HYBRID, CIRC)


def model(key: str):  # type: ignore[no-untyped-def]
    return CAT.model(key)


# ------------------------------------------------------------------------- spec check values


def test_parameters_cache_and_capacity() -> None:
    """levers-mixers §1.2–§1.3 tables."""
    expect = {
        HYENA: (7_784_628_224, 8_835_301_376, 8_309_964_800, 524_288, 0, (103_625, 240_954, 515_612, 934_466)),
        DIST: (7_784_628_224, 8_835_301_376, 8_309_964_800, 0, 16_777_216, (3_238, 7_529, 16_112, 29_202)),
        HYBRID: (7_583_301_632, 8_633_974_784, 8_108_638_208, 425_984, 0, (128_483, 297_504, 635_545, 1_151_057)),
        CIRC: (30_408_704, 1_081_081_856, 555_745_280, 524_288, 0, (133_205, 270_534, 545_192, 964_046)),
    }
    pools = [H100, Pool(CAT.device("h100"), 2), Pool(CAT.device("h100"), 4), Pool(CAT.device("h200"), 4)]
    for key, (p_layers, p_total, p_mm, kv, state, caps) in expect.items():
        s = shape(model(key))
        assert (s.p_layers, s.p_total, s.p_mm, s.kv_per_token, s.state_bytes) == (p_layers, p_total, p_mm, kv, state)
        assert tuple(kv_capacity(model(key), p) for p in pools) == caps
        for dev in ("a100", "optical-fft", "optical-fft-small"):
            assert kv_capacity(model(key), Pool(CAT.device(dev))) == caps[0]
    assert shape(model(HYENA)).handoff_bytes(2048) == 1_073_741_824
    assert shape(model(HYBRID)).handoff_bytes(2048) == 872_415_232
    assert shape(model(DIST)).handoff_bytes(2048) == shape(model(DIST)).handoff_bytes(7) == 16_777_216


def test_prefill_ledger_check_values() -> None:
    """§1.4 (totals), §1.5 (bytes with the filter spectra) and §1.7 (times, --fft-efficiency)."""
    cases = {  # model, lm_head: total FLOPs, time, time at x = 1/16
        (HYENA, "all"): (34_110_631_837_696, 0.06320913105560437, 0.0650745775426712),
        (HYBRID, "all"): (33_542_756_237_312, 0.062165146129813394, 0.06356423099511352),
        (CIRC, "all"): (2_577_292_328_960, 0.00523810520996415, 0.015182801343358763),
        (CIRC, "last"): (426_564_386_816, 0.0021233365014925376, None),
    }
    for (key, head), (flops, t, t16) in cases.items():
        step = prefill_step(model(key), H100, [2048], head)
        assert (step.flops, step.time) == (flops, t)
        if t16 is not None:
            assert prefill_step(model(key), H100, [2048], head, fft_efficiency=1 / 16).time == t16
    hy = prefill_step(model(HYENA), H100, [2048])
    assert (hy.bytes, hy.bound) == (19_858_980_864, "compute")
    assert prefill_step(model(HYENA), H100, [2048], fft_efficiency=0.0625).flops == 35_125_341_454_336
    dist = prefill_step(model(DIST), H100, [2048, 1000])
    assert (dist.flops, dist.bytes, dist.time) == (50_764_322_963_456, 19_901_775_872, 0.09382534785082451)


def test_decode_check_values() -> None:
    """§1.6: the first decode step of a 2,048-token prompt on 1×H100."""
    cases = {
        HYENA: (17_694_720_000, 17_694_728_192, 0.007102510519402985),
        DIST: (16_653_484_032, 16_636_715_008, 0.006707729480597014),
        HYBRID: (17_292_066_816, 17_090_551_808, 0.006877071570149254),
        CIRC: (2_297_581_568, 2_186_289_152, 0.0013157795343283582),
    }
    for key, expect in cases.items():
        step = decode_step(model(key), H100, 1, 2049)
        assert (step.flops, step.bytes, step.time) == expect


def test_engine_prefill_check_values() -> None:
    """§3.4: a Hyena prompt on 1×optical-fft, defaults and optimistic settings."""
    dev = CAT.device("optical-fft")
    step = prefill_step(model(HYENA), Pool(dev), [2048])
    assert (step.flops, step.bytes, step.time, step.bound) == (34_042_984_529_920, 17_710_448_640,
                                                                0.35835624250293413, "optical")
    assert (step.compute_j, step.memory_j, step.conversion_j) == (34.04298452992, 1.0626269184, 0.26388279066624)
    assert step.optical_flops == 67_647_307_776
    # [2048, 1000, 300]: conv = 56,170,119,168 pairs, 471 rewrites, t_opt = 0.5130081405065063 s
    # (overlapped, the optical time is the step's)
    batch = prefill_step(model(HYENA), Pool(with_overrides(dev, overlap=True)), [2048, 1000, 300])
    assert batch.time == 0.5130081405065063 + 0.5e-3
    assert batch.conversion_j == (56_170_119_168 * 7.68) * 1e-12
    fast = Pool(with_overrides(dev, enob=11, mask_rate=20000.0, overlap=True))
    step = prefill_step(model(HYENA), fast, [2048])
    assert (step.time, step.bound) == (0.06308476795646659, "compute")
    step = prefill_step(model(CIRC), fast, [2048], "last")
    assert (step.time, step.bound, step.flops, step.conversion_j) == (0.018779185024, "optical", 65_936_556_032,
                                                                       0.27212912787456)


def test_engine_areas_and_costs() -> None:
    """§3.6: digital die plus converters, photonic die, $ per device."""
    assert silicon_cost_usd(CAT.device("optical-fft")) == 357.23423079414755
    assert silicon_cost_usd(CAT.device("optical-fft-small")) == 366.3196826381871
    assert silicon_cost_usd(with_overrides(CAT.device("optical-fft"), samples_per_s=2e12)) == 363.61551310927024


def test_ced_check_values() -> None:
    """§4.2–§4.6: prefill with the replay, encoder only, capacities, the mixed replay step."""
    from kvcargo.ced import encoder_resident_bytes

    m70 = model("llama3-70b-ced")
    h = CAT.device("h100")
    step = prefill_step(m70, Pool(h, 4), [2048])
    assert (step.flops, step.bytes, step.time, step.bound) == (155_050_282_319_872, 139_708_071_936,
                                                                0.07176127508037135, "compute")
    step = prefill_step(m70, Pool(h, 2), [2048], encoder_only=True)
    assert (step.flops, step.bytes, step.time) == (145_686_632_857_600, 70_497_861_632, 0.13441546360658146)
    step = prefill_step(model("llama3-8b-ced"), H100, [2048])
    assert (step.flops, step.bytes, step.time) == (16_487_859_355_648, 15_294_529_536, 0.03081135096175751)
    assert encoder_resident_bytes(m70) == 71_894_564_864
    assert [kv_capacity(m70, Pool(h, n), encoder_resident_bytes(m70)) for n in (1, 2, 4)] == [321, 220_048, 659_501]
    assert [kv_capacity(m70, Pool(h, n)) for n in (2, 4)] == [8_835, 448_288]
    m70d = m70.model_copy(update={"ced_replay_on": "decode"})
    step = decode_step(m70d, Pool(h, 4), 5, 10_000, [2048])
    assert (step.flops, step.bytes, step.time) == (19_179_571_249_152, 142_955_134_976, 0.013835367068656717)


# ------------------------------------------------- an independent restatement of the ledger


def _pow2(x: int) -> int:
    f = 1
    while f < x:
        f *= 2
    return f


def _R(f: int) -> float:
    return 2.5 * f * math.log2(f)


def _oracle_matrix(k: int, m: int, c: int, t: int) -> dict[str, float]:
    if k == 0:
        return {"dense": 2 * m * c * t}
    bins = k / 2 + 1
    return {"transform": t * ((c / k) * _R(k) + (m / k) * _R(k)), "spectral": t * (m / k) * (c / k) * bins * 6,
            "other": t * (m / k) * (c / k - 1) * bins * 2}


def _oracle_prefill(key: str, prompts: list[int], head: str) -> tuple[float, float]:
    """Total FLOPs and bytes of a prefill step on a GPU, layer by layer, as the spec words it."""
    m = model(key)
    d, ff, kv, N = m.d_model, m.d_ff, m.kv_heads * m.head_dim, 2
    T = sum(prompts)
    led = {"dense": 0.0, "attention": 0.0, "transform": 0.0, "spectral": 0.0, "other": 0.0}

    def add(part: dict[str, float]) -> None:
        for name, v in part.items():
            led[name] += v

    hyena_layers = 0
    for i in range(m.layers):
        for mc in ((ff, d), (ff, d), (d, ff)):
            add(_oracle_matrix(m.circulant_block, *mc, T))
        if m.mixer == "hybrid" and i % 4 == 0:
            add({"dense": 2 * T * (2 * d * d + 2 * d * kv), "attention": sum(2 * d * s * (s + 1) for s in prompts)})
            continue
        hyena_layers += 1
        add(_oracle_matrix(m.circulant_block, (N + 1) * d, d, T))
        add(_oracle_matrix(m.circulant_block, d, d, T))
        add({"other": T * 2 * 3 * (N + 1) * d + T * N * d})
        for s in prompts:
            f = _pow2(2 * s)
            add({"transform": N * d * 2 * _R(f), "spectral": N * d * (f / 2 + 1) * 6})
    add({"dense": 2 * m.vocab * d * (T if head == "all" else len(prompts))})
    state = hyena_layers * N * d * 16 * 4 if m.hyena_decode == "distilled" else 0
    kv_tok = (0 if m.hyena_decode == "distilled" else (2 * (m.layers - hyena_layers) * kv + hyena_layers * N * d) * 2)
    p_mm = shape(m).p_mm
    spectra = 4 * hyena_layers * N * d * sum(f / 2 + 1 for f in {_pow2(2 * s) for s in prompts})
    nbytes = p_mm * 2 + T * d * 2 + T * kv_tok + len(prompts) * state + spectra
    return sum(led.values()), nbytes


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FFT_MODELS), st.lists(st.integers(1, 9000), min_size=1, max_size=6),
       st.sampled_from(["all", "last"]))
def test_prefill_agrees_with_a_restatement_of_the_spec(key: str, prompts: list[int], head: str) -> None:
    flops, nbytes = _oracle_prefill(key, prompts, head)
    step = prefill_step(model(key), H100, prompts, head)
    assert (step.flops, step.bytes) == (flops, nbytes)
    t, _, _ = roofline(H100.coefficients(), flops, nbytes)
    assert step.time == t


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FFT_MODELS), st.integers(1, 256), st.integers(0, 2_000_000))
def test_decode_agrees_with_a_restatement_of_the_spec(key: str, batch: int, extra_context: int) -> None:
    """§1.6, layer by layer: B sequences, C = Σ context (at least one cached token each)."""
    m = model(key)
    d, ff, kv, N = m.d_model, m.d_ff, m.kv_heads * m.head_dim, 2
    C = batch + extra_context
    distilled = m.hyena_decode == "distilled"
    total = 0.0
    for i in range(m.layers):
        for mc in ((ff, d), (ff, d), (d, ff)):
            total += sum(_oracle_matrix(m.circulant_block, *mc, batch).values())
        if m.mixer == "hybrid" and i % 4 == 0:
            total += 2 * batch * (2 * d * d + 2 * d * kv) + 4 * d * (C + batch)
            continue
        total += sum(_oracle_matrix(m.circulant_block, (N + 1) * d, d, batch).values())
        total += sum(_oracle_matrix(m.circulant_block, d, d, batch).values())
        total += N * d * 8 * 16 * batch if distilled else N * d * 2 * (C + batch)
    total += 2 * m.vocab * d * batch
    s = shape(m)
    nbytes = s.w_str + batch * d * 2 + (C + batch) * s.kv_per_token + batch * s.state_bytes
    step = decode_step(m, H100, batch, C)
    assert (step.flops, step.bytes) == (total, nbytes)
    assert step.time == roofline(H100.coefficients(), total, nbytes)[0]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama3-8b", "llama3-70b"]), st.integers(1, 31), st.integers(1, 600),
       st.lists(st.integers(1, 9000), min_size=1, max_size=5), st.sampled_from(["all", "last"]))
def test_ced_prefill_agrees_with_a_restatement(base: str, E: int, W: int, prompts: list[int], head: str) -> None:
    m = model(base).model_copy(update={"ced_encoder_layers": E, "ced_replay": W})
    d, kv, L = m.d_model, m.kv_heads * m.head_dim, m.layers
    D = L - E
    p_att = 2 * d * d + 2 * d * kv + 3 * d * m.d_ff
    p_prompt = E * p_att + D * 2 * d * kv
    w = [min(s, W) for s in prompts]
    T, Rt = sum(prompts), sum(w)
    flops = (2 * p_prompt * T + sum(2 * E * d * s * (s + 1) for s in prompts) + 2 * D * p_att * Rt
             + sum(sum(4 * D * d * c for c in range(s - x + 1, s + 1)) for s, x in zip(prompts, w))
             + 2 * m.vocab * d * (Rt if head == "all" else len(prompts)))
    pool = Pool(CAT.device("h100"), 4)
    assert prefill_step(m, pool, prompts, head).flops == flops
    encoder = flops - (2 * D * p_att * Rt + 2 * m.vocab * d * (Rt if head == "all" else len(prompts))
                       + sum(sum(4 * D * d * c for c in range(s - x + 1, s + 1)) for s, x in zip(prompts, w)))
    assert prefill_step(m, pool, prompts, head, encoder_only=True).flops == encoder


# ----------------------------------------------------------------- the companion's full runs


def _config(args: list[str]) -> SimConfig:
    """The companion's CLI flags as kvcargo's (its --prefill-lm-head is kvcargo's --lm-head)."""
    args = ["--lm-head" if a == "--prefill-lm-head" else a for a in args]
    return SimConfig.build(**given_params(simulate_command.make_context("simulate", args).params))


def _value(summary: dict, key: str) -> object:
    """A summary value by the check file's key (``new:<metric>.<instance>`` is an instance row's)."""
    if not key.startswith("new:"):
        return summary[key]
    name = key.removeprefix("new:")
    if "." not in name:
        return summary[name]
    metric, inst = name.split(".")
    row = next(r for r in summary["instances"] if r["name"] == inst)
    return row[metric.replace("_J", "_j")]


@cache
def _summary(case: str) -> dict:
    return simulate(_config(CHECKS[case]["args"])).summary


@pytest.mark.parametrize("case", list(CHECKS))
def test_companion_check_values(case: str) -> None:
    s = _summary(case)
    wrong = {k: (_value(s, k), v) for k, v in CHECKS[case]["expect"].items() if _value(s, k) != v}
    assert not wrong


@pytest.mark.parametrize("case", [p.name.removesuffix(".requests.csv") for p in sorted(DATA.glob("*.requests.csv"))])
def test_companion_requests(case: str) -> None:
    with open(DATA / f"{case}.requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cols = simulate(_config(CHECKS[case]["args"])).requests()
    assert len(rows) == len(cols["rid"])
    for name in rows[0]:
        ref = np.array([float(r[name]) if r[name] else math.nan for r in rows])
        got = np.asarray(cols[name], dtype=np.float64)
        same = (ref == got) | (np.isnan(ref) & np.isnan(got))
        assert same.all(), f"{name}: first differing request {int(np.argmin(same))}"


def test_replay_on_decode_csv_has_prefill_done(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    simulate(model="llama3-8b-ced", ced_replay_on="decode", requests=20).write_requests_csv(path)
    assert path.read_text().splitlines()[0].endswith(",finish,prefill_done")
    simulate(model="llama3-8b-ced", requests=20).write_requests_csv(path)
    assert path.read_text().splitlines()[0].endswith(",finish")


# ------------------------------------------------------------------------------- properties


STAMPS = ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish")


@pytest.mark.parametrize("extra", [{}, {"mode": "colocated"}, {"link": "eth-25g", "rate": 12.0}])
def test_zero_encoder_layers_is_the_plain_model(extra: dict) -> None:
    plain = run(resolve(SimConfig.build(model="llama3-8b", requests=300, **extra)))
    off = run(resolve(SimConfig.build(model="llama3-8b-ced", ced_encoder_layers=0, requests=300, **extra)))
    for col in STAMPS:
        a, b = getattr(plain, col), getattr(off, col)
        assert ((a == b) | (np.isnan(a) & np.isnan(b))).all(), col
    assert (plain.stats == off.stats).all()


def test_hybrid_attention_kv_is_the_attention_layers_share() -> None:
    hybrid, full, hyena = shape(model(HYBRID)), shape(model("llama3-8b")), shape(model(HYENA))
    attention_part = hybrid.kv_per_token - hyena.kv_per_token * 24 // 32
    assert attention_part * 32 == full.kv_per_token * 8


def test_a_transformer_on_an_engine_device_runs_the_gpu_steps() -> None:
    gpu = simulate(requests=200)
    eng = simulate(requests=200, device="optical-fft")
    for col in STAMPS:
        a, b = getattr(gpu.output, col), getattr(eng.output, col)
        assert ((a == b) | (np.isnan(a) & np.isnan(b))).all(), col
    H = eng.summary["horizon_s"]
    assert eng.summary["energy_optical_static_j"] == 2 * 20.0 * H
    assert eng.summary["energy_j"] == gpu.summary["energy_j"] + 2 * 20.0 * H


def test_distilled_requests_reserve_one_unit() -> None:
    """A distilled request holds one state: capacity in sequences, not tokens."""
    res = resolve(SimConfig.build(model=DIST, requests=50))
    assert res.kv_capacity == 3_238
    from kvcargo.engine.cluster import build_params
    from kvcargo.engine.state import UNITS

    params, _ = build_params(res)
    assert (params.ri[:, UNITS] == 1).all()


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("args, words", [
    (["--model", HYENA, "--ced-encoder-layers", "4"], "attention models only"),
    (["--model", "llama3-8b", "--ced-encoder-layers", "32"], "at least one decoder layer"),
    (["--model", "mixtral-8x7b", "--ced-encoder-layers", "4"], "without CED only"),
    (["--model", "llama3-8b-ced", "--ced-replay", "0"], "--ced-replay"),
    (["--model", "llama3-8b-ced", "--ced-replay-on", "decode", "--mode", "colocated"], "--mode disagg"),
    (["--model", "llama3-8b", "--ced-replay", "64"], "applies only to a causal encoder-decoder"),
    (["--model", "llama3-8b", "--fft-efficiency", "0.5"], "FFT-mixing"),
    (["--model", HYENA, "--fft-efficiency", "0"], "--fft-efficiency"),
    (["--model", HYENA, "--fft-efficiency", "-1"], "--fft-efficiency"),
    (["--model", HYENA, "--ft-enob", "9"], "transform engine"),
    (["--model", HYENA, "--device", "optical-fft", "--ft-mask-rate", "0"], "--ft-mask-rate"),
    (["--model", HYENA, "--device", "optical-fft", "--ft-samples-per-s", "-5"], "--ft-samples-per-s"),
    (["--model", "llama3-8b", "--device", "optical-fft", "--ft-overlap"], "FFT-mixing"),
    (["--model", HYENA, "--send", "layerwise"], "attention models without CED"),
    (["--model", "llama3-8b-ced", "--kv-reserve", "at-transfer"], "attention models without CED"),
    (["--model", "llama3-70b-ced", "--devices-per-instance", "1"], "does not fit"),
    (["--model", HYENA, "--cost-model", "calibrated"], "measured for attention models without CED only"),
])
def test_bad_combinations_are_one_line_errors(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--requests", "10", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], err


@pytest.mark.parametrize("body, words", [
    ("mixer = 'hyena'\ncirculant_block = 100", "circulant_block must be a power of two"),
    ("mixer = 'hybrid'\nhyena_decode = 'distilled'", "apply only to mixer 'hyena'"),
    ("mixer = 'hyena'\nexperts = 8\ntop_k = 2", "dense full-attention shape"),
    ("ced_encoder_layers = 2", "at least one decoder layer"),
    ("mixer = 'hyena'\nced_encoder_layers = 1", "dense attention model"),
    ("mixer = 'mamba'", "mixer"),
])
def test_catalog_validates_the_family_fields(tmp_path: Path, body: str, words: str) -> None:
    from kvcargo.errors import KvcargoError

    path = tmp_path / "m.toml"
    path.write_text("[models.x]\nlayers = 2\nd_model = 512\nheads = 8\nkv_heads = 8\nd_ff = 1024\nvocab = 1000\n" + body)
    with pytest.raises(KvcargoError, match="entry models.x") as err:
        CAT.extended(path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_catalog_validates_the_engine_table(tmp_path: Path) -> None:
    from kvcargo.errors import KvcargoError

    path = tmp_path / "d.toml"
    path.write_text("[devices.y]\npeak_flops = 1e15\nhbm_bw = 3e12\ncapacity = 80e9\n"
                    "ft_engine = { mask_rate_hz = 0 }\n")
    with pytest.raises(KvcargoError, match="ft_engine.mask_rate_hz"):
        CAT.extended(path)


def test_step_command_prices_the_family_step_classes() -> None:
    """``kvcargo step`` charges what the engine charges: the mixer's step, not a transformer's."""
    from kvcargo.steps import step_cost

    assert step_cost(model(HYENA), H100, "decode", 1, 2049)["time_s"] == 0.007102510519402985
    assert step_cost(model(HYBRID), H100, "prefill", 1, 2048)["time_s"] == 0.062165146129813394
    engine = step_cost(model(HYENA), Pool(CAT.device("optical-fft")), "prefill", 1, 2048)
    assert (engine["time_s"], engine["bound"]) == (0.35835624250293413, "optical")
