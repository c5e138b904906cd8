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
from kvcargo.engine.layout import Table, publish

# Event kinds; the heap orders (time, priority, sequence) as SimPy does.
ARRIVE, WAKE, STEP_END, XFER_INIT, XFER_GRANT, XFER_DONE, LINK_RELEASE, TURN = range(8)
URGENT, NORMAL = 0, 1
# What the loop returns: every request settled, or a table is full (grow it, call again), or the
# run cannot go on (no event left; an instance that would repeat one pass without a step for ever).
FINISHED, EVENTS_FULL, LOG_FULL, RUNS_FULL, SPANS_FULL, STALLED, LIVELOCK = range(7)

# Roles, policies, KV policies, instance states, step kinds, span kinds.
COLOCATED, PREFILL, DECODE = range(3)
PREFILL_PRIORITY, DECODE_PRIORITY, CHUNKED = range(3)
ORACLE, POW2, MAXLEN, PAGED = range(4)
SLEEPING, WAKING, ACTIVE = range(3)
PROMPT_STEP, DECODE_STEP, CHUNKED_STEP = range(3)
SPAN_RECOMPUTE, SPAN_SWAP = range(2)

NAN = float("nan")
# ``rf``: per-request floats (LAST: the time of its last token when that step was not logged;
# a logged step's end is in the log).
REQUEST_FLOATS = Table(np.float64, LAST=NAN, ARR=0, PS=NAN, FIRST=NAN, KS=NAN, KR=NAN, DS=NAN, FIN=NAN,
                       PREEMPTED_AT=NAN, THINK=0, XFER_T=0, XFER_J=0, TRANSIT_J=0, EP_OPS=0, EP_BYTES=0)
# ``ri``: per-request integers (TOK: tokens out; LAST_STEP: the logged step of its last token,
# -2 if that step was not logged; RUN: its current run of token gaps, -1 none; RUN_LEN: the tokens
# of that run so far, written to the run's row when it ends). What every step reads and writes of
# a running row comes first: one cache line (rows are padded to RI_WIDTH columns, two whole lines).
REQUEST_INTS = Table(np.int64, P=0, O=0, T=0, DONE_TOK=0, ALLOC=0, TOK=0, LAST_STEP=-2, RUN_LEN=0, RUN=-1,
                     BASE=0, SWAPPED_UNITS=0, HELD=0, STATUS=0, PINST=-1, DINST=-1, SUCC=-1)
RI_WIDTH = 16
# ``ii``: per-instance integers (N_PREFILLING: running rows still prefilling). CONTEXT, TOKENS,
# ALLOCATED: over the running rows, kept as they change, Σ (p + tokens out) of the decoding rows,
# Σ (done + tokens out − base) and Σ alloc (what a step prices and integrates). RUN_GEN counts the
# changes to the running rows other than a step's tokens; GROW_GEN is its value when the last step
# listed its N_GROW rows short of a block (``grow``; -1: no list).
INSTANCE_INTS = Table(np.int64, ROLE=0, POOL=0, INDEX=0, CAP=0, UNIT=0, WMARK=0, MAX_ROWS=0, USED=0, Q_HEAD=-1,
                      Q_TAIL=-1, Q_LEN=0, Q_TOKENS=0, IB_HEAD=-1, IB_TAIL=-1, IB_LEN=0, IN_FLIGHT=0, L_HEAD=-1,
                      L_TAIL=-1, L_LEN=0, SW_HEAD=-1, SW_LEN=0, N_RUN=0, N_PREFILLING=0, STATE=0, STEP_KIND=0,
                      N_DEC=0, N_CHUNK=0, STEPS=0, COMPUTED=0, RECOMPUTED=0, PREEMPTIONS=0, SWAP_OUT=0, SWAP_IN=0,
                      CUR_LOG=-1, PREV_LOG=-1, N_LOGGED=0, CONTEXT=0, TOKENS=0, ALLOCATED=0, RUN_GEN=0,
                      GROW_GEN=-1, N_GROW=0)
# ``fi``: per-instance floats (accumulated in step order; COMM, SCALE_UP_J: a parallel layout's
# communication seconds and scale-up link energy).
INSTANCE_FLOATS = Table(np.float64, BUSY=0, FLOPS=0, NBYTES=0, E_C=0, E_M=0, RUN_INT=0, TOK_INT=0, ALLOC_INT=0,
                        SWAP_S=0, SWAP_J=0, DEBT=0, COMM=0, SCALE_UP_J=0)
# ``g``: integer scalars.
INT_SCALARS = Table(np.int64, G_SEQ=0, G_NEV=0, G_DONE=0, G_REJ=0, G_STOP=0, G_NSTEPS=0, G_NRUNS=0, G_NSPANS=0,
                    G_LINK_USERS=0, G_XFERS=0, G_NEXT_ROOT=0, G_INBOX=0)
# ``lq``: the ends of the link's list of waiting hand-offs (one row).
LINK_QUEUE = Table(np.int64, LQ_HEAD=-1, LQ_TAIL=-1)
# ``gf``: float scalars.
FLOAT_SCALARS = Table(np.float64, F_NOW=0, F_LINK_BUSY=0, F_LINK_J=0, F_TRANSIT_J=0)
# ``cfg``: the lever settings.
SETTINGS = Table(np.int64, C_POLICY=0, C_KVP=0, C_BUDGET=0, C_BLOCK=0, C_MAX_SEQ=0, C_SWAP=0, C_COLOCATED=0,
                 C_NPRE=0, C_NDEC=0, C_ENDPOINT=0, C_CHANNELS=0, C_KV_TOK=0, C_CALIBRATED=0)
# ``cf``: the host link of swap.
HOST_LINK = Table(np.float64, H_BW=0, H_LATENCY=0, H_PJ=0)
# ``logf``/``logi``: the logged steps, in start order (start, end; instance index, decode rows).
LOG_TIMES = Table(np.float64, LOG_START=0, LOG_END=0)
LOG_INTS = Table(np.int64, LOG_INST=0, LOG_ROWS=0)
# ``runi``: one run of a request's tokens on consecutive logged steps of one instance (request,
# instance, ordinal of its first step among the instance's logged steps or -1, tokens in it);
# ``runf``: the gap before its first token (NaN: that token was the request's first).
RUNS = Table(np.int64, RUN_R=0, RUN_INST=0, RUN_ORD=0, RUN_M=0)
# ``spi``/``spf``: preemption and swap spans (kind, role, instance index, request; from, to).
SPAN_INTS = Table(np.int64, SPAN_KIND=0, SPAN_ROLE=0, SPAN_INST=0, SPAN_R=0)
SPAN_TIMES = Table(np.float64, SPAN_FROM=0, SPAN_TO=0)
publish(globals(), REQUEST_FLOATS, REQUEST_INTS, INSTANCE_INTS, INSTANCE_FLOATS, INT_SCALARS, LINK_QUEUE,
        FLOAT_SCALARS, SETTINGS, HOST_LINK, LOG_TIMES, LOG_INTS, RUNS, SPAN_INTS, SPAN_TIMES)
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
    grow: np.ndarray
    """Per instance: the decoding rows whose next token needs another block, as its last decode
    step left them (paged KV; see GROW_GEN)."""
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
    ct: np.ndarray
    """Per pool row, the calibrated model's tables ..."""
    cs: np.ndarray
    """... and scalars (read under C_CALIBRATED; dummies otherwise)."""
    hs: np.ndarray
    lf: np.ndarray
    """Per pool row: the stage device's coefficients and the packed parallel layout (all zeros:
    none; :func:`kvcargo.parallel.layout_coefficients`)."""
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
        k, cap = int(st.g[INT_SCALARS["G_NEV"]]), 2 * st.evt.shape[1]
        evt, evi = np.zeros((1, cap)), ITEMS.new(1, cap)
        evt[:, :k], evi[:, :k] = st.evt[:, :k], st.evi[:, :k]
        return st._replace(evt=evt, evi=evi)
    if code == LOG_FULL:
        return st._replace(logf=double(st.logf), logi=double(st.logi))
    if code == RUNS_FULL:
        return st._replace(runi=double(st.runi), runf=double(st.runf))
    return st._replace(spi=double(st.spi), spf=double(st.spf))
