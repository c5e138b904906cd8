"""The catalog is data: every preset of the spec, user extensions, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcargo import catalog
from kvcargo.errors import KvcargoError


def test_builtin_presets_of_the_spec() -> None:
    cat = catalog.builtin()
    assert {"llama3-8b", "llama3-70b", "mistral-7b", "yi-34b", "opt-13b", "mixtral-8x7b", "llama3.2-1b"} <= set(cat.models)
    assert {"h100", "a100", "a100-40g", "h200", "b200"} <= set(cat.devices)
    assert {"nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "ib-ndr", "eth-100g", "eth-25g",
            "cpo-optical"} <= set(cat.links)
    assert {"none", "fp8", "fp4-block", "freq-keep-k"} <= set(cat.codecs)
    h100, a100 = cat.device("h100"), cat.device("a100")
    assert (h100.peak_flops, h100.hbm_bw, h100.capacity, h100.tdp_w, h100.idle_w) == (989e12, 3.35e12, 80e9, 700, 100)
    assert (a100.pj_per_flop, a100.pj_per_byte, a100.flop_eff, a100.bw_eff) == (1.6, 70, 0.55, 0.80)
    ib, e25 = cat.link("ib-ndr"), cat.link("eth-25g")
    assert (ib.bandwidth, ib.latency, ib.pj_per_bit, ib.channels) == (50e9, 10e-6, 15, 1)
    assert (e25.bandwidth, e25.latency) == (3.125e9, 20e-6)
    assert cat.codec("fp4-block").ratio == 64 / 17
    assert cat.model("llama3.2-1b").head_dim == 64 and cat.model("yi-34b").head_dim == 128


def test_unknown_key_lists_the_valid_ones() -> None:
    with pytest.raises(KvcargoError, match=r"unknown link 'eth-400g'; valid choices: .*eth-25g.*ib-ndr"):
        catalog.builtin().link("eth-400g")


def test_user_file_adds_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "mine.toml"
    f.write_text('[links.roce-800g]\nname = "RoCE 800G"\nbandwidth = 100e9\nlatency = 8e-6\npj_per_bit = 12\n'
                 '[devices.h100]\nname = "H100 (derated)"\npeak_flops = 989e12\nhbm_bw = 3.35e12\ncapacity = 80e9\n'
                 'flop_eff = 0.5\n')
    cat = catalog.load([f])
    assert cat.link("roce-800g").bandwidth == 100e9
    assert cat.device("h100").flop_eff == 0.5
    assert cat.link("ib-ndr").bandwidth == 50e9  # built-ins stay


@pytest.mark.parametrize("body, message", [
    ('[models.tiny]\nname = "tiny"\nlayers = "many"\nd_model = 64\nheads = 4\nkv_heads = 4\nd_ff = 128\nvocab = 100\n',
     r"mine.toml: entry models.tiny: field 'layers'"),
    ('[models.tiny]\nlayers = 2\n', r"entry models.tiny: field 'd_model': Field required"),
    ('[links.slow]\nbandwidth = -1\n', r"entry links.slow: field 'bandwidth': Input should be greater than 0"),
    ('[links.slow]\nbandwidth = 1e9\nspeed = 3\n', r"entry links.slow: field 'speed': Extra inputs"),
    ('[gpus.x]\nname = "x"\n', r"unknown section 'gpus'; valid sections: models, devices, links, codecs"),
    ('not toml at all [', r"mine.toml: not valid TOML"),
])
def test_malformed_entries_name_file_entry_and_field(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "mine.toml"
    f.write_text(body)
    with pytest.raises(KvcargoError, match=message):
        catalog.load([f])


def test_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(KvcargoError, match="cannot read"):
        catalog.load([tmp_path / "absent.toml"])
