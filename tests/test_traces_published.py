"""The readers against the published statistics of the full traces shipped with the package
(src/kvcargo/data/traces/README.md), opened by their built-in names as a user would."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvcargo.workload.builtin import trace_dir
from kvcargo.workload.stats import trace_stats
from kvcargo.workload.traces import read_trace

TRACES = trace_dir()


def test_mooncake_conversation_published_statistics() -> None:
    w = read_trace("mooncake-conversation")
    assert len(w) == 12_031
    assert round(w.prompt.mean()) == 12_035 and round(w.output.mean()) == 343
    assert round(w.arrival[-1]) == 3_537  # "~3,537 s"
    assert w.block_offsets[-1] == len(w.block_ids) == 288_500
    assert np.array_equal(np.diff(w.block_offsets), -(-w.prompt // 512))


def test_mooncake_synthetic_published_statistics() -> None:
    w = read_trace("mooncake-synthetic")
    assert len(w) == 3_993
    assert round(w.prompt.mean()) == 15_325 and round(w.output.mean()) == 149


def test_azure_code_published_statistics() -> None:
    w = read_trace("azure-code-2023")
    assert len(w) == 8_819
    assert np.median(w.prompt) == 1_469 and np.median(w.output) == 13
    assert 3_400 < w.arrival[-1] < 3_600  # ~1 h


def test_azure_conversation_published_statistics() -> None:
    w = read_trace("azure-conv-2023")
    assert len(w) == 19_366
    assert np.median(w.prompt) == 1_020 and np.median(w.output) == 129
    assert 3_400 < w.arrival[-1] < 3_600


def test_trace_stats_of_the_full_conversation_trace() -> None:
    st = trace_stats(read_trace("mooncake-conversation"))
    assert st["requests"] == 12_031 and round(st["prompt"]["mean"]) == 12_035
    assert st["blocks"]["total"] == 288_500 and 0 < st["blocks"]["reused_share"] < 1
    assert st["timeline"]["bucket_s"] == 60.0


def test_excerpts_are_prefixes_of_the_full_traces() -> None:
    excerpts = Path(__file__).resolve().parent / "data" / "traces"
    for name in ("mooncake_conversation.jsonl", "mooncake_synthetic.jsonl", "azure2023_code.csv",
                 "azure2023_conv.csv"):
        assert (TRACES / name).read_text(encoding="utf-8").startswith((excerpts / name).read_text(encoding="utf-8"))
