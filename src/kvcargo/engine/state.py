"""The simulation state: a handful of plain arrays, one row per request, instance, unit or port.

No Python object per request or per token: the event handlers read and write these arrays, so
the same code runs as plain Python or compiled by numba. Each table is declared once below
(:class:`~kvcargo.engine.layout.Table`: its columns in order, dtype and fresh values); the
column numbers the kernels index with (``st.t[r, FIRST_TOKEN]``) are published from the
declarations as module-level integers, and :func:`new_state` and ``cluster.build_params`` size
and fill the arrays from them. Request queues are intrusive FIFO lists threaded through
``State.qnext`` (a request sits in at most one request queue at a time); what crosses the
network is a *unit* (a whole hand-off, or one slice of it when streaming layer by layer), held
in a slot of the unit pool while it waits or moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvcargo.engine.heap import ITEMS
from kvcargo.engine.layout import Table, publish
from kvcargo.engine.lists import LRU_LINKS

# Event kinds (the heap holds (time, seq, kind, index) entries).
(ARRIVAL, PREFILL_WAKE, PREFILL_DONE, GRANT, XFER_DONE, RELEASE, DECODE_WAKE, DECODE_DONE,
 SLICE_READY, FLOW_DONE, LANDED) = range(11)

# Instance states.
IDLE, WAKING, BUSY = 0, 1, 2
# Request outcome.
PENDING, DONE, REJECTED = 0, 1, 2
# Topologies.
SHARED, NIC, DOMAIN = 0, 1, 2

NAN = float("nan")

# ``State.t``: per-request timestamps (NaN: did not happen); the record's fields of those names.
TIMES = Table(np.float64, PREFILL_START=NAN, FIRST_TOKEN=NAN, KV_START=NAN, KV_READY=NAN, DECODE_START=NAN,
              FINISH=NAN)
# ``State.tx`` (opt-in models only; one dummy row otherwise): when decode memory was asked for
# and reserved; with a decode-side prefix cache, the fraction of the hand-off the receiver lacked;
# when the prefill step ended, if the first token comes from the decode side (CED replay there).
EXTRA_TIMES = Table(np.float64, WANT_MEMORY=NAN, RESERVED=NAN, SEND_FRAC=NAN, PREFILL_END=NAN)
# ``State.r``: per-request integers (DEST: decode instance chosen before the transfer, or -1;
# UNITS_DONE: units landed; HELD: slices ready while waiting for decode memory).
# SENT: parts released into the network; PORT_A/PORT_B: the ports its units cross (by default
# the cluster link alone: 0 and -1; set when the receiver is chosen before the transfer); BNEXT:
# the next request of the same prefill batch (later, of the same replay step on a decode instance).
REQUESTS = Table(np.int64, STATUS=PENDING, PREFILL_INST=-1, DECODE_INST=-1, FIRST_STEP=-1, DEST=-1, UNITS_DONE=0,
                 HELD=0, SENT=0, PORT_A=0, PORT_B=-1, BNEXT=-1)
# ``State.spec`` (speculative decoding only; one dummy row otherwise): per request the tokens
# produced, its acceptance stream's state and the verify passes it took part in.
SPEC = Table(np.int64, TOKENS_OUT=0, RNG=0, VERIFY=0)
# ``State.p``: per prefill instance (colocated: the batch in flight of each instance).
PREFILLS = Table(np.int64, P_HEAD=-1, P_TAIL=-1, P_TOKENS=0, P_STATE=IDLE, P_BATCH=-1, P_BATCH_N=0, P_KV_HELD=0,
                 P_SLICE=0)
# ``State.d``: per decode (or colocated) instance; RQ: requests waiting to reserve memory.
# LRU_*: the instance's prefix cache of prompt blocks (most recent at the head). REPLAY_*: the
# rows admitted since the last step when they are replayed in the next one (CED replay on
# decode): count, replay tokens, replay attention FLOPs, prompt tokens, list head (via BNEXT).
DECODES = Table(np.int64, D_HEAD=-1, D_TAIL=-1, D_QUEUED=0, D_RUNNING=0, D_CONTEXT=0, D_KV_USED=0, D_STEPS=0,
                D_STATE=IDLE, D_IS_PREFILL=0, D_FIN_N=0, D_INCOMING=0, D_RQ_HEAD=-1, D_RQ_TAIL=-1, D_LRU_HEAD=-1,
                D_LRU_TAIL=-1, D_LRU_N=0, D_REPLAY_N=0, D_REPLAY_T=0, D_REPLAY_A=0, D_REPLAY_S=0, D_REPLAY_HEAD=-1)
# ``State.stats``: per instance (prefill instances first): totals (the record's ``stats``, in
# this order), the step in flight's start (and end), decompression work waiting for the next
# decode step, prefill-side KV held (integral, peak, time of the last change).
# With a parallel layout: communication time and scale-up energy; with a draft: its time, the rows
# verified and the tokens they gained; an optical transform engine's conversion J, FLOPs and
# engine-bound time.
STATS = Table(np.float64, S_BUSY=0, S_FLOPS=0, S_BYTES=0, S_EC=0, S_EM=0, S_STEPS=0, S_STEP_START=0, S_STEP_END=0,
              S_PEND_OPS=0, S_PEND_BYTES=0, S_KV_INT=0, S_KV_PEAK=0, S_KV_LAST=0, S_COMM=0, S_SCALE_UP_J=0,
              S_DRAFT_T=0, S_VERIFY_ROWS=0, S_GAINED=0, S_EO=0, S_OPT_FLOPS=0, S_OPT_BUSY=0)
# Units: part g of request r's hand-off is unit r·G + g (G: parts per hand-off). ``State.unext``
# threads the port queues; ``State.uf`` (fair sharing only) holds bytes left and current rate.
FLOWS = Table(np.float64, UF_LEFT=0, UF_RATE=0)
# ``State.ports``: free channels, FIFO of waiting units (head, tail).
PORTS = Table(np.int64, PORT_FREE=0, PORT_HEAD=-1, PORT_TAIL=-1)
# ``State.i``: integer scalars. I_LOADED: requests whose parameters are loaded (all of them but
# in a windowed run, see engine/window.py); I_DUE: the arrival a windowed run paused before
# scheduling (-1: none).
INT_SCALARS = Table(np.int64, I_SEQ=0, I_DONE=0, I_REJ=0, I_STOP=0, I_XFERS=0, I_NSTEPS=0, I_NEV=0, I_NACTIVE=0,
                    I_FLOW_GEN=0, I_LOADED=0, I_DUE=-1)
# ``State.f``: float scalars (the clock, link energy totals, the last fair-share update).
FLOAT_SCALARS = Table(np.float64, F_NOW=0, F_LINK_J=0, F_TRANSIT_J=0, F_FLOW_T=0)
# ``State.logf``, ``State.logi``: the step log, one row per decode step (its start and end; its
# instance and batch size, as LOG_INT: a step log holds about four rows per request, and half the
# width is 30 MB less per million requests).
LOG_INT = np.int32
LOG_TIMES = Table(np.float64, LOG_START=0, LOG_END=0)
LOG_INTS = Table(LOG_INT, LOG_INST=0, LOG_BATCH=0)

# ``Params.rf``: per-request floats: arrival, a whole hand-off over the network link (time it
# holds a channel, link and in-transit energy), compression work on the prefill GPU.
REQUEST_FLOATS = Table(np.float64, ARRIVAL_T=0, XFER_TIME=0, XFER_J=0, TRANSIT_J=0, EP_OPS=0, EP_BYTES=0)
# ``Params.rx`` (opt-in models only; one dummy row otherwise): SLICE_*: one layer-wise slice
# (EXTRA: the latency the last pays); *_NV: over NVLink; EFF: bytes a fair-shared flow must move
# (the in-transit stage's compute counted as bytes); DEC_*: decompression on the decode GPU.
REQUEST_EXTRA = Table(np.float64, SLICE_TIME=0, SLICE_EXTRA=0, XFER_TIME_NV=0, SLICE_TIME_NV=0, XFER_J_NV=0,
                      EFF_BYTES=0, DEC_OPS=0, DEC_BYTES=0)
# ``Params.ri``: per-request integers (QUAD = prompt·(prompt + 1), the causal-attention term;
# UNITS: what it reserves of a decode instance's capacity, prompt + output tokens or one state).
REQUEST_INTS = Table(np.int64, PROMPT=0, OUTPUT=0, QUAD=0, UNITS=0)
# ``Params.rq`` (model classes beyond the transformer; one dummy row otherwise): per request, its
# prompt's own FLOP term, replay tokens and padded-FFT-length bit (see kvcargo.stepcost).
REQUEST_TERMS = Table(np.int64, RQ_FLOPS=0, RQ_TOKENS=0, RQ_MASK=0)
# ``Params.ints``: limits and switches.
# P_SPEC: speculative decoding on (P_GAMMA drafted tokens per verify pass, P_SPEC_SEED).
# P_MIXED: the model's step class is not the transformer's; P_REPLAY_DECODE: the first token comes
# from a replay step on the decode instance (every request is handed off).
SWITCHES = Table(np.int64, P_NPREFILL=0, P_COLOCATED=0, P_BUDGET=0, P_MAXBATCH=0, P_KVCAP=0, P_ENDPOINT=0,
                 P_GROUPS=0, P_TOPOLOGY=0, P_FAIR=0, P_RESERVE=0, P_EARLY=0, P_DECCOST=0, P_PREFILL_KVCAP=0,
                 P_PREFIX=0, P_BLOCK_TOKENS=0, P_CALIBRATED=0, P_SPEC=0, P_GAMMA=0, P_SPEC_SEED=0, P_MIXED=0,
                 P_REPLAY_DECODE=0)
# ``Params.pf``: per port, bandwidth of one channel (bytes/s), latency (s), channels.
PORT_FLOATS = Table(np.float64, PF_BW=0, PF_LATENCY=0, PF_CHANNELS=0)

publish(globals(), TIMES, EXTRA_TIMES, REQUESTS, SPEC, PREFILLS, DECODES, STATS, FLOWS, PORTS, INT_SCALARS,
        FLOAT_SCALARS, LOG_TIMES, LOG_INTS, REQUEST_FLOATS, REQUEST_EXTRA, REQUEST_INTS, REQUEST_TERMS, SWITCHES,
        PORT_FLOATS)


class Params(NamedTuple):
    """Everything the engine reads but never writes: the workload, costs, limits, ports."""

    rf: np.ndarray
    rx: np.ndarray
    ri: np.ndarray
    mi: np.ndarray
    mf: np.ndarray
    """Model coefficients (see :func:`kvcargo.cost.model_coefficients`)."""
    hf: np.ndarray
    """Pool coefficients: row 0 prefill (or colocated), row 1 decode."""
    ints: np.ndarray
    pf: np.ndarray
    port_cap: np.ndarray
    """Per port: bandwidth of all its channels together (fair sharing)."""
    domain: np.ndarray
    """NVLink domain of each instance (prefill first), for ``--topology nvlink-domain``."""
    blocks: np.ndarray
    block_offsets: np.ndarray
    """With a prefix cache: each request's prompt blocks (dense ids), flat, with offsets."""
    ct: np.ndarray
    cs: np.ndarray
    """``--cost-model calibrated``: per pool row, the tabulated step costs and their scalars
    (see :func:`kvcargo.calibrated.tabulate`); a small dummy under the roofline."""
    lf: np.ndarray
    """Per pool (row 0 prefill or colocated, row 1 decode): parallel layout (kvcargo.parallel)."""
    hs: np.ndarray
    """Per pool: roofline coefficients of one pipeline stage's devices (no overhead)."""
    mid: np.ndarray
    mfd: np.ndarray
    """The speculative draft's model coefficients (the target's when there is none)."""
    hd: np.ndarray
    """Per pool: the draft's roofline coefficients (no overhead)."""
    alpha: np.ndarray
    """Speculative decoding: acceptance probability per drafted token (one value)."""
    rq: np.ndarray
    xi: np.ndarray
    xf: np.ndarray
    """The step class and its coefficients (see :func:`kvcargo.stepcost.model_extension`)."""
    eo: np.ndarray
    """Per pool (prefill, decode): its optical transform engine (zeros: none)."""
    ehf: np.ndarray
    """Pool coefficients without the step overhead (an engine step adds it once, at the end)."""


class State(NamedTuple):
    """Everything the engine writes."""

    t: np.ndarray
    tx: np.ndarray
    r: np.ndarray
    p: np.ndarray
    d: np.ndarray
    qnext: np.ndarray
    """Per request: the next request of the FIFO it waits in (see lists.py)."""
    fink: np.ndarray
    fini: np.ndarray
    """Per decode instance: a heap of its running requests by the ordinal of the step that
    finishes them (keys), then by request (see heap.py)."""
    stats: np.ndarray
    i: np.ndarray
    f: np.ndarray
    evt: np.ndarray
    evi: np.ndarray
    """Pending events: heap 0 of these arrays, by (time, sequence), with kind and index (see
    heap.py and events.py)."""
    unext: np.ndarray
    uf: np.ndarray
    active: np.ndarray
    """Fair sharing: the units moving right now (the first I_NACTIVE entries)."""
    port_left: np.ndarray
    port_count: np.ndarray
    frozen: np.ndarray
    """Fair sharing, scratch of fair_rates: per port bandwidth left and unfrozen units; per
    active unit whether its rate is final."""
    ports: np.ndarray
    port_busy: np.ndarray
    """Seconds of transfer per port (each unit counted at the first port it crosses)."""
    lru: np.ndarray
    """Per decode instance and block: previous and next block in its LRU list (-2: not cached)."""
    logf: np.ndarray
    """Decode steps in the order they ended: start, end (the first I_NSTEPS rows are used)."""
    logi: np.ndarray
    """Per logged step: instance, batch size (as :data:`LOG_INT`)."""
    rows: np.ndarray
    """Speculative decoding: per decode (or colocated) instance its running requests (D_RUNNING
    of them); one dummy column otherwise."""
    spec: np.ndarray
    """Speculative decoding: per request TOKENS_OUT, RNG, VERIFY; one dummy row otherwise."""


# What run_events returns: finished, or paused because an array is full (grow it, run again), or
# because the next arrival's parameters are not loaded yet (load them, raise I_LOADED, run again).
FINISHED, LOG_FULL, EVENTS_FULL, ARRIVALS_DUE = 0, 1, 2, 3


def new_state(n: int, n_prefill: int, n_decode: int, n_stats: int, max_batch: int, ports: np.ndarray,
              groups: int, fair: bool, log_capacity: int, n_blocks: int = 0, extra: bool = False,
              speculative: bool = False, zeros: Callable[..., np.ndarray] = np.zeros,
              loaded: int | None = None) -> State:
    """Fresh state for ``n`` requests whose hand-offs are cut in ``groups`` parts.

    Colocated runs use the prefill rows for each instance's batch in flight and the decode rows
    for its queue and running batch. ``ports`` holds each port's channels; ``extra``: an opt-in
    model needs the per-request columns of ``tx``. ``zeros`` allocates the per-request arrays of
    :func:`fresh_rows`, of which the first ``loaded`` rows (default: all) are made fresh (a
    windowed run makes the others fresh as it loads them, see engine/window.py).
    """
    p = PREFILLS.new(n_prefill)
    d = DECODES.new(n_decode)
    port_rows = PORTS.new(len(ports))
    port_rows[:, PORTS["PORT_FREE"]] = ports
    units = n * groups
    events = 4 * (n_prefill + n_decode + 3 * int(ports.sum())) + 128
    batch = max(1, min(max_batch, n))
    loaded = n if loaded is None else loaded
    scalars = INT_SCALARS.new()
    scalars[INT_SCALARS["I_LOADED"]] = loaded
    st = State(
        t=zeros((n, TIMES.width)), tx=EXTRA_TIMES.new(n if extra else 1),
        r=zeros((n, REQUESTS.width), dtype=np.int64), p=p, d=d, qnext=zeros(n, dtype=np.int64),
        fink=np.zeros((n_decode, batch)), fini=ITEMS.new(n_decode, batch),
        stats=STATS.new(n_stats), i=scalars, f=FLOAT_SCALARS.new(),
        evt=np.zeros((1, events)), evi=ITEMS.new(1, events),
        unext=zeros(units, dtype=np.int64), uf=FLOWS.new(units if fair else 1),
        active=np.zeros(units if fair else 1, dtype=np.int64), port_left=np.zeros(len(ports)),
        port_count=np.zeros(len(ports), dtype=np.int64), frozen=np.zeros(units if fair else 1, dtype=np.bool_),
        ports=port_rows, port_busy=np.zeros(len(ports)), lru=LRU_LINKS.new(n_decode, max(n_blocks, 1)),
        logf=LOG_TIMES.new(log_capacity), logi=LOG_INTS.new(log_capacity),
        rows=np.zeros((n_decode, batch if speculative else 1), dtype=np.int64),
        spec=SPEC.new(n if speculative else 1),
    )
    fresh_rows(st, 0, loaded)
    return st


def fresh_rows(st: State, lo: int, hi: int) -> None:
    """Make requests ``lo`` to ``hi`` (excluded) fresh in the per-request arrays sized by
    :func:`new_state`'s ``zeros``: ``t``, ``r``, ``qnext`` and ``unext``."""
    groups = len(st.unext) // len(st.qnext)
    st.t[lo:hi] = TIMES.fresh
    st.r[lo:hi] = REQUESTS.fresh
    st.qnext[lo:hi] = -1
    st.unext[lo * groups:hi * groups] = -1


def grown(st: State, code: int) -> State:
    """The same state with twice the room in the array that filled up (see run_events)."""
    if code == LOG_FULL:
        k = int(st.i[INT_SCALARS["I_NSTEPS"]])
        logf, logi = LOG_TIMES.new(2 * len(st.logf)), LOG_INTS.new(2 * len(st.logf))
        logf[:k], logi[:k] = st.logf[:k], st.logi[:k]
        return st._replace(logf=logf, logi=logi)
    k, cap = int(st.i[INT_SCALARS["I_NEV"]]), 2 * st.evt.shape[1]
    evt, evi = np.zeros((1, cap)), ITEMS.new(1, cap)
    evt[:, :k], evi[:, :k] = st.evt[:, :k], st.evi[:, :k]
    return st._replace(evt=evt, evi=evi)
