"""Wire a resolved configuration into the engine, run it, and return the raw records.

This is the only engine module that touches catalog objects: it asks the cost model and the
hand-off physics for coefficient arrays and per-request transfer figures, so the event handlers
only ever see numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from kvcargo import _jit, stepcost
from kvcargo.calibrated import N_SCALARS, N_TABLES, tabulate
from kvcargo.catalog import Link
from kvcargo.ced import replay_on_decode
from kvcargo.config import Resolved, needs_extra_columns
from kvcargo.cost import HF_OVERHEAD, kv_capacity, model_coefficients, shape
from kvcargo.engine import aot
from kvcargo.engine import state as S
from kvcargo.engine.loop import run_events
from kvcargo.engine.state import Params, State, grown, new_state
from kvcargo.engine.steplog import CHUNK_STEPS, FoldedSteps, StepFold
from kvcargo.families import prefill_resident_bytes
from kvcargo.linkmodel import effective, link_transfers
from kvcargo.serving import uses_scheduled_engine
from kvcargo.transfer import Transfers, endpoint_work, parts_per_handoff
from kvcargo.workload.stream import BLOCK_TOKENS


class InstanceTotals(NamedTuple):
    """Per instance (prefill instances first), what every engine totals: the columns of
    ``EngineOutput.stats``, in this order."""

    busy_s: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    compute_j: np.ndarray
    memory_j: np.ndarray
    steps: np.ndarray


class EngineTotals(NamedTuple):
    """Per instance, its optical transform engine's: the columns of ``EngineOutput.engine_stats``."""

    conversion_j: np.ndarray
    flops: np.ndarray
    bound_s: np.ndarray
    """Seconds of steps the engine bound."""


class KvHeld(NamedTuple):
    """Per prefill instance, KV tokens held: the columns of ``EngineOutput.kv_held``."""

    integral: np.ndarray
    """Token-seconds."""
    peak: np.ndarray


RECORD_STATS = S.STATS.span("S_BUSY", "S_STEPS")
RECORD_ENGINE = S.STATS.span("S_EO", "S_OPT_BUSY")
RECORD_KV_HELD = S.STATS.span("S_KV_INT", "S_KV_PEAK")
RECORD_LEVERS = S.STATS.span("S_COMM", "S_GAINED")
"""The engine's ``State.stats`` columns behind the record's per-instance tables (in their order)."""
RECORD_INTS = S.REQUESTS.names[S.REQUESTS.span("STATUS", "FIRST_STEP")]
"""The per-request integers the record keeps (as the timestamps, under their lower-case names)."""
assert [len(S.STATS.names[cols]) for cols in (RECORD_STATS, RECORD_ENGINE, RECORD_KV_HELD)] == [
    len(InstanceTotals._fields), len(EngineTotals._fields), len(KvHeld._fields)]


@dataclass(frozen=True)
class EngineOutput:
    """What one run produced: per-request timestamps, per-instance totals, the step log.

    Timestamps are NaN where a stage did not happen (no hand-off, rejected request).
    """

    resolved: Resolved
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prefill_start: np.ndarray
    first_token: np.ndarray
    kv_start: np.ndarray
    kv_ready: np.ndarray
    decode_start: np.ndarray
    finish: np.ndarray
    status: np.ndarray
    """PENDING, DONE or REJECTED (see engine.state)."""
    prefill_inst: np.ndarray
    decode_inst: np.ndarray
    first_step: np.ndarray
    """Per request: ordinal of its first decode step on its decode instance."""
    stats: np.ndarray
    """Per instance (prefill first), the columns of :class:`InstanceTotals`; read them by name
    through :attr:`totals`."""
    engine_stats: np.ndarray
    """Per instance, the columns of :class:`EngineTotals` (:attr:`engine_totals`)."""
    prefill_done: np.ndarray
    """When each prefill step ended, where the first token comes from the decode side (CED
    replay there); NaN otherwise (the prefill ends with the first token)."""
    kv_held: np.ndarray
    """Per prefill instance with ``--kv-reserve at-transfer``, the columns of :class:`KvHeld`
    (:attr:`kv_held_totals`)."""
    send_fraction: np.ndarray
    """Share of each hand-off that crossed the network (below 1 with a decode prefix cache)."""
    want_memory: np.ndarray
    reserved: np.ndarray
    """With ``--kv-reserve at-transfer``: when each hand-off asked for decode memory, and got it."""
    steps: np.ndarray
    """Decode steps in the order they ended: columns start, end."""
    step_inst: np.ndarray
    """Per logged step: instance index (within the decode or colocated pool) and batch size."""
    horizon: float
    transfers: int
    port_busy: np.ndarray
    """Seconds of transfer per port: the cluster link, then per prefill and decode instance a NIC
    or NVLink port (``--topology``)."""
    port_channels: np.ndarray
    link_busy_s: float
    link_j: float
    transit_j: float
    transit_bound: np.ndarray
    wire_bytes: np.ndarray
    """Per request: bytes its hand-off puts on the wire."""
    lever_stats: np.ndarray
    """Per instance: communication s, scale-up J, draft s, rows verified, tokens they gained."""
    verify_passes: np.ndarray
    """Speculative decoding, per request: the verify passes it took part in."""
    itl_values: np.ndarray | None = None
    itl_offsets: np.ndarray | None = None
    """Scheduled engine: every request's token gaps, flat with offsets (a preemption makes them
    irregular, so they are not derived from the step log alone); the array engine lists them
    only for small runs."""
    itl_runs: tuple | None = None
    """Array scheduled engine: its runs of token gaps (``engine.sched_gaps``), which the summary
    reads."""
    levers: dict | None = None
    """Scheduled engine: the serving levers' summary metrics."""
    swap_j: float = 0.0
    """Energy of KV swapped over the host link (paged KV with swap preemption)."""
    spans: list | None = None
    """Scheduled engine: (what, pool, instance, request, start, end) of every preemption."""
    folded: FoldedSteps | None = None
    """A run that folded its step log as it went (``run(..., fold_steps=True)``): what the
    summary reads of it; ``steps`` and ``step_inst`` are then empty."""
    figures: Any = None
    """A windowed run (engine/window.py): the summary's per-request figures
    (``kvcargo.metrics.RequestFigures``), taken as its requests settled; the per-request
    fields are then empty."""

    @property
    def totals(self) -> InstanceTotals:
        return InstanceTotals(*self.stats.T)

    @property
    def engine_totals(self) -> EngineTotals:
        return EngineTotals(*self.engine_stats.T)

    @property
    def kv_held_totals(self) -> KvHeld:
        return KvHeld(*self.kv_held.T)


def _ports(res: Resolved) -> tuple[np.ndarray, np.ndarray]:
    """Per port: bandwidth of a channel, latency, channels (port 0 is the cluster link; then a
    NIC or NVLink port per prefill instance, then per decode instance); the NVLink domain of
    every instance (its first GPU's, GPUs numbered prefill pool first)."""
    c, link = res.config, engine_link(res, res.link)
    rows = [(link.bandwidth, link.latency, res.channels)]
    per = [res.prefill_pool.n] * res.n_prefill + [res.decode_pool.n] * res.n_decode
    if c.topology == "nic":
        rows += [(link.bandwidth, link.latency, c.nics_per_instance)] * len(per)
    elif c.topology == "nvlink-domain":
        for pool, count in ((res.prefill_pool, res.n_prefill), (res.decode_pool, res.n_decode)):
            nv = engine_link(res, res.catalog.link(pool.device.scale_up))
            rows += [(nv.bandwidth, nv.latency, 1)] * count
    first_gpu = np.concatenate([[0], np.cumsum(per)[:-1]]) if per else np.zeros(0)
    pf = np.array(rows, dtype=np.float64)
    return pf, (first_gpu // c.domain_size).astype(np.int64)


def engine_link(res: Resolved, link: Link) -> Link:
    """A link as the engine's ports see it: under ``--link-model measured`` its sustained rate and
    message overhead (kvcargo.linkmodel), else the catalog entry."""
    return effective(link) if res.config.link_model == "measured" else link


def build_params(res: Resolved, zeros: Callable[..., np.ndarray] | None = None,
                 loaded: int | None = None) -> tuple[Params, Transfers]:
    """Coefficient arrays and per-request hand-off figures for the engine. ``zeros``: allocates
    the per-request tables, of which the first ``loaded`` rows (default: all) are filled (a
    windowed run fills the others with :func:`request_rows` as it goes; the figures returned
    are then those of the rows filled)."""
    w, c = res.workload, res.config
    n = len(w)
    pull = pulls(res)
    extra = needs_extra_columns(c) or pull
    if zeros is None:
        rf, rx, ri = S.REQUEST_FLOATS.new(n), S.REQUEST_EXTRA.new(n if extra else 1), S.REQUEST_INTS.new(n)
    else:
        assert not extra, "a windowed run has no extra request columns"
        rf, rx = zeros((n, S.REQUEST_FLOATS.width)), S.REQUEST_EXTRA.new(1)
        ri = zeros((n, S.REQUEST_INTS.width), dtype=np.int64)
    xfer, endpoint, dec_cost = request_rows(res, rf, rx, ri, 0, n if loaded is None else loaded)
    mixed = stepcost.step_class(res.model) != stepcost.ATTENTION
    rq = stepcost.request_terms(res.model, np.ascontiguousarray(w.prompt, dtype=np.int64)) if mixed \
        else S.REQUEST_TERMS.new(1)
    pf, domain = _ports(res)
    ints = S.SWITCHES.new()
    ints[S.P_NPREFILL] = res.n_prefill
    ints[S.P_COLOCATED] = int(res.colocated)
    ints[S.P_BUDGET] = c.token_budget
    ints[S.P_MAXBATCH] = c.max_batch
    ints[S.P_KVCAP] = res.kv_capacity
    ints[S.P_ENDPOINT] = int(endpoint)
    ints[S.P_GROUPS] = parts_per_handoff(c.send, c.layer_groups, res.model.layers)
    ints[S.P_TOPOLOGY] = {"shared": S.SHARED, "nic": S.NIC, "nvlink-domain": S.DOMAIN}[c.topology]
    ints[S.P_FAIR] = int(c.link_sharing == "fair")
    ints[S.P_RESERVE] = int(pull)
    ints[S.P_EARLY] = int(c.early_decode_choice or pull)
    ints[S.P_DECCOST] = int(dec_cost)
    lev = res.levers
    ints[S.P_PREFILL_KVCAP] = (lev.prefill.kv_capacity if lev.has_layout or lev.draft is not None
                               else kv_capacity(res.model, res.prefill_pool, prefill_resident_bytes(res.model))
                               if not res.colocated else res.kv_capacity)
    ints[S.P_MIXED] = int(mixed)
    ints[S.P_REPLAY_DECODE] = int(replay_on_decode(res.model))
    # without a prefix cache the engine never reads them: one-element dummies (not n + 1 offsets)
    blocks, offsets = _dense_blocks(w) if c.decode_prefix_cache else (np.zeros(1, np.int64), np.zeros(1, np.int64))
    ints[S.P_PREFIX] = int(c.decode_prefix_cache)
    ints[S.P_BLOCK_TOKENS] = BLOCK_TOKENS
    mi, mf = model_coefficients(res.model, c.lm_head)
    hf = np.stack([res.prefill_pool.coefficients(), res.decode_pool.coefficients()])
    ints[S.P_CALIBRATED] = int(c.cost_model == "calibrated")
    ct, cs = step_tables(res)
    lf, hs = lev.layout_arrays(res.model, res.prefill_pool, res.decode_pool)
    mid, mfd, alpha = mi, mf, 0.0
    if lev.draft is not None:
        mid, mfd = model_coefficients(lev.draft.model, c.lm_head)
        ints[S.P_SPEC], ints[S.P_GAMMA], ints[S.P_SPEC_SEED] = 1, lev.draft.gamma, lev.draft.seed
        alpha = lev.draft.alpha
    ehf = hf.copy()
    ehf[:, HF_OVERHEAD] = 0.0
    xi, xf = stepcost.model_extension(res.model, c.lm_head, c.fft_efficiency, replay_on_decode(res.model))
    eo = np.stack([stepcost.engine_coefficients(pool, res.model) for pool in (res.prefill_pool, res.decode_pool)])
    return Params(rf=rf, rx=rx, ri=ri, mi=mi, mf=mf, hf=hf, ints=ints, pf=pf,
                  port_cap=pf[:, S.PF_BW] * pf[:, S.PF_CHANNELS], domain=domain, blocks=blocks,
                  block_offsets=offsets, ct=ct, cs=cs, lf=lf, hs=hs, mid=mid, mfd=mfd,
                  hd=lev.draft_arrays(res.prefill_pool, res.decode_pool),
                  alpha=np.array([alpha], dtype=np.float64), rq=rq, xi=xi, xf=xf, eo=eo, ehf=ehf), xfer


def pulls(res: Resolved) -> bool:
    """The pull model: decode reserves before the transfer, prefill holds the prompt KV until it
    lands (asked for, or the companion's scheduled pools under speculative decoding)."""
    return res.config.kv_reserve == "at-transfer" or (res.levers.draft is not None and not res.colocated)


def request_rows(res: Resolved, rf: np.ndarray, rx: np.ndarray, ri: np.ndarray, lo: int,
                 hi: int) -> tuple[Transfers, bool, bool]:
    """Fill rows ``lo`` to ``hi`` (excluded) of the per-request tables (``rx``: all its rows, or
    one dummy) from the workload; their hand-off figures, and whether compression works at the
    endpoints and costs decode work."""
    w, c = res.workload, res.config
    prompt = np.ascontiguousarray(w.prompt[lo:hi], dtype=np.int64)
    n = hi - lo
    kv_bytes = shape(res.model).handoff_bytes(prompt)
    if res.levers.draft is not None:  # the draft's prompt KV crosses as well
        kv_bytes = kv_bytes + prompt * res.levers.draft.kv_per_token
    groups = parts_per_handoff(c.send, c.layer_groups, res.model.layers)
    rows, xrows = rf[lo:hi], rx[lo:hi] if len(rx) == len(rf) else rx
    rows[:, S.ARRIVAL_T] = w.arrival[lo:hi]
    endpoint = dec_cost = False
    kvb = res.model.kv_bytes
    if res.colocated:
        xfer = link_transfers(c.link_model, res.link, None, np.zeros(n), kvb)
    else:
        comp = res.compression
        xfer = link_transfers(c.link_model, res.link, comp, kv_bytes, kvb, prompt, groups)
        rows[:, S.XFER_TIME] = xfer.duration
        rows[:, S.XFER_J] = xfer.link_j
        rows[:, S.TRANSIT_J] = xfer.transit_j
        if len(rx) == len(rf):
            xrows[:, S.SLICE_TIME] = xfer.slice_time
            xrows[:, S.SLICE_EXTRA] = xfer.last_extra
            xrows[:, S.EFF_BYTES] = xfer.slice_time * groups * engine_link(res, res.link).bandwidth
        if c.topology == "nvlink-domain":
            nv = link_transfers(c.link_model, res.catalog.link(res.prefill_pool.device.scale_up), comp,
                                kv_bytes, kvb, prompt, groups)
            xrows[:, S.XFER_TIME_NV], xrows[:, S.SLICE_TIME_NV] = nv.duration, nv.slice_time
            xrows[:, S.XFER_J_NV] = nv.link_j
        if comp is not None and comp.at == "endpoint":
            endpoint = True
            rows[:, S.EP_OPS], rows[:, S.EP_BYTES] = endpoint_work(comp, kv_bytes, prompt, kvb)
        if comp is not None and comp.codec.decode_ops_per_value > 0:
            dec_cost = True
            xrows[:, S.DEC_OPS], xrows[:, S.DEC_BYTES] = comp.decode_work(kv_bytes, xfer.wire_bytes, kvb)
    irows = ri[lo:hi]
    irows[:, S.PROMPT] = prompt
    irows[:, S.OUTPUT] = w.output[lo:hi]
    irows[:, S.QUAD] = prompt * (prompt + 1)
    irows[:, S.UNITS] = 1 if shape(res.model).state_bytes else prompt + irows[:, S.OUTPUT]
    return xfer, endpoint, dec_cost


def step_tables(res: Resolved) -> tuple[np.ndarray, np.ndarray]:
    """The calibrated model's tables per pool row (prefill or colocated, decode); a dummy under
    the roofline."""
    if res.config.cost_model != "calibrated":
        return np.zeros((2, N_TABLES, 2, 2)), np.zeros((2, N_SCALARS))
    rows = [tabulate(res.model, pool, res.config.lm_head) for pool in (res.prefill_pool, res.decode_pool)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def _dense_blocks(w) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """The workload's prompt block ids renumbered 0..U-1 (the cache indexes arrays by them)."""
    _, dense = np.unique(w.block_ids, return_inverse=True)
    return dense.astype(np.int64), np.ascontiguousarray(w.block_offsets, dtype=np.int64)


def event_loop() -> Callable[[State, Params], int]:
    """The event loop as this process runs it: plain Python, the ahead-of-time module (it takes
    the plain arrays), or numba's JIT over pointers to the state and the parameters (see
    _structs.py)."""
    if not _jit.compiled() or aot.in_use():
        return run_events
    from kvcargo.engine._structs import run_by_pointer

    return run_by_pointer


def run(res: Resolved, built: tuple[Params, Transfers] | None = None,
        stop: Callable[[State], bool] | None = None, log_capacity: int | None = None,
        fold_steps: bool = False) -> EngineOutput | None:
    """Simulate a resolved configuration; ``built``: its :func:`build_params`, when a caller has
    them already (a capacity search builds them once and changes only the arrival times).
    ``stop``: asked with the state each time ``log_capacity`` decode steps have been logged;
    True abandons the run (None is returned), else the step log is emptied and the run goes on
    (the output's step log then holds only the steps since: for callers that read no step
    figures). ``fold_steps``: keep of the step log only what the summary reads (``folded``), a
    chunk at a time (the scheduled engine keeps its log); where engine/window.py can, hold only a
    window of the requests, and of each only the summary's figures (``figures``)."""
    if uses_scheduled_engine(res):
        from kvcargo.engine.scheduled import run_scheduled  # only then: the default run never loads it

        return run_scheduled(res)
    if fold_steps and built is None and stop is None:
        from kvcargo.engine.window import run_windowed, windowable

        if windowable(res):
            return run_windowed(res)
    params, xfer = build_params(res) if built is None else built
    del built  # the engine frees the parameters before its last copies (a caller may keep them)
    n = len(params.rf)
    n_slots = res.n_decode if res.colocated else res.n_prefill
    fold = StepFold(res.n_decode) if fold_steps else None
    if fold is not None:
        assert stop is None, "a folded run's step log is the fold's"
        stop, log_capacity = fold.stop, CHUNK_STEPS
    channels = params.pf[:, S.PF_CHANNELS].astype(np.int64)
    # Room for a decode step per 8 output tokens (batches of 8 or more), unless a caller sets it.
    # The log is zeroed memory: pages are committed only as steps are written, so room costs
    # nothing until used, while a full log makes the engine pause, copy the log into one twice as
    # large and resume.
    guess = log_capacity or max(1024, int(params.ri[:, S.OUTPUT].sum() // 8))
    st = new_state(n, n_slots, res.n_decode, res.n_prefill + res.n_decode, res.config.max_batch, channels,
                   int(params.ints[S.P_GROUPS]), bool(params.ints[S.P_FAIR]), log_capacity=guess,
                   n_blocks=int(params.blocks.max()) + 1 if params.ints[S.P_PREFIX] else 0,
                   extra=len(params.rx) == n or bool(params.ints[S.P_REPLAY_DECODE]),
                   speculative=bool(params.ints[S.P_SPEC]))
    aot.prepare(n * int(params.ints[S.P_GROUPS]))
    transit_bound, wire_bytes = xfer.transit_bound, xfer.wire_bytes
    del xfer  # the other per-request figures are in the parameters now
    loop = event_loop()
    while (code := loop(st, params)) != S.FINISHED:
        if stop is not None and code == S.LOG_FULL:
            if stop(st):
                return None
            st.i[S.I_NSTEPS] = 0
            continue
        st = grown(st, code)
    del params  # before the copies below: the largest tables go first
    k = int(st.i[S.I_NSTEPS])
    if fold is not None:
        fold.take(st.logf[:k], st.logi[:k])
        k = 0
    return EngineOutput(resolved=res, **request_records(res, st, 0, n, transit_bound, wire_bytes),
                        **instance_records(res, st, channels), steps=st.logf[:k], step_inst=st.logi[:k],
                        folded=None if fold is None else fold.steps())


def request_records(res: Resolved, st: State, lo: int, hi: int, transit_bound: np.ndarray,
                    wire_bytes: np.ndarray) -> dict[str, np.ndarray]:
    """The per-request fields of :class:`EngineOutput` for requests ``lo`` to ``hi`` (excluded):
    the timestamps are views, the integers compact copies (the big table can be freed)."""
    n = len(st.qnext)

    def col(table: np.ndarray, c: int) -> np.ndarray:
        return np.ascontiguousarray(table[lo:hi, c])

    # Views where the table is kept whole anyway (the timestamps) or the workload holds the same array.
    t, tx, r = st.t, st.tx, st.r
    w = res.workload

    def extra(c: int, absent: float = np.nan) -> np.ndarray:  # without the column, one read-only value
        return col(tx, c) if len(tx) == n else np.broadcast_to(absent, hi - lo)

    return dict(
        arrival=np.asarray(w.arrival[lo:hi], dtype=np.float64), prompt=np.asarray(w.prompt[lo:hi], dtype=np.int64),
        output=np.asarray(w.output[lo:hi], dtype=np.int64),
        **{name.lower(): t[lo:hi, c] for name, c in S.TIMES.index.items()},
        **{name.lower(): col(r, S.REQUESTS[name]) for name in RECORD_INTS},
        prefill_done=extra(S.PREFILL_END), want_memory=extra(S.WANT_MEMORY), reserved=extra(S.RESERVED),
        send_fraction=np.nan_to_num(extra(S.SEND_FRAC), nan=1.0) if len(tx) == n else extra(S.SEND_FRAC, 1.0),
        transit_bound=transit_bound, wire_bytes=wire_bytes,
        verify_passes=col(st.spec, S.VERIFY) if len(st.spec) == n else np.zeros(hi - lo, dtype=np.int64),
    )


def instance_records(res: Resolved, st: State, channels: np.ndarray) -> dict[str, Any]:
    """The per-instance fields and the totals of :class:`EngineOutput`."""
    return dict(
        stats=st.stats[:, RECORD_STATS].copy(), engine_stats=st.stats[:, RECORD_ENGINE].copy(),
        kv_held=st.stats[: res.n_prefill, RECORD_KV_HELD].copy(),
        lever_stats=st.stats[:, RECORD_LEVERS].copy(),
        horizon=float(st.f[S.F_NOW]), transfers=int(st.i[S.I_XFERS]),
        port_busy=st.port_busy.copy(), port_channels=channels, link_busy_s=float(st.port_busy[0]),
        link_j=float(st.f[S.F_LINK_J]), transit_j=float(st.f[S.F_TRANSIT_J]),
    )
