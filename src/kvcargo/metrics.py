"""Records → summary: latency percentiles, SLOs, goodput, utilisation, energy (reference §7).

Statistics follow the reference exactly: warm-up (the first 10% of completed requests by
arrival) is excluded from latency and SLO figures; percentiles interpolate linearly between
order statistics by the reference's formula (not numpy's); means are exact (``fsum``). Inter-token latencies are never
stored per token: every gap after a request's first is the difference of two consecutive step
ends of its decode instance, so the pooled sample is the step gaps weighted by how many steady
requests were in each step, plus each request's first gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from kvcargo._jit import kernel
from kvcargo.ced import replay_on_decode
from kvcargo.cost import silicon_cost_usd
from kvcargo.engine.cluster import EngineOutput
from kvcargo.engine.state import DONE, REJECTED
from kvcargo.engine.steplog import step_positions
from kvcargo.families import family_levers
from kvcargo.lever_metrics import lever_summary
from kvcargo.optical import die_areas, static_w
from kvcargo.stats import (
    PERCENTILES,
    ExactSum,
    Sample,
    described,
    exact_mean,
    exact_weighted_mean,
    percentiles,
    weighted_percentiles,
)

WARMUP_FRACTION = 0.1
STAGES = ("prefill_queue", "prefill", "kv_wait", "kv_transfer", "decode_queue", "decode")
STAGE_OWNER = {"prefill_queue": "prefill", "prefill": "prefill", "kv_wait": "kv-link",
               "kv_transfer": "kv-link", "decode_queue": "decode", "decode": "decode"}


# ------------------------------------------------------------------------------ percentiles


def describe(values: np.ndarray, prefix: str) -> dict[str, float]:
    """mean, p50, p90, p99 and max of a sample, keyed ``{prefix}_mean`` etc."""
    x = np.asarray(values, dtype=np.float64)
    return described(prefix, exact_mean(x), percentiles(x, PERCENTILES), float(x.max()) if len(x) else math.nan)


def describe_weighted(values: np.ndarray, weights: np.ndarray, prefix: str,
                      overwrite: bool = False) -> dict[str, float]:
    """As :func:`describe` for a sample where ``values[i]`` occurs ``weights[i]`` times (the same
    figures as the expanded sample's, bit for bit). ``overwrite``: the arrays may be reordered."""
    n = int(weights.sum())
    mean = exact_weighted_mean(values, weights)
    top = float(values[weights > 0].max()) if n else math.nan  # before the percentiles may reorder them
    return described(prefix, mean, weighted_percentiles(values, weights, PERCENTILES, overwrite), top)


# ------------------------------------------------------------------------------- the summary


def steady_requests(out: EngineOutput) -> np.ndarray:
    """Completed requests in arrival order, minus the warm-up (the first 10%)."""
    done = np.nonzero(out.status == DONE)[0]
    by_arrival = done[np.argsort(out.arrival[done], kind="stable")]
    return by_arrival[int(len(by_arrival) * WARMUP_FRACTION):]


def handoff_start(out: EngineOutput) -> np.ndarray:
    """Per request, when its hand-off could start: the first token, or the end of the prefill
    step when the first token comes from the decode side (CED replay on decode)."""
    return out.prefill_done if replay_on_decode(out.resolved.model) else out.first_token


def stage_times(out: EngineOutput, requests: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-request stage durations (absent stages are 0) of ``requests`` (default: all); they sum
    to the end-to-end latency. One stage at a time: a summary of millions holds one array."""
    return dict(_stage_times(out, requests))


def _stage_times(out: EngineOutput, requests: np.ndarray | None) -> Iterator[tuple[str, np.ndarray]]:
    def take(a: np.ndarray) -> np.ndarray:
        return a if requests is None else a[requests]

    def gap(end: np.ndarray, start: np.ndarray) -> np.ndarray:
        d = end - start
        return np.where(np.isnan(d), 0.0, d)

    start = take(handoff_start(out))
    prefill_start, kv_start, kv_ready, decode_start = (take(a) for a in (out.prefill_start, out.kv_start,
                                                                         out.kv_ready, out.decode_start))
    yield "prefill_queue", gap(prefill_start, take(out.arrival))
    yield "prefill", gap(start, prefill_start)
    # streamed layer by layer, a hand-off can start before the first token: its wait is 0
    # and only the part after the first token counts as transfer
    yield "kv_wait", np.maximum(gap(kv_start, start), 0.0)
    yield "kv_transfer", gap(kv_ready, np.fmax(kv_start, start))
    yield "decode_queue", gap(decode_start, np.where(np.isnan(kv_ready), start, kv_ready))
    yield "decode", gap(take(out.finish), decode_start)


def itl_sample(out: EngineOutput, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every token gap after the first token of ``requests``, as (values, multiplicities)."""
    if out.itl_runs is not None:
        from kvcargo.engine.sched_gaps import weighted

        return weighted(out.steps[:, 1], out.step_inst[:, 0], max(1, out.resolved.n_decode), *out.itl_runs,
                        requests, len(out.arrival))
    if out.itl_values is not None:
        spans = [out.itl_values[out.itl_offsets[r]:out.itl_offsets[r + 1]] for r in requests]
        values = np.concatenate(spans) if spans else np.zeros(0)
        return values, np.ones(len(values), dtype=np.int64)
    sel = requests[(out.output[requests] >= 2) & (out.first_step[requests] >= 0)]
    speculative = out.resolved.levers.draft is not None
    # a verify pass's tokens arrive together: one gap per pass, then zeros for the extra tokens
    steps = out.verify_passes[sel] + 1 if speculative else out.output[sel]
    values, weights = _token_gaps(*step_ends(out), max(1, out.resolved.n_decode),
                                  out.decode_inst[sel], out.first_step[sel], steps, out.first_token[sel])
    if speculative:
        values = np.append(values, 0.0)
        weights = np.append(weights, int(np.sum(out.output[sel] - steps)))
    return values, weights


def step_ends(out: EngineOutput) -> tuple[np.ndarray, np.ndarray]:
    """The decode steps' ends and instances: the step log's, or a folded log's (grouped by
    instance: the same gaps, so the same sample)."""
    if out.folded is None:
        return out.steps[:, 1], out.step_inst[:, 0]
    return out.folded.ends, out.folded.instances()


@kernel
def _token_gaps(ends, inst, n_inst, r_inst, r_first, r_output, r_first_token):
    """The step log (ends, instances, in time order) and the requests' first step ordinals →
    each request's first gap (weight 1), then every step's gap weighted by how many of the
    requests were in it after their first step."""
    index, start = step_positions(inst, n_inst)  # (instance, ordinal) → log position
    n_req = r_inst.shape[0]
    n_steps = inst.shape[0]
    values = np.empty(n_req + n_steps)
    weights = np.zeros(n_req + n_steps, dtype=np.int64)
    delta = np.zeros(n_steps + 1, dtype=np.int32)  # ± requests joining and leaving: |·| < 2^31
    for q in range(n_req):
        base = start[r_inst[q]]
        k = r_first[q]
        values[q] = ends[index[base + k]] - r_first_token[q]
        weights[q] = 1
        delta[base + k + 1] += 1  # from its second step ...
        delta[base + k + r_output[q] - 1] -= 1  # ... to its last
    level = 0
    for j in range(n_steps):
        level += delta[j]
        prev = j - 1
        if j > 0 and j > start[inst[index[j]]]:  # not an instance's first step
            values[n_req + j] = ends[index[j]] - ends[index[prev]]
            weights[n_req + j] = level
        else:
            values[n_req + j] = 0.0
    return values, weights


def latency_samples(out: EngineOutput, steady: np.ndarray) -> dict[str, np.ndarray]:
    """The samples behind the summary's ttft, tpot and handoff figures (seconds): TTFT and TPOT
    over the ``steady`` requests (TPOT for outputs of 2+ tokens), hand-off over every request
    whose KV landed."""
    multi = steady[out.output[steady] >= 2]
    return {
        "ttft": (out.first_token - out.arrival)[steady],
        "tpot": (out.finish[multi] - out.first_token[multi]) / (out.output[multi] - 1),
        "handoff": (out.kv_ready - handoff_start(out))[~np.isnan(out.kv_ready)],
    }


def slo(out: EngineOutput, steady: np.ndarray, lat: dict[str, np.ndarray]) -> dict[str, Any]:
    """Steady requests inside both SLOs, their share, and per second of their arrival window."""
    multi = out.output[steady] >= 2
    tpot = np.full(len(steady), np.nan)
    tpot[multi] = lat["tpot"]
    met = int(np.count_nonzero(slo_met(out, lat["ttft"], tpot, multi)))
    arrival = out.arrival[steady]
    first, last = (float(arrival.min()), float(arrival.max())) if len(steady) else (0.0, 0.0)
    return slo_figures(met, len(steady), first, last)


def slo_met(out: EngineOutput, ttft: np.ndarray, tpot: np.ndarray, multi: np.ndarray) -> np.ndarray:
    """Per request, whether it met both SLOs (``tpot``: NaN where the output is one token)."""
    cfg = out.resolved.config
    return (ttft <= cfg.ttft_slo) & (~multi | (tpot <= cfg.tpot_slo))


def slo_figures(met: int, steady: int, first: float, last: float) -> dict[str, Any]:
    """``met`` of ``steady`` requests inside both SLOs, their share, and per second of their
    arrival window (``first`` to ``last`` arrival)."""
    window = last - first if steady > 1 else 0.0
    return {"slo_met": met, "slo_attainment": met / steady if steady else math.nan,
            "goodput_rps": met / window if window > 0 else math.nan}


def probe_figures(out: EngineOutput) -> dict[str, float]:
    """The few summary figures a capacity probe keeps, equal to :func:`summarize`'s (a probe of a
    search needs a tenth of its work)."""
    steady = steady_requests(out)
    lat = latency_samples(out, steady)
    done = out.status == DONE
    H = out.horizon
    out_tokens = int(out.output[done].sum())
    return slo(out, steady, lat) | {
        "ttft_p99": percentiles(lat["ttft"], (99,))[0], "tpot_p99": percentiles(lat["tpot"], (99,))[0],
        "link_busy": 0.0 if out.resolved.colocated else _network_busy(out),
        "output_tok_per_s": out_tokens / H if H > 0 else math.nan,
        "e2e_mean": exact_mean((out.finish - out.arrival)[steady]), "requests": len(out.arrival)}


STEADY_SAMPLES = ("ttft", "tpot", "e2e")
SLICE = 1 << 16
"""Steady requests whose :func:`steady_figures` are formed at once."""


def steady_figures(out: EngineOutput, sel: np.ndarray) -> dict[str, np.ndarray]:
    """Per completed request of ``sel`` (in arrival order), what the summary takes of it when it
    is steady: its latencies (``tpot`` NaN for a one-token output), whether it met the SLOs, its
    stage times and what its token gaps need."""
    arrival, first, finish, output = (a[sel] for a in (out.arrival, out.first_token, out.finish, out.output))
    multi = output >= 2
    tpot = np.full(len(sel), np.nan)
    tpot[multi] = (finish[multi] - first[multi]) / (output[multi] - 1)
    ttft = first - arrival
    return {"arrival": arrival, "ttft": ttft, "tpot": tpot, "multi": multi, "e2e": finish - arrival,
            "met": slo_met(out, ttft, tpot, multi), "first_token": first, "output": output,
            "decode_inst": out.decode_inst[sel], "first_step": out.first_step[sel],
            **{"stage_" + k: v for k, v in _stage_times(out, sel)}}


class RequestFigures:
    """The summary's per-request figures, taken a slice of requests at a time (:meth:`take`):
    the whole run's at once (:meth:`of`), or a windowed run's as its requests settle
    (kvcargo.engine.window), the same figures bit for bit (samples and exact sums do not depend
    on the order or the cut of their values).

    Completed requests come in arrival order. The warm-up cut (the first 10% of the completed
    requests) is only known at the end, but it is at most ``zone`` (10% of all requests): the
    :func:`steady_figures` of the first ``zone`` completed requests are held and cut at the end
    (:meth:`close`), the later ones go straight into the samples and sums. ``gaps``: a windowed
    run's token-gap fold (kvcargo.engine.steplog.GapFold), which then takes the steady
    requests' token gaps too."""

    def __init__(self, res: Any, n: int, gaps: Any = None, limit: int | None = None) -> None:
        self.n, self.gaps = n, gaps
        self.zone = int(n * WARMUP_FRACTION)
        self.completed = self.rejected = self.output_tokens = self.steady = self.met = 0
        self.first_arrival, self.last_arrival = math.inf, -math.inf
        kw = {} if limit is None else {"limit": limit}
        self.samples = {k: Sample(**kw) for k in (*STEADY_SAMPLES, "handoff", "memory_wait")}
        self.sums = {k: ExactSum() for k in ("latency", "wire", "full", "link_wait", *STAGES)}
        self.moved = self.transit_bound = 0
        self.served = np.zeros(res.n_prefill, dtype=np.int64)
        self.held: list[dict[str, np.ndarray]] = []

    @classmethod
    def of(cls, out: EngineOutput) -> RequestFigures:
        """The figures of a whole run's records."""
        fig = cls(out.resolved, len(out.arrival))
        fig.take(out, _by_arrival(out))
        fig.close()
        return fig

    def take(self, out: EngineOutput, done: np.ndarray) -> None:
        """Take every request of ``out`` (a run's records, or a slice of them); ``done``: its
        completed ones, in arrival order."""
        self.completed += len(done)
        self.rejected += int(np.count_nonzero(out.status == REJECTED))
        self.output_tokens += int(out.output[done].sum())
        self.sums["latency"].add(out.finish[done] - out.arrival[done])
        landed = ~np.isnan(out.kv_ready)
        self.samples["handoff"].add((out.kv_ready - handoff_start(out))[landed])
        if out.resolved.config.kv_reserve == "at-transfer":
            asked = ~np.isnan(out.want_memory)
            self.samples["memory_wait"].add((out.reserved - out.want_memory)[asked])
        self.served += np.bincount(out.prefill_inst[out.prefill_inst >= 0], minlength=len(self.served))
        if not out.resolved.colocated:
            moved = ~np.isnan(out.kv_start)
            full = out.wire_bytes[moved]
            self.sums["wire"].add(full * out.send_fraction[moved])
            self.sums["full"].add(full)
            # streamed layer by layer, a hand-off's first slice can leave before the first token:
            # its wait is 0, as in the kv_wait stage
            self.sums["link_wait"].add(np.maximum(out.kv_start - handoff_start(out), 0.0)[moved])
            self.moved += int(np.count_nonzero(moved))
            self.transit_bound += int(np.count_nonzero(out.transit_bound[moved]))
        held = max(0, min(len(done), self.zone - (self.completed - len(done))))
        if held:
            self.held.append(steady_figures(out, done[:held]))
        for at in range(held, len(done), SLICE):  # a slice at a time: a run of millions holds no more
            self._steady(steady_figures(out, done[at:at + SLICE]))

    def _steady(self, f: dict[str, np.ndarray], gaps: bool = True) -> None:
        """Add steady requests' figures (``gaps``: their token gaps too)."""
        self.steady += len(f["ttft"])
        for k in ("ttft", "e2e"):
            self.samples[k].add(f[k])
        self.samples["tpot"].add(f["tpot"][f["multi"]])
        for k in STAGES:
            self.sums[k].add(f["stage_" + k])
        self.met += int(np.count_nonzero(f["met"]))
        if len(f["arrival"]):
            self.first_arrival = min(self.first_arrival, float(f["arrival"].min()))
            self.last_arrival = max(self.last_arrival, float(f["arrival"].max()))
        if gaps and self.gaps is not None:
            self.gaps.spans(*_gap_columns(f))

    def zone_closed(self) -> bool:
        """Whether every held request has been taken (their token gaps are then known)."""
        return self.completed >= self.zone

    def held_gaps(self) -> tuple[np.ndarray, ...]:
        """The held requests' :func:`_gap_columns`."""
        cols = [_gap_columns(f) for f in self.held]
        return tuple(np.concatenate([c[i] for c in cols]) if cols else np.zeros(0) for i in range(4))

    def close(self) -> None:
        """Cut the warm-up off the held requests and add the rest (the run has ended)."""
        cut = int(self.completed * WARMUP_FRACTION)
        held = {}
        for k in list(self.held[0]) if self.held else []:  # a column at a time, each freed once joined
            held[k] = np.concatenate([f.pop(k) for f in self.held])[cut:]
        self.held = []
        if self.gaps is not None:  # the held requests' token gaps go in with the steps they reach
            self.gaps.close(*(_gap_columns(held) if held else (np.zeros(0),) * 4))
        if held:
            self._steady(held, gaps=False)

    def describe(self, name: str) -> dict[str, float]:
        """:func:`describe` of one sample."""
        return self.samples[name].describe(name)


def _gap_columns(f: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Of steady requests' figures, those with token gaps: their decode instance, first step,
    output and first token (as :func:`itl_sample` selects them)."""
    sel = f["multi"] & (f["first_step"] >= 0)
    return f["decode_inst"][sel], f["first_step"][sel], f["output"][sel], f["first_token"][sel]


def _by_arrival(out: EngineOutput) -> np.ndarray:
    """Completed requests in arrival order."""
    done = np.nonzero(out.status == DONE)[0]
    return done[np.argsort(out.arrival[done], kind="stable")]


def summarize(out: EngineOutput) -> dict[str, Any]:
    """The run's summary (SI units: seconds, joules, watts, bytes)."""
    res = out.resolved
    cfg = res.config
    H = out.horizon
    fig = out.figures if out.figures is not None else RequestFigures.of(out)
    n_done = fig.completed
    s: dict[str, Any] = {
        "requests": fig.n,
        "completed": n_done,
        "rejected": fig.rejected,
        "horizon_s": H,
        "steady_requests": fig.steady,
    }
    s |= fig.describe("ttft") | fig.describe("tpot")
    if fig.gaps is not None:
        s |= fig.gaps.sample.describe("itl")
    else:
        s |= describe_weighted(*itl_sample(out, steady_requests(out)), "itl", overwrite=True)
    s |= fig.describe("e2e")
    handoff = fig.describe("handoff")
    s |= handoff
    if cfg.send == "layerwise":  # the same quantity, named for what streaming changes
        s |= {"exposed" + k.removeprefix("handoff"): v for k, v in handoff.items()}
    if cfg.kv_reserve == "at-transfer":
        s |= fig.describe("memory_wait")

    out_tokens = fig.output_tokens
    s |= slo_figures(fig.met, fig.steady, fig.first_arrival, fig.last_arrival) | {
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / H if H > 0 else math.nan,
        "req_per_s": n_done / H if H > 0 else math.nan,
    }
    s |= _stages(out, fig, s["e2e_mean"])
    s |= _link(out, fig)
    s |= _energy(out, out_tokens)
    s["instances"] = _instances(out, fig)
    s |= _hotspot(s, res.colocated)
    s |= _cost(out, s["output_tok_per_s"])
    if out.levers:
        s |= out.levers
        if "swap_J" in out.levers:
            s["share_swap"] = out.swap_j / s["energy_j"]
    s |= lever_summary(out, s)
    latency = fig.sums["latency"].value()
    s["littles_population"] = latency / H if H > 0 else math.nan
    s["littles_expected"] = s["req_per_s"] * (latency / n_done if n_done else math.nan)
    s["link_gbytes_per_s"] = s["link_gbps"]  # GB/s (bytes, not bits); "link_gbps" stays as a deprecated alias
    s["clipped_prompts"] = res.workload.clipped_prompts
    s["clipped_outputs"] = res.workload.clipped_outputs
    return s


def _stages(out: EngineOutput, fig: RequestFigures, e2e: float) -> dict[str, float]:
    """Mean stage times of the steady requests and their shares of ``e2e`` (their mean latency)."""
    means = {k: fig.sums[k].value() / fig.steady if fig.steady else math.nan for k in STAGES}
    s: dict[str, float] = {}
    for k in STAGES:
        s[f"stage_{k}_s"] = means[k]
        s[f"share_{k}"] = means[k] / e2e if e2e else math.nan
    if family_levers(out.resolved):  # the companion's levers: one division (reference §7's wording)
        s["kv_share_of_e2e"] = (means["kv_wait"] + means["kv_transfer"]) / e2e if e2e else math.nan
    else:  # the reference's published figures: the two shares added
        s["kv_share_of_e2e"] = s["share_kv_wait"] + s["share_kv_transfer"]
    return s


def _link(out: EngineOutput, fig: RequestFigures) -> dict[str, Any]:
    res = out.resolved
    H = out.horizon
    if res.colocated:
        return {"transfers": 0, "link_busy": 0.0, "link_bytes": 0.0, "link_gbps": 0.0,
                "link_mean_wait_s": 0.0, "link_j": 0.0, "transit_j": 0.0, "link_j_per_request": 0.0,
                "transit_bound_share": 0.0, "prefix_saved_bytes": 0.0, "prefix_hit_rate": 0.0}
    wire_bytes = fig.sums["wire"].value()
    full_bytes = fig.sums["full"].value()
    n = out.transfers
    return {
        "transfers": n,
        "link_busy": _network_busy(out),
        "link_bytes": wire_bytes,
        "link_gbps": wire_bytes / H / 1e9 if H > 0 else math.nan,
        "link_mean_wait_s": fig.sums["link_wait"].value() / n if n else 0.0,
        "link_j": out.link_j,
        "transit_j": out.transit_j,
        "link_j_per_request": (out.link_j + out.transit_j) / max(1, n),
        "transit_bound_share": (fig.transit_bound / fig.moved if fig.moved else math.nan) if n else 0.0,
        "prefix_saved_bytes": full_bytes - wire_bytes,
        "prefix_hit_rate": 1 - wire_bytes / full_bytes if full_bytes else 0.0,
    }


def _network_busy(out: EngineOutput) -> float:
    """Share of time the network's channels carry KV: the cluster link's (reference), or with
    ``--topology nic`` the prefill instances' NICs (every transfer leaves through one)."""
    res = out.resolved
    if out.horizon <= 0:
        return math.nan
    if res.config.topology == "nic":
        tx = slice(1, 1 + res.n_prefill)
        return float(out.port_busy[tx].sum()) / (float(out.port_channels[tx].sum()) * out.horizon)
    return out.link_busy_s / (res.channels * out.horizon)


def _pools(out: EngineOutput) -> list[tuple[str, Any]]:
    """(name, pool) per instance, in stats-row order."""
    res = out.resolved
    if res.colocated:
        return [(f"colocated-{i}", res.decode_pool) for i in range(res.n_decode)]
    return ([(f"prefill-{i}", res.prefill_pool) for i in range(res.n_prefill)]
            + [(f"decode-{i}", res.decode_pool) for i in range(res.n_decode)])


def _engine_static_j(out: EngineOutput) -> list[float]:
    """Per instance: its optical transform engine's static energy P_opt · H (0 without one)."""
    return [static_w(pool.device.ft_engine, pool.n) * out.horizon if pool.device.ft_engine else 0.0
            for _, pool in _pools(out)]


def _energy(out: EngineOutput, out_tokens: int) -> dict[str, float]:
    """Energy totals, grouped as §7 states (it decides the last bit): running sums over the
    instances in creation order of static ``(idle·n)·H``, compute J and memory J, then
    ``((static + compute) + memory) + link`` (+ in-transit)."""
    H = out.horizon
    totals = out.totals
    static = sum(pool.idle_w * H for _, pool in _pools(out))
    compute = sum(totals.compute_j.tolist())
    memory = sum(totals.memory_j.tolist())
    scale_up = sum(row[1] for row in out.lever_stats)  # TP/PP/EP traffic inside instances
    optical: dict[str, float] = {}
    total = static + compute + memory + out.link_j
    if any(pool.device.ft_engine for _, pool in _pools(out)):  # levers-mixers §3.5, in that order
        o_static, o_conv = sum(_engine_static_j(out)), sum(out.engine_totals.conversion_j.tolist())
        total = total + o_static + o_conv
        optical = {"energy_optical_static_j": o_static, "energy_conversions_j": o_conv}
    total = total + out.transit_j
    if out.swap_j:
        total += out.swap_j
    total += scale_up  # §7: optical static and conversions, in-transit, swap, then scale-up J

    def share(x: float) -> float:  # NaN when nothing ran (every request rejected at time 0)
        return x / total if total else math.nan

    if optical:
        optical |= {"share_optical_static": share(optical["energy_optical_static_j"]),
                    "share_optical_conversions": share(optical["energy_conversions_j"])}
    return optical | {
        "energy_scale_up_j": scale_up, "share_scale_up": share(scale_up),
        "energy_j": total,
        "energy_static_j": static, "energy_compute_j": compute, "energy_memory_j": memory,
        "energy_link_j": out.link_j, "energy_transit_j": out.transit_j,
        "share_static": share(static), "share_compute": share(compute),
        "share_memory": share(memory), "share_link": share(out.link_j),
        "share_transit": share(out.transit_j),
        "j_per_token": total / out_tokens if out_tokens else math.nan,
        "tokens_per_j": out_tokens / total if total else math.nan,
        "avg_power_w": total / H if H > 0 else math.nan,
    }


def _instances(out: EngineOutput, fig: RequestFigures) -> list[dict[str, Any]]:
    H = out.horizon
    rows = []
    n_pre = out.resolved.n_prefill
    engine_j = _engine_static_j(out)
    engines = any(engine_j)
    pools = _pools(out)
    # per instance at once: requests prefilled, decode steps logged and their batch sizes (integers
    # summed exactly as floats, so the means are numpy's of each instance's batches)
    served = fig.served.tolist()
    if out.folded is None:
        step_rows = np.bincount(out.step_inst[:, 0], minlength=len(pools) - n_pre).tolist()
        batch_sum = np.bincount(out.step_inst[:, 0], weights=out.step_inst[:, 1],
                                minlength=len(pools) - n_pre).tolist()
    else:  # the same integers, summed exactly
        step_rows, batch_sum = out.folded.rows.tolist(), out.folded.batch.astype(np.float64).tolist()
    totals, kv_held = out.totals, out.kv_held_totals  # named per-instance columns of the record
    for i, (name, pool) in enumerate(pools):
        busy, flops, nbytes, e_c, e_m = (totals.busy_s[i], totals.flops[i], totals.bytes[i], totals.compute_j[i],
                                         totals.memory_j[i])
        steps = int(totals.steps[i])
        if i < n_pre:  # a prefill instance (none when colocated)
            mean_batch = served[i] / steps if steps else 0.0
        else:
            k = step_rows[i - n_pre]
            mean_batch = batch_sum[i - n_pre] / k if k else 0.0
        rows.append({
            "name": name, "device": pool.device.key, "devices": pool.n, "steps": steps,
            "busy": busy / H if H > 0 else math.nan,
            "mfu": flops / (H * pool.device.peak_flops * pool.n) if H > 0 else math.nan,
            "mbu": nbytes / (H * pool.device.hbm_bw * pool.n) if H > 0 else math.nan,
            "mean_batch": mean_batch,
            "avg_power_w": pool.idle_w + (e_c + e_m) / H if H > 0 else math.nan,
        })
        if engines:  # levers-mixers §3.5
            conv, opt_flops, opt_busy = (float(column[i]) for column in out.engine_totals)
            rows[-1] |= {
                "optical_bound_frac": opt_busy / busy if busy > 0 else 0.0,
                "optical_flops": opt_flops, "conversion_j": conv, "optical_static_j": engine_j[i],
                "avg_power_w": (pool.idle_w * H + e_c + e_m + engine_j[i] + conv) / H if H > 0 else math.nan,
            }
        if i < n_pre and out.resolved.config.kv_reserve == "at-transfer":
            rows[-1]["kv_held_mean"] = float(kv_held.integral[i]) / H if H > 0 else math.nan
            rows[-1]["kv_held_peak"] = float(kv_held.peak[i])
    return rows


def _hotspot(s: dict[str, Any], colocated: bool) -> dict[str, Any]:
    """The largest stage other than decoding itself, the pool that owns it, its busiest member."""
    stage = max((k for k in STAGES if k != "decode"), key=lambda k: s[f"stage_{k}_s"])
    owner = STAGE_OWNER[stage]
    if colocated and owner != "kv-link":
        owner = "colocated"
    if owner == "kv-link":
        where = "kv-link"
    else:
        members = [r for r in s["instances"] if r["name"].startswith(owner)]
        where = max(members, key=lambda r: r["busy"])["name"]
    return {"hotspot_stage": stage, "hotspot_pool": owner, "hotspot": where}


def _cost(out: EngineOutput, tok_per_s: float) -> dict[str, float]:
    dollars = 0.0
    area = 0.0
    for _, pool in _pools(out):
        die = silicon_cost_usd(pool.device)
        if die is None:
            return {"silicon_usd": math.nan, "tok_per_s_per_kusd": math.nan, "silicon_mm2": math.nan}
        dollars += pool.n * die
        area += pool.n * sum(die_areas(pool.device))
    return {"silicon_usd": dollars, "tok_per_s_per_kusd": 1000 * tok_per_s / dollars, "silicon_mm2": area}
