"""Prefix-aware hand-off: a decode-side LRU cache of prompt blocks (opt-in)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcargo import simulate
from kvcargo.errors import KvcargoError
from kvcargo.workload import Workload


def _workload(blocks: list[list[int]], prompts: list[int], gap: float = 5.0) -> Workload:
    n = len(blocks)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    return Workload(np.arange(n) * gap, np.array(prompts), np.full(n, 4), source="test",
                    block_ids=np.array([i for b in blocks for i in b], dtype=np.int64), block_offsets=offsets)


def test_a_repeated_prompt_sends_only_what_the_receiver_lacks() -> None:
    wl = _workload([[1, 2, 3], [1, 2, 3], [1, 2, 9], [7, 8]], [1500, 1500, 1300, 1024])
    out = simulate(workload=wl, link="eth-25g", decode_prefix_cache=True).output
    sent = out.kv_ready - out.kv_start
    latency, per_token = 20e-6, 131072 / 3.125e9
    assert sent[0] == pytest.approx(latency + 1500 * per_token, rel=1e-12)
    assert sent[1] == pytest.approx(latency, rel=1e-12)  # every block already there
    assert sent[2] == pytest.approx(latency + (1300 - 1024) * per_token, rel=1e-12)  # only the last block
    assert sent[3] == pytest.approx(latency + 1024 * per_token, rel=1e-12)
    s = simulate(workload=wl, link="eth-25g", decode_prefix_cache=True).summary
    assert s["prefix_saved_bytes"] == (1500 + 1024) * 131072
    plain = simulate(workload=wl, link="eth-25g").summary
    assert plain["prefix_saved_bytes"] == 0 and plain["handoff_p50"] > s["handoff_p50"]


def test_the_cache_fits_in_spare_kv_memory() -> None:
    """OPT-13B on an A100-40G holds 11,969 KV tokens: 23 blocks. Forty distinct 512-token
    prompts evict the first one, which then crosses again in full."""
    blocks = [[i] for i in range(40)] + [[0]]
    wl = _workload(blocks, [512] * 41)
    out = simulate(workload=wl, model="opt-13b", device="a100-40g", link="eth-25g", decode_prefix_cache=True).output
    assert out.send_fraction[-1] == 1.0
    wl = _workload([[i] for i in range(10)] + [[0]], [512] * 11)
    out = simulate(workload=wl, model="opt-13b", device="a100-40g", link="eth-25g", decode_prefix_cache=True).output
    assert out.send_fraction[-1] == 0.0


def test_needs_block_ids() -> None:
    with pytest.raises(KvcargoError, match="--decode-prefix-cache needs prompt block ids"):
        simulate(requests=10, decode_prefix_cache=True)
