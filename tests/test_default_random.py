"""The companion's full-precision summaries of random default-path configurations, bit for bit.

``tests/data/reference-runs/default-random/checks.json`` (copied from ``shared/data``) holds, per
case, the flags exactly as ``kvcargo simulate`` takes them and the companion's summary values; for
some cases a per-request CSV too. Every case runs here through the CLI's own option parsing and the Python API, and every
listed key (and every request stamp, where given) must be equal. The spec-only oracle
(:mod:`oracle`) must reproduce every case as well: the rules, not only kvcargo, are right.

CI runs this file compiled with numba and as plain Python (``KVCARGO_JIT=0``).
"""

from __future__ import annotations

import csv
import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from kvcargo.cli.options import config_from
from kvcargo.cli.simulate import command
from kvcargo.config import resolve
from kvcargo.engine.cluster import EngineOutput, run
from kvcargo.metrics import summarize

try:
    from oracle import run_resolved
    from oracle import summarize as oracle_summary
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.oracle import run_resolved  # type: ignore[no-redef]
    from tests.oracle import summarize as oracle_summary  # type: ignore[no-redef]

DATA = Path(__file__).resolve().parent / "data" / "reference-runs" / "default-random"
STAMPS = ("prefill_start", "first_token", "kv_start", "kv_ready", "decode_start", "finish")
CASES = json.loads((DATA / "checks.json").read_text())


def _resolved(name: str):  # type: ignore[no-untyped-def]
    return resolve(config_from(command.make_context("simulate", list(CASES[name]["args"])).params))


@cache
def _run(name: str) -> EngineOutput:
    return run(_resolved(name))


def _assert_expected(got: dict, name: str) -> None:
    differ = {k: (got[k], v) for k, v in CASES[name]["expect"].items()
              if not (got[k] == v or (v is None and isinstance(got[k], float) and math.isnan(got[k])))}
    assert not differ, f"(computed, companion): {differ}"


@pytest.mark.parametrize("name", list(CASES))
def test_summary_equals_the_companions(name: str) -> None:
    _assert_expected(summarize(_run(name)), name)


@pytest.mark.parametrize("name", list(CASES))
def test_oracle_equals_the_companions(name: str) -> None:
    res = _resolved(name)
    _assert_expected(oracle_summary(run_resolved(res), res.config.ttft_slo, res.config.tpot_slo), name)


@pytest.mark.parametrize("name", [n for n in CASES if (DATA / f"{n}.requests.csv").exists()])
def test_request_stamps_equal_the_companions(name: str) -> None:
    out = _run(name)
    with open(DATA / f"{name}.requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["rid"]) for r in rows] == list(range(len(out.arrival)))
    assert [float(r["arrival"]) for r in rows] == out.arrival.tolist()
    for col in STAMPS:
        ref = np.array([float(r[col]) if r[col] else math.nan for r in rows])
        ok = (getattr(out, col) == ref) | (np.isnan(getattr(out, col)) & np.isnan(ref))
        assert ok.all(), f"{col}: first differing request {int(np.argmin(ok))}"
