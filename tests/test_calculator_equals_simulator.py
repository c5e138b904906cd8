"""The calculator and the simulator time a hand-off with one function: a lone request on an idle
link hands off in exactly the calculator's time, and its TTFT is the calculator's prefill (an
endpoint codec's encode pass included)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcargo import catalog
from kvcargo.handoff import calculate_config
from kvcargo.params import HandoffConfig
from kvcargo.simulation import simulate
from kvcargo.workload import Workload

CAT = catalog.builtin()
PROMPT = 2048
LINKS = ("eth-25g", "ib-ndr", "nvlink4")
CODEC_OPTIONS = {"freq-keep-k": {"kv_keep": 0.25}, "ratio": {"kv_ratio": 5.0}}
"""Codecs that need a parameter get one."""


def _one_request(**config: object):
    """One request arriving at 0 s with a two-token output (so that its KV is handed off)."""
    lone = Workload(np.zeros(1), np.array([PROMPT]), np.array([2]), source="one request")
    return simulate(workload=lone, **config).output


def _assert_same(config: dict) -> None:
    calc, *_ = calculate_config(HandoffConfig.build(prompt=PROMPT, **config))
    out = _one_request(**config)
    assert out.prefill_start[0] == 0.0
    assert out.first_token[0] == calc.prefill_s  # the TTFT: arrival and prefill start are 0
    if config.get("send", "whole") == "whole":
        assert out.kv_ready[0] == out.first_token[0] + calc.transfer_s
    else:
        assert out.kv_ready[0] - out.first_token[0] == calc.exposed_s


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("send", ["whole", "layerwise"])
@pytest.mark.parametrize("at", ["transit", "endpoint"])
@pytest.mark.parametrize("codec", list(CAT.codecs))
def test_every_codec_placement_and_send_mode(codec: str, at: str, send: str, link: str) -> None:
    _assert_same({"link": link, "kv_compress": codec, "kv_compress_at": at, "send": send,
                  **CODEC_OPTIONS.get(codec, {})})


@pytest.mark.parametrize("config", [
    {"link": "eth-25g"},
    {"link": "eth-25g", "send": "layerwise"},
    {"link": "eth-100g", "send": "layerwise", "layer_groups": 4},
    {"link": "eth-25g", "send": "layerwise", "link_channels": 1},
    {"link": "eth-25g", "send": "layerwise", "link_channels": 8, "kv_compress": "fp4-block"},
    {"link": "eth-25g", "kv_compress": "fp4-block", "transit_ops_per_byte": 8.0},
    {"link": "ib-ndr", "link_model": "measured"},
    {"link": "ib-ndr", "link_model": "measured", "send": "layerwise"},
    {"link": "ib-ndr", "cost_model": "calibrated"},
    {"link": "ib-ndr", "lm_head": "last"},
    {"link": "ib-ndr", "kv_format": "fp8"},
    {"link": "ib-ndr", "speculative": "mtp"},
    {"link": "ib-ndr", "model": "llama3-70b", "devices_per_instance": 4, "send": "layerwise"},
])
def test_every_option_that_changes_the_answer(config: dict) -> None:
    _assert_same(config)
