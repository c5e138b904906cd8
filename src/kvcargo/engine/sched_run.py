"""Run the scheduled engine's array event loop (:mod:`.sched_loop`) on a resolved configuration.

Builds the arrays from the configuration (the same rules and prices as :mod:`.scheduled`'s
SimPy model, which remains for prefix caching and for closed-loop sessions without a lever),
compiles the loop when that pays, runs it (growing a table that fills up) and packs the
record every summary reads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvcargo import _jit
from kvcargo.config import Resolved
from kvcargo.cost import model_coefficients, shape
from kvcargo.engine import aot
from kvcargo.engine import sched_state as S
from kvcargo.engine.cluster import step_tables
from kvcargo.engine.heap import ITEMS
from kvcargo.engine.sched_gaps import per_request
from kvcargo.engine.scheduled import WATERMARK, _sum, lever_stats, pool_arrays, transfers_of
from kvcargo.errors import KvcargoError
from kvcargo.serving import (
    DEFAULT_BLOCK,
    DEFAULT_HOST_LINK,
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_PREEMPTION,
    check_model,
)
from kvcargo.transfer import endpoint_work

PLAIN_S_PER_TOKEN = 4e-6
"""Seconds of plain Python per output token (the event loop's per-row work, 2-core machine)."""
EXPANDED_GAPS_MAX = 4_000_000
"""Up to this many token gaps, the record also lists every request's gaps (tests, small runs);
the summary always reads them from the runs."""
POLICIES = {"prefill-priority": S.PREFILL_PRIORITY, "decode-priority": S.DECODE_PRIORITY, "chunked": S.CHUNKED}
KV_POLICIES = {"oracle": S.ORACLE, "pow2": S.POW2, "max": S.MAXLEN, "paged": S.PAGED}
ROLES = ("colocated", "prefill", "decode")
SPAN_NAMES = ("preempted: recompute", "swapped out")


def handles(res: Resolved) -> bool:
    """Whether the array engine runs this configuration: a serving lever without prefix caching."""
    return res.config.scheduled and not res.config.prefix_caching


def build(res: Resolved, xfer: Any) -> S.SchedState:
    """The arrays of a fresh run (``xfer``: the hand-offs' transfers, disaggregated)."""
    c, w, model = res.config, res.workload, res.model
    check_model(res)
    n = len(w)
    mi, mf = (np.array(a) for a in model_coefficients(model, c.lm_head))  # writable, as the compiled loop's
    host = res.catalog.link(c.host_link or DEFAULT_HOST_LINK)
    budget = c.max_num_batched_tokens if c.max_num_batched_tokens is not None else c.token_budget
    paged = c.kv_policy == "paged"
    block = c.kv_block_size or DEFAULT_BLOCK
    unit = block if paged else 1
    npre = 0 if res.colocated else res.n_prefill
    m = npre + res.n_decode
    rf = S.REQUEST_FLOATS.new(n, order="F")  # column by column: the record's columns are views
    rf[:, S.ARR] = w.arrival
    ri = _line_aligned(n, S.RI_WIDTH)
    ri[:, : S.REQUEST_INTS.width] = S.REQUEST_INTS.fresh
    ri[:, S.P] = w.prompt
    ri[:, S.O] = w.output
    s = w.sessions
    if s is not None:
        ri[:, S.SUCC] = s.successor
        rf[:, S.THINK] = s.think
        roots = np.nonzero(np.asarray(s.predecessor) < 0)[0].astype(np.int64)
    else:
        roots = np.arange(n, dtype=np.int64)
    endpoint = False
    if not res.colocated:
        comp = res.compression
        rf[:, S.XFER_T], rf[:, S.XFER_J], rf[:, S.TRANSIT_J] = xfer.duration, xfer.link_j, xfer.transit_j
        if comp is not None and comp.at == "endpoint":
            endpoint = True
            handoff = shape(model).handoff_bytes(np.asarray(w.prompt, dtype=np.int64))
            rf[:, S.EP_OPS], rf[:, S.EP_BYTES] = endpoint_work(comp, handoff, np.asarray(w.prompt), model.kv_bytes)
    rows = S.rows_capacity(budget, n)
    ii = S.INSTANCE_INTS.new(m)
    for d in range(m):
        role = S.COLOCATED if res.colocated else (S.PREFILL if d < npre else S.DECODE)
        kvcap = res.levers.prefill.kv_capacity if role == S.PREFILL else res.kv_capacity
        cap = kvcap // unit
        ii[d, S.ROLE], ii[d, S.POOL], ii[d, S.INDEX] = role, int(role == S.DECODE), d - npre if d >= npre else d
        ii[d, S.CAP], ii[d, S.UNIT] = cap, unit
        ii[d, S.WMARK] = math.floor(WATERMARK * cap) if paged and role != S.PREFILL else 0
        ii[d, S.MAX_ROWS] = S.ROWS_FLOOR if role != S.PREFILL else 1 << 62
        ii[d, S.STATE] = S.ACTIVE
    cfg = S.SETTINGS.new()
    cfg[S.C_POLICY], cfg[S.C_KVP], cfg[S.C_BUDGET] = POLICIES[c.batch_policy], KV_POLICIES[c.kv_policy], budget
    cfg[S.C_BLOCK], cfg[S.C_MAX_SEQ] = block, c.max_seq_len or DEFAULT_MAX_SEQ_LEN
    cfg[S.C_SWAP] = (c.preemption or DEFAULT_PREEMPTION) == "swap"
    cfg[S.C_COLOCATED], cfg[S.C_NPRE], cfg[S.C_NDEC] = res.colocated, npre, res.n_decode
    cfg[S.C_ENDPOINT], cfg[S.C_CHANNELS] = endpoint, 0 if res.colocated else res.channels
    cfg[S.C_KV_TOK] = int(shape(model).kv_per_token)
    cfg[S.C_CALIBRATED] = c.cost_model == "calibrated"
    ct, cs = step_tables(res)
    cf = S.HOST_LINK.new()
    cf[S.H_BW], cf[S.H_LATENCY], cf[S.H_PJ] = host.bandwidth, host.latency, host.pj_per_bit
    hf, hs, lf = pool_arrays(res)
    g = S.INT_SCALARS.new()
    events = 4 * rows + 4 * m + 64
    log = max(1024, int(np.sum(w.output)) // 64)
    return S.SchedState(
        rf=rf, ri=ri, nxt=np.full(n, -1, dtype=np.int64), lq=S.LINK_QUEUE.new(1), ii=ii, fi=S.INSTANCE_FLOATS.new(m), run=np.zeros((m, rows), dtype=np.int64),
        snap=np.zeros((m, rows), dtype=np.int64), snapc=np.zeros((m, rows), dtype=np.int64),
        grow=np.zeros((m, rows), dtype=np.int64),
        evt=np.zeros((1, events)), evi=ITEMS.new(1, events), g=g, gf=S.FLOAT_SCALARS.new(), cfg=cfg, cf=cf,
        hf=hf, ct=ct, cs=cs, hs=hs, lf=lf, mi=mi, mf=mf, roots=roots, logf=S.LOG_TIMES.new(log), logi=S.LOG_INTS.new(log),
        runi=S.RUNS.new(n + 4 * rows + 64), runf=np.zeros(n + 4 * rows + 64),
        spi=S.SPAN_INTS.new(4 * rows + 64), spf=S.SPAN_TIMES.new(4 * rows + 64))


def plain_seconds(st: S.SchedState) -> float:
    """About what the run takes as plain Python."""
    return float(np.sum(st.ri[:, S.O])) * PLAIN_S_PER_TOKEN


def simulate_arrays(st: S.SchedState) -> S.SchedState:
    """Run the loop to the end (compiled when that pays: ahead of time if the module is built,
    else just in time); the final arrays."""
    plain_s = plain_seconds(st)
    aot.prepare(plain_s, accumulate=False, unit_plain_s=1.0)
    run_events = aot.scheduled_loop()
    if run_events is None:
        if not aot.building():
            _jit.use_compiled(plain_s)
        from kvcargo.engine.sched_loop import run_events  # bound compiled, if compiled

    while (code := run_events(st)) != S.FINISHED:
        if code == S.STALLED:
            left = len(st.ri) - int(st.g[S.G_DONE]) - int(st.g[S.G_REJ])
            raise KvcargoError(f"the run stalled with {left} requests unserved (no KV memory ever frees for "
                               "them): give the instances more memory or fewer tokens per request")
        if code == S.LIVELOCK:
            raise KvcargoError(f"the run cannot go on: at {float(st.gf[S.F_NOW]):.6g} s a swapped-out request's next KV "
                               "block never fits while hand-offs in flight hold the rest of the decode memory, so it "
                               "is swapped in and out at that instant for ever: use --preemption recompute, more "
                               "decode memory or fewer tokens per request")
        st = S.grown(st, code)
    return st


def lever_metrics(res: Resolved, st: S.SchedState) -> dict[str, Any]:
    """The summary keys the levers add (levers-serving §9)."""
    c = res.config
    npre = int(st.cfg[S.C_NPRE])
    served = range(npre, len(st.ii))
    every = range(len(st.ii))
    fi, ii = st.fi, st.ii
    busy = _sum(float(fi[d, S.BUSY]) for d in served)
    alloc = _sum(float(fi[d, S.ALLOC_INT]) for d in served)
    out: dict[str, Any] = {
        "token_budget": int(st.cfg[S.C_BUDGET]),
        "kv_capacity_units": int(ii[npre, S.CAP]),
        "kv_unit_tokens": int(ii[npre, S.UNIT]),
    }
    if npre:
        out["prefill_kv_capacity_units"] = int(ii[0, S.CAP])
    out["mean_running"] = _sum(float(fi[d, S.RUN_INT]) for d in served) / busy if busy > 0 else math.nan
    out["kv_token_frac"] = _sum(float(fi[d, S.TOK_INT]) for d in served) / alloc if alloc > 0 else math.nan
    out["computed_prefill_tokens"] = int(ii[:, S.COMPUTED].sum())
    if c.kv_policy == "paged":
        out["preemptions"] = int(ii[:, S.PREEMPTIONS].sum())
        out["recompute_tokens"] = int(ii[:, S.RECOMPUTED].sum())
        if st.cfg[S.C_SWAP]:
            out["swap_out_GB"] = int(ii[:, S.SWAP_OUT].sum()) / 1e9
            out["swap_in_GB"] = int(ii[:, S.SWAP_IN].sum()) / 1e9
            out["swap_seconds"] = _sum(float(fi[d, S.SWAP_S]) for d in every)
            out["swap_J"] = _sum(float(fi[d, S.SWAP_J]) for d in every)
    return out


def run_arrays(res: Resolved):  # type: ignore[no-untyped-def]
    """Simulate a configuration with the array engine; the same record as the SimPy one."""
    from kvcargo.engine.cluster import EngineOutput

    xfer = transfers_of(res)
    st = simulate_arrays(build(res, xfer))
    n = len(st.ri)
    k, nr, ns = int(st.g[S.G_NSTEPS]), int(st.g[S.G_NRUNS]), int(st.g[S.G_NSPANS])
    rf, ri, w = st.rf, st.ri, res.workload
    # Views, not copies: the tables' rows past the count were never written (zeroed memory: no
    # pages), and each of ``rf``'s columns is contiguous. Copies cost their pages and a pass.
    runi, runf = st.runi[:nr], st.runf[:nr]
    logf, logi = st.logf[:k], st.logi[:k]
    itl_values = itl_offsets = None
    if int(np.sum(np.maximum(ri[:, S.O] - 1, 0))) <= EXPANDED_GAPS_MAX:
        itl_values, itl_offsets = per_request(logf[:, S.LOG_END], logi[:, S.LOG_INST], res.n_decode, runi, runf, n)
    stats = np.column_stack([st.fi[:, [S.BUSY, S.FLOPS, S.NBYTES, S.E_C, S.E_M]], st.ii[:, S.STEPS]]).astype(float)
    spans = [(SPAN_NAMES[a], ROLES[b], int(i), int(r), float(s0), float(s1))
             for (a, b, i, r), (s0, s1) in zip(st.spi[:ns].tolist(), st.spf[:ns].tolist())]
    levers = lever_metrics(res, st)
    colocated = res.colocated

    def col(c: int) -> np.ndarray:  # a compact copy: the integer table is freed
        return np.ascontiguousarray(ri[:, c])

    def const(value: float, dtype: type = np.float64) -> np.ndarray:  # a column this engine has not: one value
        return np.broadcast_to(np.array(value, dtype=dtype), n)

    return EngineOutput(
        resolved=res, arrival=rf[:, S.ARR], prompt=np.asarray(w.prompt, dtype=np.int64),
        output=np.asarray(w.output, dtype=np.int64), prefill_start=rf[:, S.PS], first_token=rf[:, S.FIRST],
        kv_start=rf[:, S.KS], kv_ready=rf[:, S.KR], decode_start=rf[:, S.DS], finish=rf[:, S.FIN],
        status=col(S.STATUS), prefill_inst=col(S.PINST), decode_inst=col(S.DINST),
        first_step=const(-1, np.int64), stats=stats,
        kv_held=np.zeros((res.n_prefill, 2)), send_fraction=const(1.0), want_memory=const(np.nan),
        reserved=const(np.nan), steps=logf, step_inst=logi,
        horizon=float(st.gf[S.F_NOW]), transfers=int(st.g[S.G_XFERS]),
        port_busy=np.array([st.gf[S.F_LINK_BUSY]]), port_channels=np.array([res.channels]),
        link_busy_s=float(st.gf[S.F_LINK_BUSY]), link_j=float(st.gf[S.F_LINK_J]),
        transit_j=float(st.gf[S.F_TRANSIT_J]),
        transit_bound=const(False, np.bool_) if colocated else xfer.transit_bound,
        wire_bytes=const(0.0) if colocated else xfer.wire_bytes,
        lever_stats=lever_stats(st.fi[:, S.COMM], st.fi[:, S.SCALE_UP_J]), verify_passes=const(0, np.int64),
        engine_stats=np.zeros((len(st.ii), 3)), prefill_done=const(np.nan),
        itl_values=itl_values, itl_offsets=itl_offsets, itl_runs=(runi, runf), levers=levers,
        swap_j=levers.get("swap_J", 0.0), spans=spans,
    )


def _line_aligned(rows: int, cols: int) -> np.ndarray:
    """Zeroed int64 rows starting on 64-byte cache lines (a step reads a running row's first line)."""
    buf = np.zeros(rows * cols + 8, dtype=np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip: skip + rows * cols].reshape(rows, cols)
