"""The workload drawn in chunks from one random stream: the chunks put together are the whole
workload, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from kvcargo.workload.generator import LengthDist, generate, generate_chunks


@pytest.mark.parametrize("size", [1, 999, 10_000, 20_001])
def test_the_workload_drawn_in_chunks_is_the_whole_workload(size: int) -> None:
    p, o = LengthDist(2048), LengthDist(256, 0.5, hi=300)
    whole = generate(20_001, 100.0, p, o, 3)
    parts = list(generate_chunks(20_001, 100.0, p, o, 3, size))
    assert all(len(c) == size for c in parts[:-1])
    for name in ("arrival", "prompt", "output"):
        assert np.array_equal(np.concatenate([getattr(c, name) for c in parts]), getattr(whole, name))
    assert sum(c.clipped_outputs for c in parts) == whole.clipped_outputs > 0
