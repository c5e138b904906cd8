"""A run that keeps only its summary (``--summary-only``) folds its step log a chunk at a time
and keeps none of it: its summary equals the whole run's, bit for bit.

CI runs this file compiled and as plain Python (``KVCARGO_JIT=0``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvcargo.engine.cluster as cluster
from kvcargo import SimConfig, simulate
from kvcargo.engine.steplog import StepFold
from kvcargo.metrics import step_ends


def _exact(summary: dict) -> str:
    """The summary as text, every float by its repr (so equal text is equal bits)."""
    return json.dumps(summary, sort_keys=True, default=str)


@pytest.mark.parametrize("kw", [
    {},
    {"prefill": 3, "decode": 2, "rate": 20, "link": "eth-25g"},
    {"mode": "colocated", "instances": 3, "rate": 12},
    {"link": "eth-25g", "send": "layerwise", "link_sharing": "fair", "kv_reserve": "at-transfer", "rate": 12},
    {"speculative": "llama3.2-1b", "prefill": 2, "decode": 2, "rate": 16, "alpha": 0.9},
    {"prefill": 2, "decode": 2, "rate": 30, "max_batch": 4},
    {"batch_policy": "chunked", "kv_policy": "paged"},  # the scheduled engine keeps its log
], ids=["default", "3P2D", "colocated", "beyond", "speculative", "overloaded", "scheduled"])
@pytest.mark.parametrize("chunk", [7, 1000])
def test_the_summary_of_a_folded_step_log_is_the_whole_runs(monkeypatch: pytest.MonkeyPatch, kw: dict,
                                                           chunk: int) -> None:
    config = SimConfig.build(requests=2000, **kw)
    whole = simulate(config)
    monkeypatch.setattr(cluster, "CHUNK_STEPS", chunk)
    folded = simulate(config, summary_only=True)
    assert _exact(folded.summary) == _exact(whole.summary)
    if folded.output.folded is not None and folded.output.figures is None:  # a windowed run keeps no ends
        assert len(folded.output.steps) == 0  # no step log kept
        ends, inst = step_ends(whole.output)
        order = np.argsort(inst, kind="stable")
        assert np.array_equal(folded.output.folded.ends, ends[order])
        assert np.array_equal(folded.output.folded.instances(), inst[order])


def test_a_fold_keeps_each_instances_steps_in_order_and_sums_batches() -> None:
    logf = np.array([[0.0, 1.0], [0.5, 2.0], [1.0, 3.0], [2.0, 4.0]])
    logi = np.array([[1, 5], [0, 2], [1, 7], [1, 1]], dtype=np.int32)
    fold = StepFold(3)
    fold.take(logf[:3], logi[:3])
    fold.take(logf[3:], logi[3:])
    steps = fold.steps()
    assert steps.ends.tolist() == [2.0, 1.0, 3.0, 4.0]
    assert steps.rows.tolist() == [1, 3, 0] and steps.batch.tolist() == [2, 13, 0]
    assert steps.instances().tolist() == [0, 1, 1, 1]
