"""The simulation state: a handful of plain arrays, one row per request, instance, unit or port.

No Python object per request or per token: the event handlers read and write these arrays, so
the same code runs as plain Python or compiled by numba. Columns are named by the constants
below (``st.t[r, FIRST_TOKEN]``). Request queues are intrusive FIFO lists threaded through the
``QNEXT`` column (a request sits in at most one request queue at a time); what crosses the
network is a *unit* (a whole hand-off, or one slice of it when streaming layer by layer), held
in a slot of the unit pool while it waits or moves.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcargo import _jit

# Event kinds (the heap holds (time, seq, kind, index) entries).
(ARRIVAL, PREFILL_WAKE, PREFILL_DONE, GRANT, XFER_DONE, RELEASE, DECODE_WAKE, DECODE_DONE,
 SLICE_READY, FLOW_DONE, LANDED) = range(11)

# Instance states.
IDLE, WAKING, BUSY = 0, 1, 2
# Request outcome.
PENDING, DONE, REJECTED = 0, 1, 2
# Topologies.
SHARED, NIC, DOMAIN = 0, 1, 2

# ``State.t``: per-request timestamps (NaN: did not happen).
PREFILL_START, FIRST_TOKEN, KV_START, KV_READY, DECODE_START, FINISH = range(6)
# ``State.tx`` (opt-in models only; one dummy row otherwise): when decode memory was asked for
# and reserved; with a decode-side prefix cache, the fraction of the hand-off the receiver lacked;
# when the prefill step ended, if the first token comes from the decode side (CED replay there).
WANT_MEMORY, RESERVED, SEND_FRAC, PREFILL_END = range(4)
# ``State.r``: per-request integers (DEST: decode instance chosen before the transfer, or -1;
# UNITS_DONE: units landed; HELD: slices ready while waiting for decode memory).
# SENT: parts released into the network; PORT_A/PORT_B: the ports its units cross (by default
# the cluster link alone: 0 and -1; set when the receiver is chosen before the transfer); BNEXT:
# the next request of the same prefill batch (later, of the same replay step on a decode instance).
(STATUS, PREFILL_INST, DECODE_INST, FIRST_STEP, QNEXT, DEST, UNITS_DONE, HELD, SENT, PORT_A, PORT_B,
 BNEXT) = range(12)
R_COLUMNS = 12
# ``State.spec`` (speculative decoding only; one dummy row otherwise): per request the tokens
# produced, its acceptance stream's state and the verify passes it took part in.
TOKENS_OUT, RNG, VERIFY = range(3)
# ``State.p``: per prefill instance (colocated: the batch in flight of each instance).
P_HEAD, P_TAIL, P_TOKENS, P_STATE, P_BATCH, P_BATCH_N, P_KV_HELD, P_SLICE = range(8)
# ``State.d``: per decode (or colocated) instance; RQ: requests waiting to reserve memory.
# LRU_*: the instance's prefix cache of prompt blocks (most recent at the head). REPLAY_*: the
# rows admitted since the last step when they are replayed in the next one (CED replay on
# decode): count, replay tokens, replay attention FLOPs, prompt tokens, list head (via BNEXT).
(D_HEAD, D_TAIL, D_QUEUED, D_RUNNING, D_CONTEXT, D_KV_USED, D_STEPS, D_STATE, D_IS_PREFILL, D_FIN_N,
 D_INCOMING, D_RQ_HEAD, D_RQ_TAIL, D_LRU_HEAD, D_LRU_TAIL, D_LRU_N, D_REPLAY_N, D_REPLAY_T, D_REPLAY_A,
 D_REPLAY_S, D_REPLAY_HEAD) = range(21)
# ``State.stats``: per instance (prefill instances first): totals, the step in flight's start,
# (and end), decompression work waiting for the next decode step, prefill-side KV held (integral, peak,
# time of the last change).
# With a parallel layout: communication time and scale-up energy; with a draft: its time, the rows
# verified and the tokens they gained; an optical transform engine's conversion J, FLOPs and
# engine-bound time.
(S_BUSY, S_FLOPS, S_BYTES, S_EC, S_EM, S_STEPS, S_STEP_START, S_STEP_END, S_PEND_OPS, S_PEND_BYTES,
 S_KV_INT, S_KV_PEAK, S_KV_LAST, S_COMM, S_SCALE_UP_J, S_DRAFT_T, S_VERIFY_ROWS, S_GAINED, S_EO, S_OPT_FLOPS,
 S_OPT_BUSY) = range(21)
S_COLUMNS = 21
# Units: part g of request r's hand-off is unit r·G + g (G: parts per hand-off). ``State.unext``
# threads the port queues; ``State.uf`` (fair sharing only) holds bytes left and current rate.
UF_LEFT, UF_RATE = range(2)
# ``State.ports``: free channels, FIFO of waiting units (head, tail).
PORT_FREE, PORT_HEAD, PORT_TAIL = range(3)
# ``State.i``: integer scalars.
(I_SEQ, I_DONE, I_REJ, I_STOP, I_XFERS, I_NSTEPS, I_NEV, I_NACTIVE, I_FLOW_GEN) = range(9)
# ``State.evi``: pending events (with ``State.evt`` their times), a binary heap of size I_NEV.
EV_SEQ, EV_KIND, EV_IDX = range(3)
# ``State.f``: float scalars (the clock, link energy totals, the last fair-share update).
F_NOW, F_LINK_J, F_TRANSIT_J, F_FLOW_T = range(4)

# ``Params.rf``: per-request floats: arrival, a whole hand-off over the network link (time it
# holds a channel, link and in-transit energy), compression work on the prefill GPU.
ARRIVAL_T, XFER_TIME, XFER_J, TRANSIT_J, EP_OPS, EP_BYTES = range(6)
# ``Params.rx`` (opt-in models only; one dummy row otherwise): SLICE_*: one layer-wise slice
# (EXTRA: the latency the last pays); *_NV: over NVLink; EFF: bytes a fair-shared flow must move
# (the in-transit stage's compute counted as bytes); DEC_*: decompression on the decode GPU.
(SLICE_TIME, SLICE_EXTRA, XFER_TIME_NV, SLICE_TIME_NV, XFER_J_NV, EFF_BYTES, DEC_OPS, DEC_BYTES) = range(8)
# ``Params.ri``: per-request integers (QUAD = prompt·(prompt + 1), the causal-attention term;
# UNITS: what it reserves of a decode instance's capacity, prompt + output tokens or one state).
PROMPT, OUTPUT, QUAD, UNITS = range(4)
# ``Params.rq`` (model classes beyond the transformer; one dummy row otherwise): per request, its
# prompt's own FLOP term, replay tokens and padded-FFT-length bit (see kvcargo.stepcost).
RQ_FLOPS, RQ_TOKENS, RQ_MASK = range(3)
# ``Params.ints``: limits and switches.
# P_SPEC: speculative decoding on (P_GAMMA drafted tokens per verify pass, P_SPEC_SEED).
# P_MIXED: the model's step class is not the transformer's; P_REPLAY_DECODE: the first token comes
# from a replay step on the decode instance (every request is handed off).
(P_NPREFILL, P_COLOCATED, P_BUDGET, P_MAXBATCH, P_KVCAP, P_ENDPOINT, P_GROUPS, P_TOPOLOGY, P_FAIR, P_RESERVE,
 P_EARLY, P_DECCOST, P_PREFILL_KVCAP, P_PREFIX, P_BLOCK_TOKENS, P_CALIBRATED, P_SPEC, P_GAMMA,
 P_SPEC_SEED, P_MIXED, P_REPLAY_DECODE) = range(21)
P_INTS = 21
# ``Params.pf``: per port, bandwidth of one channel (bytes/s), latency (s), channels.
PF_BW, PF_LATENCY, PF_CHANNELS = range(3)


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
    fin: np.ndarray
    """Per decode instance: a heap of (finish-step ordinal, request) pairs (see finheap.py)."""
    stats: np.ndarray
    i: np.ndarray
    f: np.ndarray
    evt: np.ndarray
    evi: np.ndarray
    """Pending events: a heap ordered by (time, sequence) — see events.py."""
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
    """Per logged step: instance, batch size (:data:`LOG_INT`)."""
    rows: np.ndarray
    """Speculative decoding: per decode (or colocated) instance its running requests (D_RUNNING
    of them); one dummy column otherwise."""
    spec: np.ndarray
    """Speculative decoding: per request TOKENS_OUT, RNG, VERIFY; one dummy row otherwise."""


LOG_INT = np.int32
"""The step log's integers (instance, batch size): a step log holds about four rows per request,
and half the width is 30 MB less per million requests."""

# What run_events returns: finished, or paused because an array is full (grow it, run again).
FINISHED, LOG_FULL, EVENTS_FULL = 0, 1, 2


def new_state(n: int, n_prefill: int, n_decode: int, n_stats: int, max_batch: int, ports: np.ndarray,
              groups: int, fair: bool, log_capacity: int, n_blocks: int = 0, extra: bool = False,
              speculative: bool = False) -> State:
    """Fresh state for ``n`` requests whose hand-offs are cut in ``groups`` parts.

    Colocated runs use the prefill rows for each instance's batch in flight and the decode rows
    for its queue and running batch. ``ports`` holds each port's channels; ``extra``: an opt-in
    model needs the per-request columns of ``tx``.
    """
    first = np.zeros(R_COLUMNS, dtype=np.int64)  # every request's row, written in one pass
    first[PREFILL_INST:DEST + 1] = -1
    first[[PORT_B, BNEXT]] = -1
    r = np.empty((n, R_COLUMNS), dtype=np.int64)
    r[:] = first
    p = np.zeros((n_prefill, 8), dtype=np.int64)
    p[:, [P_HEAD, P_TAIL, P_BATCH]] = -1
    d = np.zeros((n_decode, 21), dtype=np.int64)
    d[:, [D_HEAD, D_TAIL, D_RQ_HEAD, D_RQ_TAIL, D_LRU_HEAD, D_LRU_TAIL, D_REPLAY_HEAD]] = -1
    port_rows = np.zeros((len(ports), 3), dtype=np.int64)
    port_rows[:, [PORT_HEAD, PORT_TAIL]] = -1
    port_rows[:, PORT_FREE] = ports
    units = n * groups
    events = 4 * (n_prefill + n_decode + 3 * int(ports.sum())) + 128
    return State(
        t=np.full((n, 6), np.nan), tx=np.full((n if extra else 1, 4), np.nan), r=r, p=p, d=d,
        fin=np.zeros((n_decode, max(1, min(max_batch, n)), 2), dtype=np.int64),
        stats=np.zeros((n_stats, S_COLUMNS)), i=np.zeros(9, dtype=np.int64), f=np.zeros(4),
        evt=np.zeros(events), evi=np.zeros((events, 3), dtype=np.int64),
        unext=np.full(units, -1, dtype=np.int64), uf=np.zeros((units if fair else 1, 2)),
        active=np.zeros(units if fair else 1, dtype=np.int64), port_left=np.zeros(len(ports)),
        port_count=np.zeros(len(ports), dtype=np.int64), frozen=np.zeros(units if fair else 1, dtype=np.bool_),
        ports=port_rows, port_busy=np.zeros(len(ports)), lru=np.full((n_decode, max(n_blocks, 1), 2), -2),
        logf=np.zeros((log_capacity, 2)), logi=np.zeros((log_capacity, 2), dtype=LOG_INT),
        rows=np.zeros((n_decode, max(1, min(max_batch, n)) if speculative else 1), dtype=np.int64),
        spec=np.zeros((n if speculative else 1, 3), dtype=np.int64),
    )


def grown(st: State, code: int) -> State:
    """The same state with twice the room in the array that filled up (see run_events)."""
    if code == LOG_FULL:
        k = int(st.i[I_NSTEPS])
        cap = 2 * len(st.logf)
        logf, logi = np.zeros((cap, 2)), np.zeros((cap, 2), dtype=LOG_INT)
        logf[:k], logi[:k] = st.logf[:k], st.logi[:k]
        return st._replace(logf=logf, logi=logi)
    k = int(st.i[I_NEV])
    evt, evi = np.zeros(2 * len(st.evt)), np.zeros((2 * len(st.evt), 3), dtype=np.int64)
    evt[:k], evi[:k] = st.evt[:k], st.evi[:k]
    return st._replace(evt=evt, evi=evi)


def by_reference(obj: State | Params) -> object:
    """What the engine is handed: the namedtuple itself in plain Python, a numba StructRef over
    the same arrays when compiled just in time (see _structs.py; the ahead-of-time engine takes
    the plain arrays)."""
    from kvcargo.engine import aot

    if not _jit.compiled() or aot.in_use():
        return obj
    from kvcargo.engine._structs import by_reference as compiled

    return compiled(obj)
