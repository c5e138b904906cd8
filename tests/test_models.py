"""KV layouts of modern models: every published KV-per-token figure, pinned exactly.

Also pins that the reference presets keep the derived values of reference-semantics §1.2 bit
for bit, so the new optional layout fields cannot move a published figure.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcargo import catalog
from kvcargo.catalog import Model
from kvcargo.cost import Pool, kv_capacity, shape
from kvcargo.errors import KvcargoError
from kvcargo.handoff import calculate

KiB, MiB = 1024, 1024 * 1024


def model(key: str) -> Model:
    return catalog.builtin().model(key)


# ------------------------------------------------------------------ published KV per token

@pytest.mark.parametrize(("key", "layout", "kv_bytes"), [
    ("opt-13b", "mha", 800 * KiB),             # vLLM's 800 KB per token
    ("opt-66b", "mha", 2.25 * MiB),
    ("llama3-8b", "gqa", 128 * KiB),
    ("llama3-70b", "gqa", 320 * KiB),          # Mooncake's figure
    ("llama2-70b", "gqa", 320 * KiB),
    ("qwen2.5-7b", "gqa", 56 * KiB),
    ("qwen2.5-32b", "gqa", 256 * KiB),
    ("qwen2.5-72b", "gqa", 320 * KiB),
    ("mistral-7b", "gqa", 128 * KiB),
    ("mistral-7b-swa", "gqa", 128 * KiB),
    ("mistral-large-2", "gqa", 352 * KiB),
    ("gemma2-9b", "gqa", 336 * KiB),
    ("deepseek-v3", "mla", 61 * (512 + 64) * 2),
])
def test_kv_bytes_per_token(key: str, layout: str, kv_bytes: float) -> None:
    m = model(key)
    assert m.kv_layout == layout
    assert shape(m).kv_per_token == int(kv_bytes)


def test_exact_byte_counts() -> None:
    assert shape(model("opt-13b")).kv_per_token == 819_200
    assert shape(model("opt-66b")).kv_per_token == 2_359_296
    assert shape(model("llama3-70b")).kv_per_token == 327_680
    assert shape(model("deepseek-v3")).kv_per_token == 70_272
    assert round(70_272 / KiB, 1) == 68.6


def test_mla_is_one_latent_not_split_by_tensor_parallelism() -> None:
    s = shape(model("deepseek-v3"))
    assert s.kv_per_token == 61 * 576 * 2  # not × 2 for K and V
    for n in (1, 2, 4, 8):
        assert s.kv_per_token_per_device(n) == 70_272
    gqa = shape(model("llama3-70b"))
    assert gqa.kv_per_token_per_device(4) == 327_680 // 4
    assert gqa.kv_per_token_per_device(8) == 327_680 // 8
    assert gqa.kv_per_token_per_device(16) == 327_680 // 8  # a device keeps at least one KV head


# ------------------------------------------------------------------------- sliding windows

def test_sliding_window_caps_the_handoff() -> None:
    full, swa = shape(model("mistral-7b")), shape(model("mistral-7b-swa"))
    for s in (1, 100, 4096):
        assert swa.handoff_bytes(s) == full.handoff_bytes(s) == s * 131_072
    assert swa.handoff_bytes(4097) == 4096 * 131_072
    assert swa.handoff_bytes(32_768) == 4096 * 131_072
    assert full.handoff_bytes(32_768) == 32_768 * 131_072


def test_interleaved_window_caps_half_the_layers() -> None:
    s = shape(model("gemma2-9b"))
    per_layer = 2 * 8 * 256 * 2
    assert s.window == 4096 and s.window_kv_per_token == 21 * per_layer
    assert s.handoff_bytes(1000) == 1000 * 42 * per_layer
    p = 10_000
    assert s.handoff_bytes(p) == p * 21 * per_layer + 4096 * 21 * per_layer
    # nonlinear in the prompt, and vectorised exactly like the scalar form
    prompts = np.array([1, 4095, 4096, 4097, 10_000, 100_000], dtype=np.int64)
    vec = s.handoff_bytes(prompts)
    assert vec.dtype == np.int64
    assert vec.tolist() == [s.handoff_bytes(int(x)) for x in prompts]
    assert isinstance(s.handoff_bytes(5000), int)


def test_handoff_calculator_uses_the_capped_size() -> None:
    m = model("mistral-7b-swa")
    r = calculate(m, 16_384, catalog.builtin().link("ib-ndr"), Pool(catalog.builtin().device("h100")))
    assert r.kv_bytes == 4096 * 131_072
    assert r.kv_bytes_per_token == 131_072


def test_simulator_hands_off_the_capped_size() -> None:
    from kvcargo import simulate
    from kvcargo.workload import Workload

    w = Workload(np.array([0.0, 0.5]), np.array([1000, 20_000]), np.array([4, 4]), source="test")
    swa = simulate(model="mistral-7b-swa", link="eth-25g", workload=w).output
    full = simulate(model="mistral-7b", link="eth-25g", workload=w).output
    assert swa.wire_bytes.tolist() == [1000 * 131_072, 4096 * 131_072]
    assert full.wire_bytes.tolist() == [1000 * 131_072, 20_000 * 131_072]
    assert swa.kv_ready[1] - swa.kv_start[1] < full.kv_ready[1] - full.kv_start[1]


# ------------------------------------------------------------------- mixture-of-experts counts

def test_moe_active_and_total_parameters() -> None:
    mix = shape(model("mixtral-8x7b"))
    assert mix.p_total == 46_702_526_464        # Mistral: 46.7B total
    assert mix.p_active == 12_879_659_008       # 12.9B active
    ds = shape(model("deepseek-v3"))
    assert ds.p_total == 671_025_397_760        # DeepSeek: 671B total (MTP module excluded)
    assert ds.p_active == 37_551_276_032        # DeepSeek: "37B activated" (+1.5%, see validate)
    assert ds.w_res == 671_025_397_760 * 1.0    # FP8 weights


def test_mla_attention_parameters() -> None:
    from kvcargo.cost import attention_params

    # q: 7168·1536 + 1536·128·192; kv: 7168·576 + 512·128·256; o: 128·128·7168
    assert attention_params(model("deepseek-v3")) == 187_105_280


def test_explicit_head_dim_sizes_the_query_projection() -> None:
    from kvcargo.cost import attention_params

    # Gemma-2-9B: 16 heads × 256 = 4096 ≠ d_model 3584
    assert attention_params(model("gemma2-9b")) == 2 * 3584 * 4096 + 2 * 3584 * 2048
    # the reference presets keep 2d² + 2d·kv
    assert attention_params(model("llama3-8b")) == 2 * 4096**2 + 2 * 4096 * 1024


# ------------------------------------------------ the reference presets are unchanged (§1.2)

REFERENCE = {
    "llama3-8b": (218_103_808, 8_029_995_008, 7_504_658_432, 16_059_990_016, 15_009_316_864, 8192, 131_072),
    "llama3-70b": (855_638_016, 70_552_387_584, 69_501_714_432, 141_104_775_168, 139_003_428_864, 16_384, 327_680),
    "mistral-7b": (218_103_808, 7_241_465_856, 7_110_393_856, 14_482_931_712, 14_220_787_712, 8192, 131_072),
    "yi-34b": (557_842_432, 34_388_049_920, 33_929_297_920, 68_776_099_840, 67_858_595_840, 14_336, 245_760),
    "opt-13b": (314_567_680, 13_097_492_480, 12_840_099_840, 26_194_984_960, 25_680_199_680, 10_240, 819_200),
    "llama3.2-1b": (60_817_408, 1_498_415_104, 1_235_746_816, 2_996_830_208, 2_471_493_632, 4096, 32_768),
}


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_reference_presets_unchanged(key: str) -> None:
    s = shape(model(key))
    assert (s.p_layer, s.p_total, s.p_mm, s.w_res, s.w_str, s.row_bytes, s.kv_per_token) == REFERENCE[key]
    assert s.window is None and s.window_kv_per_token == 0
    assert s.handoff_bytes(2048) == 2048 * s.kv_per_token


def test_mixtral_reference_counts_unchanged() -> None:
    s = shape(model("mixtral-8x7b"))
    assert (s.p_layer, s.p_total, s.p_mm, s.w_res) == (394_297_344, 46_702_526_464, 12_748_587_008,
                                                       93_405_052_928)


def test_reference_kv_capacities_unchanged() -> None:
    dev = catalog.builtin().device
    assert kv_capacity(model("llama3-8b"), Pool(dev("h100"))) == 426_788
    assert kv_capacity(model("llama3-70b"), Pool(dev("h100"), 4)) == 448_288
    assert kv_capacity(model("mistral-7b"), Pool(dev("a100"))) == 438_820
    assert kv_capacity(model("opt-13b"), Pool(dev("a100-40g"))) == 11_969


# ------------------------------------------------------------------------------ validation

BASE = dict(key="x", name="x", layers=4, d_model=256, heads=4, kv_heads=4, d_ff=512, vocab=1000)


@pytest.mark.parametrize(("extra", "message"), [
    (dict(kv_layout="mha", kv_heads=2), "needs kv_heads == heads"),
    (dict(kv_layout="mla"), "needs kv_lora_rank"),
    (dict(kv_lora_rank=64), "apply only to kv_layout 'mla'"),
    (dict(window_layers=2), "window_layers needs sliding_window"),
    (dict(sliding_window=128, window_layers=5), "must not exceed layers"),
    (dict(dense_layers=1), "only to a mixture of experts"),
    (dict(sliding_window=0), "greater than 0"),
])
def test_layout_validation(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Model(**{**BASE, **extra})


def test_user_catalog_rejects_a_bad_layout(tmp_path) -> None:
    f = tmp_path / "m.toml"
    f.write_text('[models.bad]\nlayers = 2\nd_model = 64\nheads = 2\nkv_heads = 2\nd_ff = 128\n'
                 'vocab = 10\nkv_layout = "mla"\n')
    with pytest.raises(KvcargoError, match="models.bad"):
        catalog.load([f])


def test_user_mla_model_from_toml(tmp_path) -> None:
    f = tmp_path / "m.toml"
    f.write_text('[models.tiny-mla]\nlayers = 2\nd_model = 64\nheads = 2\nkv_heads = 2\nd_ff = 128\n'
                 'vocab = 10\nkv_layout = "mla"\nkv_lora_rank = 16\nqk_rope_dim = 8\nqk_nope_dim = 8\n'
                 'v_head_dim = 8\n')
    m = catalog.load([f]).model("tiny-mla")
    assert shape(m).kv_per_token == 2 * (16 + 8) * 2
