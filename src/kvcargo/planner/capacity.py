"""Capacity: the analytic ceilings of Appendix B and the highest sustainable rate.

Ceilings (requests per second) for mean prompt p and mean output o, from the cost model:

* prefill: ``n = max(1, ⌊budget/p⌋)`` prompts of p tokens per step, ``n / t_prefill(n × p)``
  per instance (plus the GPU compression pass when the codec runs at the endpoint);
* decode: batch ``b = max(1, min(max_batch, ⌊KVcap/(p+o)⌋))``, ``b / t_dec(b contexts of
  ⌊p + o/2⌋) / max(1, o − 1)`` per instance;
* link: ``channels / t_transfer(p · KV_tok)`` (compression included);
* colocated: ``N / (1/prefill + 1/decode)`` on the colocated pool (``--device``), N instances.

The bound is their minimum (pool totals: per-instance ceilings × instances). The search starts
at the bound, multiplies the rate by 1.5 while SLO attainment stays ≥ target, then bisects until
``hi − lo ≤ rtol·hi`` and answers ``lo`` (0 when even a tiny rate misses the target).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from kvcargo import parallel
from kvcargo.ced import replay_on_decode
from kvcargo.config import Resolved, SimConfig, colocated_pool, load_workload, resolve
from kvcargo.cost import Pool, kv_capacity, shape
from kvcargo.engine import aot
from kvcargo.errors import KvcargoError
from kvcargo.handoff import prefill_time
from kvcargo.levers import PoolLevers
from kvcargo.linkmodel import link_transfers
from kvcargo.speculative import Draft, speculative_step_time
from kvcargo.stepcost import ATTENTION, step_class
from kvcargo.stepcost import decode_step as class_decode_step
from kvcargo.steps import step_cost
from kvcargo.workload import Workload

TARGET = 0.9
"""Default share of (steady) requests that must meet both SLOs."""
RTOL = 0.02
"""Default relative width at which the bisection stops."""
GROWTH = 1.5
"""Factor of the bracketing phase."""
MIN_RTOL = 1e-6
"""Finest ``rtol``: about 20 halvings of the bracket, one simulation each; far finer, the bracket
reaches float64's resolution (about 1e-16 of the rate) and the bisection never ends."""
MAX_EXPANSIONS = 60
MIN_FRACTION = 2.0 ** -12
"""Give up (answer 0) once the bracket's top falls below this fraction of the start."""


@dataclass(frozen=True, kw_only=True)
class Ceilings:
    """Per-resource ceilings in req/s (pool totals) and what they were computed from."""

    mode: str
    prompt: float
    output: float
    prefill: float
    decode: float
    link: float
    """``inf`` in colocated mode (no hand-off)."""
    colocated: float
    bound: float
    bound_by: str
    prefill_per_instance: float
    decode_per_instance: float
    prefill_instances: int
    decode_instances: int
    prefill_batch: int
    prefill_step_s: float
    decode_batch: int
    decode_context: int
    decode_step_s: float
    kv_capacity: int
    transfer_s: float
    channels: int
    colocated_instances: int
    colocated_per_instance_prefill: float
    colocated_per_instance_decode: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def mean_lengths(res: Resolved) -> tuple[float, float]:
    """Mean prompt and output lengths: the configuration's, or its trace's when one is replayed."""
    if res.config.workload_file:
        return float(np.mean(res.workload.prompt)), float(np.mean(res.workload.output))
    return res.config.prompt, res.config.output


def _prefill_ceiling(config: SimConfig, model, pool: Pool, p: float, compression,
                     lever: PoolLevers | None = None, draft: Draft | None = None) -> tuple[float, int, float]:
    n = max(1, math.floor(config.token_budget / p))
    s = max(1, round(p))
    t, _ = prefill_time(model, pool, n, s, cost_model=config.cost_model, lm_head=config.lm_head,
                        fft_efficiency=config.fft_efficiency,
                        encoder_only=replay_on_decode(model) and config.mode != "colocated", lever=lever,
                        draft=draft.model if draft is not None else None, compression=compression,
                        handoff_bytes=float(shape(model).handoff_bytes(s)))
    return n / t, n, t


def _decode_ceiling(config: SimConfig, model, pool: Pool, kvcap: int, p: float, o: float,
                    lever: PoolLevers | None = None, draft: Draft | None = None) -> tuple[float, int, int, float]:
    units = 1 if shape(model).state_bytes else p + o  # a distilled state is one unit
    b = max(1, min(config.max_batch, math.floor(kvcap / units)))
    ctx = math.floor(p + o / 2)
    layout = lever.layout if lever is not None else None
    if draft is not None:  # a verify pass gains the expected tokens per row, (1 − α^(γ+1))/(1 − α)
        t = speculative_step_time(model, pool, draft, b, ctx, layout, lever.scale_up if lever else None)
        return b * draft.closed_form / t / max(1, o - 1), b, ctx, t
    if layout is not None:  # with its communication
        t = parallel.decode_time(model, pool, layout, lever.scale_up, b, ctx)
    elif step_class(model) == ATTENTION:
        t = step_cost(model, pool, "decode", b, ctx, config.cost_model)["time_s"]
    else:
        t = class_decode_step(model, pool, b, b * ctx, fft_efficiency=config.fft_efficiency).time
    return b / t / max(1, o - 1), b, ctx, t


def ceilings(config: SimConfig, workload: Workload | None = None) -> Ceilings:
    """The analytic ceilings of a configuration (Appendix B); ``workload``: its request stream,
    when the caller has it (a plan's candidates share one)."""
    res = resolve(config, workload)
    model = res.model
    p, o = mean_lengths(res)
    col_pool = colocated_pool(config, res.catalog)
    n_col = config.colocated_instances
    col_lever = res.levers.decode if res.colocated else None
    col_kv = col_lever.kv_capacity if col_lever else kv_capacity(model, col_pool)
    if col_kv > 0:
        draft = res.levers.draft if res.colocated else None
        cpf, n_cpf, t_cpf = _prefill_ceiling(config, model, col_pool, p, None, col_lever, draft)
        cdc, cb, cctx, t_cdc = _decode_ceiling(config, model, col_pool, col_kv, p, o, col_lever, draft)
        col = n_col / (1 / cpf + 1 / cdc)
    else:  # the model does not fit one colocated instance of --device
        cpf = cdc = col = 0.0
    if res.colocated:  # resolve() has checked that it fits: col_kv == res.kv_capacity > 0
        return Ceilings(mode="colocated", prompt=p, output=o, prefill=cpf * n_col, decode=cdc * n_col,
                        link=math.inf, colocated=col, bound=col, bound_by="colocated",
                        prefill_per_instance=cpf, decode_per_instance=cdc, prefill_instances=n_col,
                        decode_instances=n_col, prefill_batch=n_cpf, prefill_step_s=t_cpf, decode_batch=cb,
                        decode_context=cctx, decode_step_s=t_cdc, kv_capacity=col_kv, transfer_s=0.0, channels=0,
                        colocated_instances=n_col, colocated_per_instance_prefill=cpf,
                        colocated_per_instance_decode=cdc)
    lev = res.levers
    pf, n_pf, t_pf = _prefill_ceiling(config, model, res.prefill_pool, p, res.compression, lev.prefill, lev.draft)
    dc, b, ctx, t_dc = _decode_ceiling(config, model, res.decode_pool, res.kv_capacity, p, o, lev.decode, lev.draft)
    handoff = shape(model).handoff_bytes(p) + (p * lev.draft.kv_per_token if lev.draft else 0)  # draft KV too
    xfer = link_transfers(config.link_model, res.link, res.compression, np.array([handoff], dtype=np.float64),
                          model.kv_bytes)
    t_x = float(xfer.duration[0])
    link = res.channels / t_x
    if config.topology == "nic":  # a NIC (or several) per instance: pairs of instances transfer in parallel
        link = link * min(res.n_prefill, res.n_decode) * config.nics_per_instance
    elif config.topology != "shared":  # NVLink domains: no single link to fill
        link = math.inf
    totals = {"prefill": pf * res.n_prefill, "decode": dc * res.n_decode, "link": link}
    bound_by = min(totals, key=totals.__getitem__)
    return Ceilings(mode="disagg", prompt=p, output=o, prefill=totals["prefill"], decode=totals["decode"],
                    link=link, colocated=col, bound=totals[bound_by], bound_by=bound_by,
                    prefill_per_instance=pf, decode_per_instance=dc, prefill_instances=res.n_prefill,
                    decode_instances=res.n_decode, prefill_batch=n_pf, prefill_step_s=t_pf, decode_batch=b,
                    decode_context=ctx, decode_step_s=t_dc, kv_capacity=res.kv_capacity, transfer_s=t_x,
                    channels=res.channels, colocated_instances=n_col, colocated_per_instance_prefill=cpf,
                    colocated_per_instance_decode=cdc)


# ------------------------------------------------------------------------------------ search


PROBE_KEYS = ("slo_attainment", "ttft_p99", "tpot_p99", "goodput_rps", "link_busy", "output_tok_per_s",
              "e2e_mean", "requests")
STEADY_LIFETIMES = 3.0
"""A run shorter than this many mean request lifetimes measures a transient, not a steady state."""


@dataclass
class Search:
    """The bracket-and-bisect search: the answer and every probe, in order."""

    rate: float
    """Highest rate found with SLO attainment ≥ target (0 if none)."""
    target: float
    rtol: float
    start: float
    lo: float
    hi: float
    feasible: bool
    probes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def simulations(self) -> int:
        return len(self.probes)

    @property
    def lifetimes(self) -> float | None:
        """How many mean request lifetimes (E2E) the answer's run spans: arrivals last
        ``requests / rate`` seconds. Below :data:`STEADY_LIFETIMES` the answer measures how
        much backlog a short run absorbs rather than a steady state (use more requests)."""
        for p in self.probes:
            if p["rate"] == self.rate and self.rate > 0 and p["e2e_mean"] > 0:
                return p["requests"] / self.rate / p["e2e_mean"]
        return None

    @property
    def steady(self) -> bool:
        life = self.lifetimes
        return life is None or life >= STEADY_LIFETIMES

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["simulations"] = self.simulations
        d["lifetimes"] = self.lifetimes
        d["steady"] = self.steady
        return d


def probe_summary(config: SimConfig) -> dict[str, Any]:
    """Simulate one probe; keep the few numbers the search and the plots use."""
    from kvcargo.simulation import simulate

    s = simulate(config).summary
    return {k: float(s[k]) for k in PROBE_KEYS}


class RateProbe:
    """Probes of one configuration at many rates, with the same figures as :func:`probe_summary`.

    For a generated workload the rate changes only the arrival times (the lengths come from the
    same draws), so the configuration is resolved and the engine's parameters are built once; each
    probe draws the arrivals, runs, and computes only the figures it keeps.

    ``decide``: the probe only has to say whether SLO attainment reaches ``target`` (a plan keeps
    nothing else of a search but its answer). The run is then abandoned as soon as the steady
    requests already known to miss an SLO are too many for the target, whatever the others do:
    which requests are steady is known before the run (every request the engine does not reject
    on arrival, and it rejects by length alone, completes), a stamped first token or finish never
    changes, and one not stamped yet comes no earlier than the clock (a request waiting longer
    than the TTFT SLO, or decoding longer than its output at the TPOT SLO, has missed). Such a
    probe reports that bound as its attainment and NaN for the rest."""

    def __init__(self, config: SimConfig, decide: float | None = None) -> None:
        from kvcargo.engine.cluster import build_params

        self.res = resolve(config)
        self.built = build_params(self.res)
        self.decide = decide
        # per request, its TTFT floor: one per search, since the rate moves only the arrivals
        self.floor = None if decide is None else ttft_floor(self.res, self.built[0])

    @staticmethod
    def applies(config: SimConfig) -> bool:
        """Whether the rate changes nothing but the arrival times (generated requests, the default
        engine); other configurations are probed by :func:`probe_summary`."""
        from kvcargo.serving import session_shape

        return (config.workload_file is None and config.workload is None and not config.scheduled
                and not session_shape(config).is_session)

    def __call__(self, rate: float) -> dict[str, Any]:
        from kvcargo.engine.cluster import run
        from kvcargo.engine.state import ARRIVAL_T
        from kvcargo.metrics import probe_figures

        config = self.res.config.model_copy(update={"rate": rate})  # a valid rate: no validation needed
        res = replace(self.res, config=config, workload=load_workload(config))
        params, xfer = self.built
        rf = params.rf.copy()
        rf[:, ARRIVAL_T] = res.workload.arrival
        verdict: list[float] = []
        stop = None if self.decide is None else self._stop(res, params, verdict)
        # decided before it runs when too many steady requests cannot meet the TTFT SLO at all
        out = None if stop is not None and stop(None) else run(res, (params._replace(rf=rf), xfer), stop,
                                                                EARLY_LOG_ROWS if stop else None)
        if out is None:
            return {k: math.nan for k in PROBE_KEYS} | {"slo_attainment": verdict[0], "requests": float(len(rf))}
        s = probe_figures(out)
        return {k: float(s[k]) for k in PROBE_KEYS}

    def _stop(self, res: Resolved, params: Any, verdict: list[float]) -> Callable[[Any], bool]:
        """Whether a paused run (None: the run before it starts) can no longer reach the target
        (its bound goes to ``verdict``). Requests whose :func:`ttft_floor` exceeds the TTFT SLO
        count as missed from the start."""
        from types import SimpleNamespace

        from kvcargo.engine import state as S
        from kvcargo.metrics import steady_requests

        ri, ints = params.ri, params.ints
        rejected = (ri[:, S.UNITS] > ints[S.P_KVCAP]) | (
            bool(ints[S.P_RESERVE]) & (ri[:, S.PROMPT] > ints[S.P_PREFILL_KVCAP]))  # as on arrival
        status = np.where(rejected, S.REJECTED, S.DONE)
        steady = steady_requests(SimpleNamespace(status=status, arrival=res.workload.arrival))
        arrival, multi = res.workload.arrival[steady], res.workload.output[steady] >= 2
        gaps = np.maximum(1, res.workload.output[steady] - 1)
        cfg, n, target = res.config, len(steady), self.decide
        doomed = (np.zeros(n, dtype=bool) if self.floor is None
                  else self.floor[steady] > cfg.ttft_slo * (1 + FLOOR_MARGIN))

        def stop(st: Any) -> bool:
            if n == 0:
                return False
            if st is None:  # nothing stamped yet, the clock at 0
                first = finish = np.full(n, np.nan)
                done, now = np.zeros(n, dtype=bool), 0.0
            else:
                first, finish = st.t[steady, S.FIRST_TOKEN], st.t[steady, S.FINISH]
                done, now = st.r[steady, S.STATUS] == S.DONE, st.f[S.F_NOW]
            # a time not stamped yet will be at least the clock: a latency is then at least
            # what it would be now (float subtraction and division are monotone)
            ttft_miss = doomed | np.where(np.isnan(first), now - arrival > cfg.ttft_slo,
                                          ~(first - arrival <= cfg.ttft_slo))
            end = np.where(done, finish, now)
            tpot_miss = multi & ~np.isnan(first) & ~((end - first) / gaps <= cfg.tpot_slo)
            bound = (n - int(np.count_nonzero(ttft_miss | tpot_miss))) / n
            if bound >= target:
                return False
            verdict.append(bound)
            return True

        return stop


FLOOR_MARGIN = 1e-6
"""Relative margin by which a :func:`ttft_floor` must exceed the TTFT SLO to count as a miss
(covers the rounding of the engine's clock and of its roofline's clock factor)."""


def ttft_floor(res: Resolved, params: Any) -> np.ndarray | None:
    """Per request, a lower bound on its TTFT at any rate, or None where none is derived.

    In the default engine (disaggregated, roofline costs, whole prompts, no prefix cache, draft,
    other model family, decode-side replay or parallel layout) a request's first token is stamped
    at the end of the prefill step that holds it, which starts no earlier than its arrival. That
    step's time is the roofline's ``max(t_c / s, t_m)`` (raised further by a power cap), plus the
    step overhead and any codec pass, with a clock factor ``s ≤ 1`` (DVFS lowers it, a power cap
    lowers it to the root of a cubic that is below the current factor, never below the minimum
    clock ≤ 1); ``t_c`` is the batch's FLOPs over the compute rate, and the FLOPs (integer
    coefficients ≥ 0 times the batch's tokens, Σ s(s+1) and prompt count) are at least the
    request's own. So TTFT ≥ FLOPs(its prompt alone) / compute rate + overhead."""
    from kvcargo.cost import HF_OVERHEAD, HF_RF, HF_SMIN, prefill_parts
    from kvcargo.engine import state as S

    ints = params.ints
    if (res.colocated or params.lf[0, parallel.LF_ON] != 0.0
            or params.hf[0, HF_SMIN] > 1.0
            or any(ints[k] for k in (S.P_PREFIX, S.P_SPEC, S.P_MIXED, S.P_REPLAY_DECODE, S.P_CALIBRATED))):
        return None
    flops, _, _ = prefill_parts(params.mi, params.mf, params.ri[:, S.PROMPT], params.ri[:, S.QUAD], 1)
    return flops.astype(np.float64) / params.hf[0, HF_RF] + params.hf[0, HF_OVERHEAD]


EARLY_LOG_ROWS = 4096
"""Decode steps between the checks of a deciding probe (its step log's size: a probe reads no
step figure, so the log is emptied at each check)."""


def search(config: SimConfig, target: float = TARGET, rtol: float = RTOL, start: float | None = None,
           probe: Callable[[SimConfig], dict[str, Any]] | None = None, decide: bool = False) -> Search:
    """Highest sustainable rate of ``config`` (its ``rate`` is ignored; everything else is kept).
    ``probe``: how a rate is measured (default: a simulation, :class:`RateProbe` where it applies).
    ``decide``: failing probes may stop as soon as they are decided (the same answer and probe
    count; a stopped probe's figures are NaN, its attainment a bound)."""
    check_target(target, rtol)
    if config.time_scale is not None:
        raise KvcargoError("capacity searches the arrival rate: drop --time-scale")
    if start is None:
        start = ceilings(config).bound
    if not (start > 0 and math.isfinite(start)):
        raise KvcargoError(f"cannot search from a rate of {start!r} req/s")
    result = Search(0.0, target, rtol, start, 0.0, start, False)
    if probe is None:  # the engine: compile it now if the whole search pays for it
        aot.prepare(expected_probes(rtol) * config.requests, accumulate=False)
    measure: Callable[[float], dict[str, Any]]
    if probe is None and RateProbe.applies(config):
        measure = RateProbe(config, target if decide else None)
    else:
        given = probe or probe_summary

        def measure(rate: float) -> dict[str, Any]:
            return given(config.replace(rate=rate))

    def ok(rate: float) -> bool:
        s = measure(rate)
        met = s["slo_attainment"]
        good = bool(met >= target)  # NaN (nothing completed) is a miss
        result.probes.append({"rate": rate, **s, "ok": good})
        return good

    lo, hi = 0.0, start
    expansions = 0
    while ok(hi):
        lo = hi
        hi = hi * GROWTH
        expansions += 1
        if expansions >= MAX_EXPANSIONS:
            raise KvcargoError(f"SLO attainment stays above {target:g} up to {lo:.4g} req/s; "
                               "is the workload empty or the SLO unbounded?")
    while hi - lo > rtol * hi:
        if lo == 0.0 and hi < start * MIN_FRACTION:
            break
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    result.lo, result.hi, result.rate, result.feasible = lo, hi, lo, lo > 0
    return result


def expected_probes(rtol: float) -> int:
    """Simulations of a search that stays inside its start (the usual case): the first probe,
    then halvings until the bracket is within ``rtol``."""
    return 1 + math.ceil(math.log2(1 / rtol))


def check_target(target: float, rtol: float) -> None:
    if not (0 < target <= 1):
        raise KvcargoError(f"--target must be in (0, 1], got {target:g}")
    if not (0 < rtol < 1):
        raise KvcargoError(f"--rtol must be in (0, 1), got {rtol:g}")
    if rtol < MIN_RTOL:
        raise KvcargoError(f"--rtol {rtol:g} is below {MIN_RTOL:g}: each halving of the bracket is one more "
                           "simulation, and below float64's resolution the bisection never ends")


def capacity(config: SimConfig, target: float = TARGET, rtol: float = RTOL,
             do_search: bool = True, decide: bool = False) -> dict[str, Any]:
    """Ceilings and (optionally) the search, as plain data (what ``capacity --json`` prints);
    ``decide``: see :func:`search`."""
    ceil = ceilings(config)
    out: dict[str, Any] = {"config": config.model_dump(), "ceilings": ceil.as_dict()}
    if do_search:
        out["search"] = search(config, target, rtol, ceil.bound, decide=decide).as_dict()
    return out


MAX_STEADY_REQUESTS = 50_000
"""Most requests :func:`steady_capacity` lets a probe have."""


def steady_capacity(config: SimConfig, target: float = TARGET, rtol: float = RTOL,
                    max_requests: int = MAX_STEADY_REQUESTS, decide: bool = False) -> dict[str, Any]:
    """:func:`capacity`, searched again with more requests while the answer's run is shorter
    than :data:`STEADY_LIFETIMES` request lifetimes (generated workloads only; at most three
    times). The data's ``config`` carries the request count used."""
    data = capacity(config, target, rtol, decide=decide)
    for _ in range(3):
        s = data["search"]
        life = s["lifetimes"]
        if s["steady"] or life is None or config.workload_file or config.requests >= max_requests:
            break
        want = math.ceil(config.requests * STEADY_LIFETIMES * 1.25 / life / 100) * 100
        config = config.replace(requests=min(max_requests, max(want, config.requests + 100)))
        data = capacity(config, target, rtol, decide=decide)
    return data


def capacity_task(payload: dict[str, Any]) -> dict[str, Any]:
    """A worker task of the planner: ``{config, target, rtol, steady, decide}`` → :func:`capacity`'s
    data (:func:`steady_capacity`'s when ``steady``; ``decide``: see :func:`search`)."""
    config = SimConfig.build(**payload["config"])
    target, rtol, decide = payload.get("target", TARGET), payload.get("rtol", RTOL), payload.get("decide", False)
    if payload.get("steady"):
        return steady_capacity(config, target, rtol, decide=decide)
    return capacity(config, target, rtol, decide=decide)
