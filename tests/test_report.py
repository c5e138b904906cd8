"""Reports: the Perfetto trace holds every prefill batch, transfer and decode step."""

from __future__ import annotations

import json
from pathlib import Path

from kvcargo import simulate
from kvcargo.report.perfetto import write_trace


def test_trace_has_every_step_and_transfer(tmp_path: Path) -> None:
    r = simulate(link="eth-25g", requests=300, prefill=2)
    write_trace(r, tmp_path / "t.json")
    events = json.load(open(tmp_path / "t.json"))["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    prefill_steps = int(r.output.stats[:2, 5].sum())
    assert sum(e["name"] == "prefill" for e in spans) == prefill_steps
    assert sum(e["name"].startswith("KV of request") for e in spans) == r.summary["transfers"] == 300
    decode = [e for e in spans if e["name"] == "decode"]
    assert len(decode) == len(r.output.steps) and all(e["dur"] > 0 for e in decode)
    assert sum(e["args"]["batch"] for e in decode) == int((r.output.output - 1).sum())
    # transfers on one channel never overlap
    kv = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["pid"] == 2)
    assert all(a[1] <= b[0] + 1e-6 for a, b in zip(kv, kv[1:]))


def test_colocated_trace_puts_both_phases_on_the_instance(tmp_path: Path) -> None:
    r = simulate(mode="colocated", requests=100)
    write_trace(r, tmp_path / "c.json")
    spans = [e for e in json.load(open(tmp_path / "c.json"))["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {3} and {e["name"] for e in spans} == {"prefill", "decode"}
