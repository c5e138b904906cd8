"""The scheduled engine's state: plain arrays, one row per request or instance (no object per
request or per token), so the same event loop runs as plain Python or compiled by numba.

Columns are named by the constants below (``st.rf[r, FIRST]``). Request lists (an instance's
FIFO queue, its decode inbox and landed list, its swapped list, the link's waiting transfers)
are the FIFOs of :mod:`kvcargo.engine.lists`, threaded through ``nxt``: a request sits in at most
one at a time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcargo.engine.heap import ITEMS

# Event kinds; the heap orders (time, priority, sequence) as SimPy does.
ARRIVE, WAKE, STEP_END, XFER_INIT, XFER_GRANT, XFER_DONE, LINK_RELEASE, TURN = range(8)
URGENT, NORMAL = 0, 1
# What the loop returns: every request settled, or a table is full (grow it, call again).
FINISHED, EVENTS_FULL, LOG_FULL, RUNS_FULL, SPANS_FULL, STALLED = range(6)

# Roles, policies, KV policies, instance states, step kinds, span kinds.
COLOCATED, PREFILL, DECODE = range(3)
PREFILL_PRIORITY, DECODE_PRIORITY, CHUNKED = range(3)
ORACLE, POW2, MAXLEN, PAGED = range(4)
SLEEPING, WAKING, ACTIVE = range(3)
PROMPT_STEP, DECODE_STEP, CHUNKED_STEP = range(3)
SPAN_RECOMPUTE, SPAN_SWAP = range(2)

# ``rf``: per-request floats (LAST: the time of its last token when that step was not logged;
# a logged step's end is in the log).
(LAST, ARR, PS, FIRST, KS, KR, DS, FIN, PREEMPTED_AT, THINK, XFER_T, XFER_J, TRANSIT_J, EP_OPS,
 EP_BYTES) = range(15)
# ``ri``: per-request integers (TOK: tokens out; LAST_STEP: the logged step of its last token,
# -2 if that step was not logged; RUN: its current run of token gaps, -1 none). What every step
# reads of a running row comes first: one cache line (rows are padded to RI_WIDTH columns, two
# whole lines).
(P, O, T, DONE_TOK, ALLOC, TOK, LAST_STEP, RUN, BASE, SWAPPED_UNITS, HELD, STATUS, PINST, DINST,
 SUCC) = range(15)
RI_WIDTH = 16
# ``ii``: per-instance integers (N_PREFILLING: running rows still prefilling).
(ROLE, POOL, INDEX, CAP, UNIT, WMARK, MAX_ROWS, USED, Q_HEAD, Q_TAIL, Q_LEN, Q_TOKENS, IB_HEAD, IB_TAIL, IB_LEN,
 IN_FLIGHT, L_HEAD, L_TAIL, L_LEN, SW_HEAD, SW_LEN, N_RUN, N_PREFILLING, STATE, STEP_KIND, N_DEC, N_CHUNK,
 STEPS, COMPUTED, RECOMPUTED, PREEMPTIONS, SWAP_OUT, SWAP_IN, CUR_LOG, PREV_LOG, N_LOGGED, CONTEXT, TOKENS,
 ALLOCATED) = range(39)
# CONTEXT, TOKENS, ALLOCATED: over the running rows, kept as they change, Σ (p + tokens out) of the
# decoding rows, Σ (done + tokens out − base) and Σ alloc (what a step prices and integrates).
# ``fi``: per-instance floats (accumulated in step order).
(BUSY, FLOPS, NBYTES, E_C, E_M, RUN_INT, TOK_INT, ALLOC_INT, SWAP_S, SWAP_J, DEBT) = range(11)
# ``g``: integer scalars.
(G_SEQ, G_NEV, G_DONE, G_REJ, G_STOP, G_NSTEPS, G_NRUNS, G_NSPANS, G_LINK_USERS, G_XFERS, G_NEXT_ROOT,
 G_INBOX) = range(12)
# ``lq``: the ends of the link's list of waiting hand-offs (one row).
LQ_HEAD, LQ_TAIL = range(2)
# ``gf``: float scalars.
F_NOW, F_LINK_BUSY, F_LINK_J, F_TRANSIT_J = range(4)
# ``cfg``: the lever settings.
(C_POLICY, C_KVP, C_BUDGET, C_BLOCK, C_MAX_SEQ, C_SWAP, C_COLOCATED, C_NPRE, C_NDEC, C_ENDPOINT, C_CHANNELS,
 C_KV_TOK) = range(12)
# ``cf``: the host link of swap.
H_BW, H_LATENCY, H_PJ = range(3)
# ``runi``: one run of a request's tokens on consecutive logged steps of one instance (request,
# instance, ordinal of its first step among the instance's logged steps or -1, tokens in it);
# ``runf``: the gap before its first token (NaN: that token was the request's first).
RUN_R, RUN_INST, RUN_ORD, RUN_M = range(4)
ROWS_FLOOR = 256
"""Batch cap of colocated and decode instances (rows)."""


class SchedState(NamedTuple):
    """Arrays of a scheduled run (parameters and state; see the column constants)."""

    rf: np.ndarray
    ri: np.ndarray
    nxt: np.ndarray
    """Per request: the next request of the list it sits in (-1: the last)."""
    lq: np.ndarray
    ii: np.ndarray
    fi: np.ndarray
    run: np.ndarray
    """Per instance: its running requests, sorted by (arrival, id)."""
    snap: np.ndarray
    """Per instance: the step in flight's rows (decode rows, then prompt chunks) ..."""
    snapc: np.ndarray
    """... and the chunks' sizes."""
    evt: np.ndarray
    evi: np.ndarray
    """Pending events, one heap of :mod:`kvcargo.engine.heap`: time; priority and sequence as one
    tie-breaker, kind, index."""
    g: np.ndarray
    gf: np.ndarray
    cfg: np.ndarray
    cf: np.ndarray
    hf: np.ndarray
    """Roofline coefficients per pool row (0 prefill or colocated, 1 decode)."""
    mi: np.ndarray
    mf: np.ndarray
    roots: np.ndarray
    """Requests released by the arrival process, in order (the others are later turns)."""
    logf: np.ndarray
    logi: np.ndarray
    """Logged steps (with decode rows), in start order: start, end; instance index, rows."""
    runi: np.ndarray
    runf: np.ndarray
    spi: np.ndarray
    spf: np.ndarray
    """Preemption spans: kind, role, instance index, request; start, end."""


def rows_capacity(budget: int, n: int) -> int:
    """Running rows an instance can hold: 256, or a prefill instance's budget (every row of a
    prefill step computes at least one token)."""
    return max(ROWS_FLOOR, min(budget, n)) + 1


def grown(st: SchedState, code: int) -> SchedState:
    """``st`` with the table that filled up doubled (the loop then resumes where it paused)."""

    def double(a: np.ndarray, fill: float = 0) -> np.ndarray:
        b = np.full((2 * a.shape[0],) + a.shape[1:], fill, dtype=a.dtype)
        b[: a.shape[0]] = a
        return b

    if code == EVENTS_FULL:  # one heap (kvcargo.engine.heap): its entries run along the second axis
        k, cap = int(st.g[G_NEV]), 2 * st.evt.shape[1]
        evt, evi = np.zeros((1, cap)), ITEMS.new(1, cap)
        evt[:, :k], evi[:, :k] = st.evt[:, :k], st.evi[:, :k]
        return st._replace(evt=evt, evi=evi)
    if code == LOG_FULL:
        return st._replace(logf=double(st.logf), logi=double(st.logi))
    if code == RUNS_FULL:
        return st._replace(runi=double(st.runi), runf=double(st.runf))
    return st._replace(spi=double(st.spi), spf=double(st.spf))
