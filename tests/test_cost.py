"""The cost model: parameter counts, KV bytes, roofline step times, power, capacity (spec §1–§3)."""

from __future__ import annotations

import pytest

from kvcargo import catalog
from kvcargo.cost import (
    Pool,
    decode_step,
    kv_capacity,
    power_w,
    prefill_step,
    require_fit,
    shape,
    silicon_cost_usd,
)
from kvcargo.errors import KvcargoError

CAT = catalog.builtin()


@pytest.mark.parametrize("key, p_layer, p_total, p_mm, w_res, w_str, kv_tok", [
    ("llama3-8b", 218_103_808, 8_029_995_008, 7_504_658_432, 16_059_990_016, 15_009_316_864, 131_072),
    ("llama3-70b", 855_638_016, 70_552_387_584, 69_501_714_432, 141_104_775_168, 139_003_428_864, 327_680),
    ("mistral-7b", 218_103_808, 7_241_465_856, 7_110_393_856, 14_482_931_712, 14_220_787_712, 131_072),
    ("yi-34b", 557_842_432, 34_388_049_920, 33_929_297_920, 68_776_099_840, 67_858_595_840, 245_760),
    ("opt-13b", 314_567_680, 13_097_492_480, 12_840_099_840, 26_194_984_960, 25_680_199_680, 819_200),
    ("llama3.2-1b", 60_817_408, 1_498_415_104, 1_235_746_816, 2_996_830_208, 2_471_493_632, 32_768),
    ("mixtral-8x7b", 394_297_344, 46_702_526_464, 12_748_587_008, 93_405_052_928, None, 131_072),
])
def test_derived_counts_of_spec_1_2(key, p_layer, p_total, p_mm, w_res, w_str, kv_tok) -> None:
    s = shape(CAT.model(key))
    assert (s.p_layer, s.p_total, s.p_mm, s.w_res, s.kv_per_token) == (p_layer, p_total, p_mm, w_res, kv_tok)
    if w_str is not None:
        assert s.w_str == w_str


def test_handoff_bytes() -> None:
    assert shape(CAT.model("llama3-8b")).handoff_bytes(2048) == 268_435_456
    assert shape(CAT.model("llama3-70b")).handoff_bytes(2048) == 671_088_640


H100_1, H100_4 = Pool(CAT.device("h100")), Pool(CAT.device("h100"), 4)


def test_step_time_check_values_of_spec_3() -> None:
    m8, m70 = CAT.model("llama3-8b"), CAT.model("llama3-70b")
    d = decode_step(m8, H100_1, 1, 2048)
    assert (d.flops, round(d.bytes / 1e9, 3), round(d.time * 1e3, 3), d.bound) == (16_083_582_976, 15.278, 6.201, "memory")
    assert round(decode_step(m8, H100_1, 64, 2048).time * 1e3, 3) == 12.514
    assert round(decode_step(m8, H100_1, 64, 2048).bytes / 1e9, 3) == 32.198
    d70 = decode_step(m70, H100_4, 16, 2300)
    assert (round(d70.bytes / 1e9, 3), round(d70.time * 1e3, 3)) == (151.068, 14.592)
    assert (round(power_w(H100_4, d70) / 4), round(d70.energy_j, 1)) == (295, 11.4)
    dvfs = decode_step(m70, Pool(CAT.device("h100"), 4, dvfs=True), 16, 2300)
    assert (round(power_w(H100_4, dvfs) / 4), round(dvfs.energy_j, 1), dvfs.time) == (262, 9.4, d70.time)
    assert round(decode_step(m70, H100_4, 1, 2048).time * 1e3, 3) == 13.529
    p70 = prefill_step(m70, H100_4, [2048])
    assert (p70.flops, round(p70.bytes / 1e9, 3), round(p70.time * 1e3, 3), p70.bound) == (
        290_179_264_806_912, 139.708, 133.867, "compute")
    assert (round(power_w(H100_4, p70) / 4), round(p70.energy_j, 1)) == (658, 298.6)
    p8 = prefill_step(m8, H100_1, [2048])
    assert (round(p8.bytes / 1e9, 3), round(p8.time * 1e3, 3)) == (15.295, 59.033)


def test_power_cap_throttles_and_never_exceeds_the_budget() -> None:
    m8 = CAT.model("llama3-8b")
    capped = Pool(CAT.device("h100"), power_cap_w=300)
    for prompts in ([64], [2048], [8192], [512] * 8):
        free, slow = prefill_step(m8, H100_1, prompts), prefill_step(m8, capped, prompts)
        assert slow.time >= free.time
        assert power_w(capped, slow) <= 300 * (1 + 1e-9)
        assert (slow.energy_j / (slow.time - 0.5e-3)) <= (300 - 100) * (1 + 1e-9)
    assert prefill_step(m8, capped, [2048]).bound == "power"


@pytest.mark.parametrize("model, device, n, tokens", [
    ("llama3-8b", "h100", 1, 426_788), ("llama3-8b", "a100", 1, 426_788), ("llama3-8b", "a100-40g", 1, 152_130),
    ("llama3-8b", "h200", 1, 845_642), ("llama3-8b", "b200", 1, 1_113_433), ("llama3-70b", "h100", 4, 448_288),
    ("llama3-70b", "h100", 2, 8_835), ("llama3-70b", "h100", 8, 1_327_194), ("llama3-70b", "h200", 4, 1_118_454),
    ("llama3-70b", "b200", 4, 1_546_921), ("mistral-7b", "a100", 1, 438_820), ("opt-13b", "a100-40g", 1, 11_969),
    ("yi-34b", "a100", 2, 306_086),
])
def test_kv_capacity_of_spec_2_2(model: str, device: str, n: int, tokens: int) -> None:
    assert kv_capacity(CAT.model(model), Pool(CAT.device(device), n)) == tokens


def test_model_that_does_not_fit() -> None:
    assert kv_capacity(CAT.model("llama3-70b"), H100_1) == 0
    with pytest.raises(KvcargoError, match="Llama-3-70B does not fit the decode pool .*at least 2 devices"):
        require_fit(CAT.model("llama3-70b"), H100_1, "decode")


def test_bad_pools() -> None:
    with pytest.raises(KvcargoError, match="not above the static power"):
        Pool(CAT.device("h100"), power_cap_w=90)
    with pytest.raises(KvcargoError, match="devices per instance must be >= 1"):
        Pool(CAT.device("h100"), 0)
    with pytest.raises(KvcargoError, match="no native 'fp4' rate; valid choices: bf16, fp8, int8"):
        Pool(CAT.device("h100"), precision="fp4")


def test_silicon_cost_of_spec_7() -> None:
    assert silicon_cost_usd(CAT.device("h100")) == 339.09863688464617
    assert silicon_cost_usd(CAT.device("a100")) == 348.1625474720805
