"""The configuration's sections, the grouped summary and the catalog cache keep every published
key and value: they regroup, they do not change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvcargo import catalog
from kvcargo.config import HANDOFF_FEATURES, SECTIONS, SimConfig, section
from kvcargo.simulation import simulate
from kvcargo.summary import Summary


def test_every_field_is_in_exactly_one_section() -> None:
    listed = [f for fields in SECTIONS.values() for f in fields]
    assert sorted(listed) == sorted(SimConfig.model_fields)
    assert set(HANDOFF_FEATURES) <= set(SECTIONS["handoff"])
    assert section(SimConfig(link="eth-25g"), "handoff")["link"] == "eth-25g"


def test_the_opt_in_handoff_features_are_defined_once() -> None:
    assert SimConfig().handoff_features == ()
    c = SimConfig(send="layerwise", topology="nic")
    assert c.handoff_features == ("send", "topology") and c.early_decode_choice
    assert not SimConfig(send="layerwise").early_decode_choice
    for field, reference in HANDOFF_FEATURES.items():
        assert SimConfig.model_fields[field].default == reference


@pytest.mark.parametrize("config", [
    {}, {"mode": "colocated"}, {"send": "layerwise", "link": "eth-25g"}, {"batch_policy": "chunked"},
    {"kv_compress": "fp8", "ppa": True},
])
def test_the_grouped_summary_gives_back_the_flat_keys_values_and_order(config: dict) -> None:
    result = simulate(requests=60, **config)
    flat = result.summary
    grouped = result.grouped
    assert grouped.flat() == flat and list(grouped.flat()) == list(flat)
    assert grouped.latency["ttft"].p99 == flat["ttft_p99"]
    assert grouped.slo.attainment == flat["slo_attainment"]
    assert grouped.link.busy == flat["link_busy"] and grouped.energy.total_j == flat["energy_j"]
    assert grouped.instances.rows == flat["instances"] and grouped.cost.silicon_usd == flat["silicon_usd"]
    assert ("exposed" in grouped.latency) == (config.get("send") == "layerwise")
    assert Summary.of(grouped.flat()) == grouped


def test_the_catalog_is_parsed_once_per_version_of_its_files(tmp_path: Path) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text('[links.slow]\nname = "Slow"\nbandwidth = 1e9\nlatency = 1e-5\npj_per_bit = 5.0\n')
    first = catalog.load([extra])
    assert catalog.load([str(extra)]) is first and first.link("slow").bandwidth == 1e9
    assert catalog.load([]) is catalog.builtin()
    extra.write_text('[links.slow]\nname = "Slow"\nbandwidth = 2e9\nlatency = 1e-5\npj_per_bit = 5.0\n')
    os.utime(extra, ns=(1, 1))  # a different modification time, whatever the clock's resolution
    assert catalog.load([extra]).link("slow").bandwidth == 2e9
