"""A run that keeps only its summary and holds only a window of its requests (``--summary-only``).

The handlers index the per-request arrays by request, as in every run; here those arrays are
zeroed anonymous memory, whose pages the system commits only once written. The run loads a chunk
of requests at a time, just ahead of their arrivals (the engine pauses with ARRIVALS_DUE before
scheduling an arrival not yet loaded, and schedules it on resuming: same clock, same sequence
numbers, so the same run bit for bit). At each pause, the requests settled below the first
unsettled one have their figures taken (``kvcargo.metrics.RequestFigures``, the token gaps by
``steplog.GapFold``) and the pages below them are given back to the system (Linux
``madvise(MADV_DONTNEED)``; elsewhere they stay: the results are the same, only the memory
differs). The engine never reads a settled request's rows again, which the tests check with
tiny chunks (pages given back read as zeros).

Requests settle in arrival order only roughly, but completed requests are taken in arrival
order (index order: the arrivals do not decrease), as the summary ranks them. Opt-in models
with extra per-request arrays (compression, hand-off features, layer-wise send, fair sharing,
at-transfer reservation, speculative decoding, a prefix cache, model classes beyond the
transformer, CED replay on decode) and multi-turn sessions run whole (:func:`windowable`).
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from kvcargo import stepcost
from kvcargo.ced import replay_on_decode
from kvcargo.config import Resolved, needs_extra_columns
from kvcargo.engine import aot, cluster
from kvcargo.engine import state as S
from kvcargo.engine.cluster import (
    EngineOutput,
    build_params,
    event_loop,
    instance_records,
    pulls,
    request_records,
    request_rows,
)
from kvcargo.engine.state import fresh_rows, grown, new_state
from kvcargo.engine.steplog import GapFold
from kvcargo.stats import Sample

CHUNK = 1 << 16
"""Requests loaded at a time."""
HELD_BYTES = 16 << 20
"""Bytes of one summary sample held in memory; past them it goes to a temporary file."""


def windowable(res: Resolved) -> bool:
    """Whether a summary-only run of ``res`` can hold a window of its requests (the others run
    whole, with the same summary)."""
    c, w = res.config, res.workload
    return (w.sessions is None and w.block_ids is None and not needs_extra_columns(c) and not pulls(res)
            and not replay_on_decode(res.model) and c.link_sharing != "fair" and c.send != "layerwise"
            and res.levers.draft is None and not c.decode_prefix_cache
            and stepcost.step_class(res.model) == stepcost.ATTENTION)


class Pages:
    """Zeroed arrays in anonymous private memory whose leading rows can be given back."""

    def __init__(self) -> None:
        self.maps: list[tuple[mmap.mmap, np.ndarray, int]] = []
        self.given = 0

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
        """A zeroed array (where anonymous private maps are not available: numpy's)."""
        if not hasattr(mmap, "MAP_PRIVATE"):
            return np.zeros(shape, dtype=dtype)
        count = int(np.prod(shape))
        m = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize), flags=mmap.MAP_PRIVATE)
        a = np.frombuffer(m, dtype=dtype, count=count).reshape(shape)
        self.maps.append((m, a, a.nbytes // max(1, len(a))))
        return a

    def give_back(self, rows: int) -> None:
        """Give the whole pages below row ``rows`` of every array back to the system."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for m, _, row_bytes in self.maps:
            start = self.given * row_bytes // mmap.PAGESIZE * mmap.PAGESIZE
            stop = rows * row_bytes // mmap.PAGESIZE * mmap.PAGESIZE
            if stop > start:
                m.madvise(mmap.MADV_DONTNEED, start, stop - start)
        self.given = rows


def run_windowed(res: Resolved, chunk: int = CHUNK, held_bytes: int = HELD_BYTES) -> EngineOutput:
    """Simulate ``res`` a window at a time (``chunk`` requests loaded at once); the output has
    the summary's figures and no per-request fields."""
    from kvcargo.metrics import RequestFigures  # the summary's side, only for this run

    n = len(res.workload)
    pages = Pages()
    loaded = min(n, chunk)
    params, xfer = build_params(res, pages.zeros, loaded)
    wire, bound = pages.zeros(n), pages.zeros(n, np.bool_)
    wire[:loaded], bound[:loaded] = xfer.wire_bytes, xfer.transit_bound
    del xfer
    channels = params.pf[:, S.PF_CHANNELS].astype(np.int64)
    n_slots = res.n_decode if res.colocated else res.n_prefill
    st = new_state(n, n_slots, res.n_decode, res.n_prefill + res.n_decode, res.config.max_batch, channels, 1,
                   False, log_capacity=cluster.CHUNK_STEPS, zeros=pages.zeros, loaded=loaded)
    aot.prepare(n)
    gaps = GapFold(res.n_decode, Sample(weighted=True, limit=held_bytes))
    fig = RequestFigures(res, n, gaps, limit=held_bytes)
    totals = instance_records(res, st, channels)
    taken = 0
    loop = event_loop()
    while True:
        code = loop(st, params)
        if code == S.LOG_FULL:
            gaps.stop(st)
            st.i[S.I_NSTEPS] = 0
            continue
        if code == S.EVENTS_FULL:
            st = grown(st, code)
            continue
        k = int(st.i[S.I_NSTEPS])
        gaps.take(st.logf[:k], st.logi[:k])
        st.i[S.I_NSTEPS] = 0
        pending = np.flatnonzero(st.r[taken:loaded, S.STATUS] == S.PENDING)
        settled = taken + (int(pending[0]) if len(pending) else loaded - taken)
        if settled > taken:
            out = EngineOutput(resolved=res, **request_records(res, st, taken, settled, bound[taken:settled],
                                                               wire[taken:settled]),
                               **totals, steps=st.logf[:0], step_inst=st.logi[:0])
            fig.take(out, np.flatnonzero(out.status == S.DONE))
            taken = settled
        if gaps.early is None and fig.zone_closed():
            gaps.keep_early(*fig.held_gaps()[:3])
        gaps.flush(_first_steps(st, taken, loaded, gaps.rows))
        pages.give_back(taken)
        if code == S.FINISHED:
            break
        lo, loaded = loaded, min(n, loaded + chunk)
        xfer = request_rows(res, params.rf, params.rx, params.ri, lo, loaded)[0]
        wire[lo:loaded], bound[lo:loaded] = xfer.wire_bytes, xfer.transit_bound
        fresh_rows(st, lo, loaded)
        st.i[S.I_LOADED] = loaded
    fig.close()
    return EngineOutput(resolved=res, **request_records(res, st, n, n, bound[:0], wire[:0]),
                        **instance_records(res, st, channels), steps=st.logf[:0], step_inst=st.logi[:0],
                        folded=gaps.steps(), figures=fig)


def _first_steps(st: S.State, lo: int, hi: int, folded: np.ndarray) -> np.ndarray:
    """Per decode instance, the first step a request not yet taken (``lo`` to ``hi``; the later
    ones have not arrived) may still need: its earliest first step, else the first step not
    folded."""
    below = folded.copy()
    inst, first = st.r[lo:hi, S.DECODE_INST], st.r[lo:hi, S.FIRST_STEP]
    started = first >= 0
    np.minimum.at(below, inst[started], first[started])
    return below
