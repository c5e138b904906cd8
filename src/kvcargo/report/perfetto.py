"""A Chrome trace-event JSON of a run (opens in Perfetto, ui.perfetto.dev, or chrome://tracing).

One track per prefill instance (its batch steps), one per link channel (each transfer, named by
its request), one per decode or colocated instance (its steps, with the batch size) and, under the
serving levers, one per instance whose requests were preempted (each span from the preemption to
the re-admission or swap-in). Times are simulated microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvcargo.simulation import SimResult

MAX_EVENTS = 2_000_000
"""Beyond this many events the trace keeps the first ones (a viewer cannot load more anyway)."""

PREFILL, LINK, DECODE, PREEMPTED = 1, 2, 3, 4


def _lane(inst: tuple[str, int], n_prefill: int) -> int:
    """Track of an instance's preemptions (prefill instances first, as everywhere)."""
    pool, i = inst
    return i if pool == "prefill" else n_prefill + i


def _meta(pid: int, tid: int | None, name: str) -> dict[str, Any]:
    if tid is None:
        return {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
    return {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}


def _step(pid: int, tid: int, name: str, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": start * 1e6, "dur": (end - start) * 1e6,
            "args": args}


def _scale_up(result: SimResult, role: str) -> str:
    """A pool's layout and the share of its busy time spent communicating ('' without a layout)."""
    lever = getattr(result.output.resolved.levers, "prefill" if role == "prefill" else "decode")
    if lever.layout is None:
        return ""
    lay = lever.layout
    return (f", tp {lay.tp} × pp {lay.pp}, {100 * result.summary[f'comm_frac_{role}']:.1f}% of busy time "
            f"communicating over {lever.scale_up.name}")


def trace_events(result: SimResult) -> list[dict[str, Any]]:
    """The run as trace events (prefill batches, transfers, decode steps; a pool's name gives its
    parallel layout and communication share)."""
    out = result.output
    res = out.resolved
    colocated = res.colocated
    events: list[dict[str, Any]] = []
    pool = "colocated" if colocated else "decode"
    events.append(_meta(DECODE, None, f"{pool} pool ({res.decode_pool.n}× {res.decode_pool.device.key}"
                                      f"{_scale_up(result, pool)})"))
    for d in range(res.n_decode):
        events.append(_meta(DECODE, d, f"{pool}-{d}"))
    # prefill batches: requests that started together on one instance
    owner = out.decode_inst if colocated else out.prefill_inst
    pid = DECODE if colocated else PREFILL
    if not colocated:
        events.append(_meta(PREFILL, None, f"prefill pool ({res.prefill_pool.n}× {res.prefill_pool.device.key}"
                                            f"{_scale_up(result, 'prefill')})"))
        for p in range(res.n_prefill):
            events.append(_meta(PREFILL, p, f"prefill-{p}"))
    started = np.flatnonzero(~np.isnan(out.first_token))
    keys = np.stack([owner[started], out.prefill_start[started]], axis=1)
    _, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    for i, n in zip(first, counts):
        r = started[i]
        events.append(_step(pid, int(owner[r]), "prefill", out.prefill_start[r], out.first_token[r],
                            {"requests": int(n), "first request": int(r)}))
    # transfers, each on the first channel free when it started
    moved = np.flatnonzero(~np.isnan(out.kv_start))
    if len(moved):
        events.append(_meta(LINK, None, f"KV link ({res.link.name})"))
        free: list[float] = []
        for r in moved[np.argsort(out.kv_start[moved], kind="stable")]:
            ch = next((c for c, t in enumerate(free) if t <= out.kv_start[r]), len(free))
            if ch == len(free):
                free.append(0.0)
                events.append(_meta(LINK, ch, f"channel {ch}"))
            free[ch] = out.kv_ready[r]
            events.append(_step(LINK, ch, f"KV of request {r}", out.kv_start[r], out.kv_ready[r],
                                {"bytes on the wire": float(out.wire_bytes[r]), "prompt": int(out.prompt[r])}))
    for (start, end), (inst, batch) in zip(out.steps[:MAX_EVENTS], out.step_inst[:MAX_EVENTS]):
        events.append(_step(DECODE, int(inst), "decode", start, end, {"batch": int(batch)}))
    if out.spans:  # serving levers: requests preempted out of a batch (recomputed or swapped to host)
        events.append(_meta(PREEMPTED, None, "preempted requests"))
        for inst in sorted({(pool, i) for _, pool, i, _, _, _ in out.spans}):
            events.append(_meta(PREEMPTED, _lane(inst, res.n_prefill), f"{inst[0]}-{inst[1]}"))
        for what, pool, i, r, start, end in out.spans[:MAX_EVENTS]:
            events.append(_step(PREEMPTED, _lane((pool, i), res.n_prefill), f"request {r} {what}", start, end,
                                {"request": r}))
    return events[:MAX_EVENTS]


def write_trace(result: SimResult, path: str | Path) -> None:
    """Write the trace as JSON (``{"traceEvents": [...]}``)."""
    from kvcargo.outputs import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": trace_events(result), "displayTimeUnit": "ms",
                   "otherData": {"kvcargo": result.config.model_dump()}}, fh)
