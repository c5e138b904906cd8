"""The plan: which prefill:decode split, devices per instance, devices and link to buy.

The search space is every combination of prefill instances P and decode instances D, a device
and devices per instance for each pool, and a link (plus, optionally, colocated clusters of N
instances) that fits a budget in GPUs, dollars (catalog ``price_usd`` per device) or provisioned
power (per-device power limit: the cap, else TDP). Each candidate's *capacity* is the highest
rate it sustains with ≥ target of requests inside both SLOs (the search of
:mod:`~kvcargo.planner.capacity`).

Analytic pruning before simulating: a candidate whose model does not fit is dropped; with a
target rate, one whose optimistic capacity (``1.5 ×`` its analytic bound, the search's first
bracket) is below the target is dropped; the rest are simulated in waves, most promising first
(optimistic capacity per unit of cost), and after each wave a candidate is dropped when an
already simulated one costs no more and sustains at least its optimistic capacity (it cannot
reach the Pareto front). Waves have a fixed size, so the result does not depend on the backend or
the number of workers.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kvcargo import catalog as catalog_mod
from kvcargo.config import SimConfig, load_workload, without_handoff
from kvcargo.cost import Pool, kv_capacity
from kvcargo.errors import KvcargoError
from kvcargo.planner.backends import Backend, InlineBackend, TaskError
from kvcargo.planner.capacity import (
    GROWTH,
    RTOL,
    STEADY_LIFETIMES,
    TARGET,
    capacity_task,
    ceilings,
    check_target,
)
from kvcargo.report.command import command_line
from kvcargo.report.levers import lever_config
from kvcargo.report.text import count
from kvcargo.workload import Workload

CostKind = Literal["gpus", "usd", "power"]
COST_KINDS: tuple[str, ...] = ("gpus", "usd", "power")
COST_LABEL = {"gpus": "GPUs", "usd": "$", "power": "W"}
WAVE = 32
"""Candidates simulated per wave (fixed, so results do not depend on the backend)."""
OPTIMISM = 3.0
"""Before anything is simulated, a candidate may sustain up to this multiple of each ceiling."""
SAFETY = 1.25
"""Margin on the largest capacity / ceiling ratio simulated so far, per resource (the pruning
factors after a wave). Short runs at high rates absorb a decode backlog, so simulated capacity can
exceed the decode ceiling by 2x; the prefill ceiling holds within ~1.25x."""
MAX_CANDIDATES = 50_000
MAX_TP = 8
SEARCHED = ("mode", "prefill", "decode", "instances", "prefill_device", "decode_device",
            "prefill_devices_per_instance", "decode_devices_per_instance", "link")


@dataclass(frozen=True)
class Budget:
    """Upper limits; every one given applies."""

    gpus: int | None = None
    usd: float | None = None
    power_w: float | None = None

    def __post_init__(self) -> None:
        if self.gpus is None and self.usd is None and self.power_w is None:
            raise KvcargoError("plan needs a budget: --gpus N, --usd DOLLARS or --power-w WATTS")
        for name, v in (("--gpus", self.gpus), ("--usd", self.usd), ("--power-w", self.power_w)):
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise KvcargoError(f"impossible budget: {name} must be a positive number, got {v!r}")

    def allows(self, gpus: int, usd: float | None, power: float) -> bool:
        return ((self.gpus is None or gpus <= self.gpus)
                and (self.usd is None or (usd is not None and usd <= self.usd))
                and (self.power_w is None or power <= self.power_w))

    @property
    def default_cost(self) -> CostKind:
        return "gpus" if self.gpus is not None else "usd" if self.usd is not None else "power"

    def describe(self) -> str:
        parts = []
        if self.gpus is not None:
            parts.append(count(self.gpus, "GPU"))
        if self.usd is not None:
            parts.append(f"${self.usd:,.0f}")
        if self.power_w is not None:
            parts.append(f"{self.power_w:,.0f} W")
        return ", ".join(parts)


@dataclass(frozen=True)
class Space:
    """What is searched (each list non-empty)."""

    prefill_devices: tuple[str, ...]
    decode_devices: tuple[str, ...]
    tp: dict[str, tuple[int, ...]]
    """Devices per instance to try, per device kind (prefill pool)."""
    decode_tp: dict[str, tuple[int, ...]]
    links: tuple[str, ...]
    prefill_counts: tuple[int, ...]
    decode_counts: tuple[int, ...]
    disagg: bool = True
    colocated: bool = False
    colocated_counts: tuple[int, ...] = ()
    formats: tuple[str, ...] = ()
    """Storage formats to try for weights and KV together (none: the base configuration's)."""
    splits: bool = False
    """Also try every tp × pp split of each instance's devices (pipeline stages dividing the layers)."""
    w8a8: bool = False
    """Each format also computes in it (the calibrated model measures no weight-only GEMMs: its
    fp8 is W8A8)."""


@dataclass
class Candidate:
    """One configuration of the search space, its cost and (once simulated) its capacity."""

    config: SimConfig
    label: str
    gpus: int
    usd: float | None
    power_w: float
    bound: float = math.nan
    bound_by: str = ""
    ceilings: dict[str, float] = field(default_factory=dict)
    """Per-resource ceilings of the pools (req/s)."""
    optimistic: float = math.nan
    """The capacity assumed reachable when the candidate was pruned."""
    steady: bool = True
    capacity: float | None = None
    simulations: int = 0
    status: str = "candidate"
    """candidate → over budget | does not fit | pruned: below target | pruned: dominated |
    simulated | failed."""
    error: str = ""
    front: bool = False

    def cost(self, kind: CostKind) -> float:
        value = {"gpus": self.gpus, "usd": self.usd, "power": self.power_w}[kind]
        return math.inf if value is None else float(value)

    def row(self) -> dict[str, Any]:
        c = self.config
        per_gpu = self.capacity / self.gpus if self.capacity is not None else None
        per_kusd = self.capacity / self.usd * 1000 if self.capacity is not None and self.usd else None
        return {
            "label": self.label, "mode": c.mode,
            "prefill": c.prefill if c.mode == "disagg" else None,
            "decode": c.decode if c.mode == "disagg" else None,
            "instances": c.colocated_instances if c.mode == "colocated" else None,
            "prefill_device": c.prefill_device or c.device,
            "prefill_devices_per_instance": c.prefill_devices_per_instance or c.devices_per_instance,
            "decode_device": c.decode_device or c.device,
            "decode_devices_per_instance": c.decode_devices_per_instance or c.devices_per_instance,
            "link": c.link if c.mode == "disagg" else None,
            "gpus": self.gpus, "usd": self.usd, "power_w": self.power_w,
            "bound": self.bound, "bound_by": self.bound_by, "optimistic": self.optimistic,
            "capacity": self.capacity, "capacity_per_gpu": per_gpu, "capacity_per_kusd": per_kusd,
            "simulations": self.simulations, "steady": self.steady, "status": self.status,
            "error": self.error, "front": self.front,
        }


@dataclass
class PlanResult:
    base: SimConfig
    budget: Budget
    cost: CostKind
    target_rate: float | None
    target: float
    rtol: float
    candidates: list[Candidate]
    front: list[Candidate]
    best: Candidate | None
    most_efficient: Candidate | None
    counts: dict[str, int]
    simulations: int
    wall_s: float
    backend: str
    notes: list[str] = field(default_factory=list)
    optimism: dict[str, float] = field(default_factory=dict)
    """The final pruning factors: capacity assumed reachable per unit of each ceiling."""

    def commands(self, cand: Candidate | None = None) -> dict[str, str]:
        cand = cand or self.best
        if cand is None or cand.capacity is None:
            return {}
        cfg = cand.config
        cap_flags = command_line(cfg, exclude=("rate",))
        sim = command_line(cfg.replace(rate=cand.capacity))
        return {"capacity": f"kvcargo capacity {cap_flags}".rstrip(),
                "simulate": f"kvcargo simulate {sim}".rstrip()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.base.model_dump(),
            "budget": {"gpus": self.budget.gpus, "usd": self.budget.usd, "power_w": self.budget.power_w},
            "cost": self.cost, "target_rate": self.target_rate, "target": self.target, "rtol": self.rtol,
            "counts": self.counts, "simulations": self.simulations, "wall_s": self.wall_s,
            "backend": self.backend, "optimism": self.optimism,
            "front": [c.row() for c in self.front],
            "best": self.best.row() if self.best else None,
            "most_efficient": self.most_efficient.row() if self.most_efficient else None,
            "commands": self.commands(),
            "candidates": [c.row() for c in self.candidates],
            "notes": self.notes,
        }


# ------------------------------------------------------------------------- helpers


def parse_list(text: str | None, kind: type = str, name: str = "") -> tuple[Any, ...] | None:
    """``"h100,a100"`` → ("h100", "a100"); None stays None."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise KvcargoError(f"{name} is empty")
    try:
        values = tuple(kind(t) for t in items)
    except ValueError:
        raise KvcargoError(f"{name}: expected a comma-separated list of {kind.__name__}s, got {text!r}") from None
    if len(set(values)) != len(values):
        raise KvcargoError(f"{name} lists a value twice ({text!r})")
    return values


def auto_tp(model: catalog_mod.Model, device: catalog_mod.Device) -> tuple[int, ...]:
    """Devices per instance to try by default: the smallest power of two that fits and its double."""
    for n in (1, 2, 4, 8):
        if kv_capacity(model, Pool(device, n)) > 0:
            return tuple(sorted({n, min(MAX_TP, 2 * n)}))
    return ()


def label(config: SimConfig) -> str:
    c = config
    if c.mode == "colocated":
        return f"colocated {c.colocated_instances}x {c.device}x{c.devices_per_instance}"
    pd, pn = c.prefill_device or c.device, c.prefill_devices_per_instance or c.devices_per_instance
    dd, dn = c.decode_device or c.device, c.decode_devices_per_instance or c.devices_per_instance
    levers = lever_config(c.model_dump())
    return f"{c.prefill}P{c.decode}D {pd}x{pn} -> {dd}x{dn} {c.link}" + (f" ({levers})" if levers else "")


def _price(cat, key: str) -> float | None:
    return cat.device(key).price_usd


def _cap_w(cat, key: str, *caps: float | None) -> float:
    dev = cat.device(key)
    limits = [c for c in caps if c is not None]
    return min([dev.tdp_w, *limits])


# -------------------------------------------------------------------- the search space


def build_space(base: SimConfig, given: set[str], budget: Budget, *, devices: tuple[str, ...] | None = None,
                tp: tuple[int, ...] | None = None, links: tuple[str, ...] | None = None,
                max_instances: int = 32, with_colocated: bool = False, formats: tuple[str, ...] | None = None,
                splits: bool = False) -> Space:
    """The lists to combine: plan options, else fixed simulate flags, else defaults."""
    cat = catalog_mod.load(base.catalog)
    model = cat.model(base.model)
    if max_instances < 1:
        raise KvcargoError(f"--max-instances must be >= 1, got {max_instances}")
    if devices is not None and {"prefill_device", "decode_device"} & given == {"prefill_device", "decode_device"}:
        raise KvcargoError("--devices conflicts with --prefill-device and --decode-device; drop one")
    if links is not None and "link" in given:
        raise KvcargoError("--links conflicts with --link; give one")
    if tp is not None and given & {"devices_per_instance", "prefill_devices_per_instance",
                                   "decode_devices_per_instance"}:
        raise KvcargoError("--tp conflicts with --devices-per-instance; give one")
    devs = devices or (base.device,)
    for d in devs:
        cat.device(d)
    pre_devs = (base.prefill_device,) if "prefill_device" in given else devs
    dec_devs = (base.decode_device,) if "decode_device" in given else devs
    link_keys = links or (base.link,)
    for lk in link_keys:
        cat.link(lk)
    layout_flags = given & {"tp", "pp", "prefill_tp", "prefill_pp", "decode_tp", "decode_pp"}
    if splits and layout_flags:
        raise KvcargoError(f"--splits searches the layouts: drop --{sorted(layout_flags)[0].replace('_', '-')}")
    valid = ("bf16", "fp8", "int8", "int4", "fp4")
    if formats and (bad := [f for f in formats if f not in valid]):
        raise KvcargoError(f"unknown format {bad[0]!r} in --formats; valid choices: {', '.join(valid)}")
    if formats and given & {"weight_format", "kv_format"}:
        raise KvcargoError("--formats conflicts with --weight-format/--kv-format; give one")
    w8a8 = base.cost_model == "calibrated" and bool(formats)
    if w8a8 and (bad := [f for f in formats if f not in ("bf16", "fp8")]):
        raise KvcargoError(f"--cost-model calibrated has measured bf16 and fp8 kernels only, not {bad[0]}: "
                           "--formats bf16,fp8, or --cost-model roofline to compare formats")
    if w8a8 and "compute_format" in given:
        raise KvcargoError("--formats sets the compute format too under --cost-model calibrated (fp8 is W8A8): "
                           "drop --compute-format")
    if tp is not None and any(n < 1 for n in tp):
        raise KvcargoError(f"--tp values must be >= 1, got {tp}")

    def tps(dev: str, pool_flag: str) -> tuple[int, ...]:
        if pool_flag in given:
            return (getattr(base, pool_flag),)
        if "devices_per_instance" in given:
            return (base.devices_per_instance,)
        if tp is not None:
            return tp
        return auto_tp(model, cat.device(dev))

    ptp = {d: tps(d, "prefill_devices_per_instance") for d in set(pre_devs) | set(devs)}
    dtp = {d: tps(d, "decode_devices_per_instance") for d in set(dec_devs) | set(devs)}
    mode_fixed = "mode" in given
    disagg = not (mode_fixed and base.mode == "colocated")
    colocated = with_colocated or (mode_fixed and base.mode == "colocated")
    limit = max_instances
    if budget.gpus is not None:
        limit = min(limit, budget.gpus)
    counts = tuple(range(1, limit + 1))
    pc = (base.prefill,) if "prefill" in given else counts
    dc = (base.decode,) if "decode" in given else counts
    cc = (base.instances,) if "instances" in given and base.instances else counts
    return Space(tuple(pre_devs), tuple(dec_devs), ptp, dtp, tuple(link_keys), pc, dc, disagg, colocated, cc,
                 tuple(formats or ()), splits, w8a8)


def enumerate_candidates(base: SimConfig, space: Space, budget: Budget | None) -> list[Candidate]:
    """Every combination within the budget (all of them for ``None``), cheapest first."""
    cat = catalog_mod.load(base.catalog)
    fields = base.model_dump()
    for k in (*SEARCHED, "device", "devices_per_instance", "rate"):
        fields.pop(k, None)
    out: list[Candidate] = []

    def within(gpus: int, usd: float | None, power: float) -> bool:
        return budget is None or budget.allows(gpus, usd, power)

    def add(changes: dict[str, Any], gpus: int, usd: float | None, power: float) -> None:
        if len(out) >= MAX_CANDIDATES:
            raise KvcargoError(f"the search space has more than {MAX_CANDIDATES:,} candidates; "
                               "narrow it (--devices, --tp, --links, --max-instances, a smaller budget)")
        kept = without_handoff(fields) if changes["mode"] == "colocated" else fields
        for variant in lever_variants(space, cat.model(base.model).layers, changes):
            cfg = SimConfig.build(**{**kept, **variant})
            out.append(Candidate(cfg, label(cfg), gpus, usd, power))

    if space.disagg:
        for pdev in space.prefill_devices:
            for ddev in space.decode_devices:
                pp, dp = _price(cat, pdev), _price(cat, ddev)
                pw = _cap_w(cat, pdev, base.power_cap, base.prefill_power_cap)
                dw = _cap_w(cat, ddev, base.power_cap, base.decode_power_cap)
                for ptp, dtp, p, d in itertools.product(space.tp[pdev], space.decode_tp[ddev],
                                                        space.prefill_counts, space.decode_counts):
                    gpus = p * ptp + d * dtp
                    usd = p * ptp * pp + d * dtp * dp if pp is not None and dp is not None else None
                    power = p * ptp * pw + d * dtp * dw
                    if not within(gpus, usd, power):
                        continue
                    for lk in space.links:
                        add({"mode": "disagg", "device": pdev, "devices_per_instance": ptp,
                             "prefill": p, "decode": d,
                             "decode_device": ddev if ddev != pdev else None,
                             "decode_devices_per_instance": dtp if dtp != ptp else None,
                             "link": lk}, gpus, usd, power)
    if space.colocated:
        for dev in dict.fromkeys((*space.prefill_devices, *space.decode_devices)):
            price = _price(cat, dev)
            w = _cap_w(cat, dev, base.power_cap)
            for n_tp in space.tp.get(dev, ()):
                for n in space.colocated_counts:
                    gpus = n * n_tp
                    usd = gpus * price if price is not None else None
                    if not within(gpus, usd, gpus * w):
                        continue
                    add({"mode": "colocated", "device": dev, "devices_per_instance": n_tp, "instances": n},
                        gpus, usd, gpus * w)
    out.sort(key=lambda c: (c.gpus, c.usd if c.usd is not None else math.inf, c.power_w, c.label))
    return out


def lever_variants(space: Space, layers: int, changes: dict[str, Any]) -> list[dict[str, Any]]:
    """A candidate in every storage format and (with ``splits``) every tp × pp split searched."""
    formats = [{"weight_format": f, "kv_format": f, **({"compute_format": f} if space.w8a8 else {})}
               for f in space.formats] or [{}]
    if not space.splits:
        return [{**changes, **f} for f in formats]

    def splits(n: int) -> list[tuple[int, int]]:
        return [(n // pp, pp) for pp in range(1, n + 1) if n % pp == 0 and layers % pp == 0]

    if changes["mode"] == "colocated":
        layouts = [{"tp": tp, "pp": pp} for tp, pp in splits(changes["devices_per_instance"])]
    else:
        pn = changes["devices_per_instance"]
        dn = changes["decode_devices_per_instance"] or pn
        layouts = [{"prefill_tp": a, "prefill_pp": b, "decode_tp": c, "decode_pp": d}
                   for (a, b), (c, d) in itertools.product(splits(pn), splits(dn))]
    return [{**changes, **f, **lay} for f in formats for lay in layouts]


def require_prices(base: SimConfig, space: Space) -> None:
    """Every device searched needs a catalog price when dollars are the budget or the cost."""
    cat = catalog_mod.load(base.catalog)
    unpriced = [k for k in dict.fromkeys((*space.prefill_devices, *space.decode_devices))
                if cat.device(k).price_usd is None]
    if unpriced:
        raise KvcargoError(f"dollars need a price for every device searched; no price_usd in the catalog for "
                           f"{', '.join(unpriced)} (add one with --catalog, or narrow --devices)")


def impossible(base: SimConfig, space: Space, budget: Budget) -> KvcargoError:
    """The error for a budget that no candidate fits, naming what the smallest one needs."""
    smallest = replace(space, links=space.links[:1], prefill_counts=space.prefill_counts[:1],
                       decode_counts=space.decode_counts[:1], colocated_counts=space.colocated_counts[:1])
    cands = enumerate_candidates(base, smallest, None)
    if not cands:
        return KvcargoError(f"impossible budget ({budget.describe()}): the search space is empty "
                            "(no devices per instance fit the model; give --tp)")
    need = []
    for kind, fmt in (("gpus", lambda x: count(round(x), "GPU")), ("usd", "${:,.0f}".format),
                      ("power", "{:,.0f} W".format)):
        lowest = min(c.cost(kind) for c in cands)  # type: ignore[arg-type]
        if math.isfinite(lowest):
            need.append(fmt(lowest))
    return KvcargoError(f"impossible budget ({budget.describe()}): the smallest configuration searched "
                        f"({cands[0].label}) needs {', '.join(need)}")


# --------------------------------------------------------------------------------- plan


def plan(base: SimConfig, budget: Budget, space: Space, *, target_rate: float | None = None,
         target: float = TARGET, rtol: float = RTOL, cost: CostKind | None = None,
         backend: Backend | None = None, progress: Callable[[int, int], None] | None = None,
         wave: int = WAVE, steady: bool = True) -> PlanResult:
    """Search the space, prune with analytic bounds, simulate the rest; the Pareto front.

    ``steady``: search each candidate again with more requests when its answer came from a run
    shorter than a few request lifetimes (a short run at a high rate absorbs a backlog it could
    not sustain); its configuration then carries the request count used.
    """
    t0 = time.perf_counter()
    check_target(target, rtol)
    if target_rate is not None and not (target_rate > 0 and math.isfinite(target_rate)):
        raise KvcargoError(f"target rate must be positive, got {target_rate!r}")
    cost = cost or budget.default_cost
    if cost not in COST_KINDS:
        raise KvcargoError(f"unknown cost {cost!r}; valid choices: {', '.join(COST_KINDS)}")
    backend = backend or InlineBackend()
    if budget.usd is not None or cost == "usd":
        require_prices(base, space)
    cands = enumerate_candidates(base, space, budget)
    if not cands:
        raise impossible(base, space, budget)
    counts = {"candidates": len(cands), "do_not_fit": 0, "below_target": 0, "dominated": 0,
              "simulated": 0, "failed": 0}
    alive: list[Candidate] = []
    workload = shared_workload(cands[0].config)
    for c in cands:
        try:
            ceil = ceilings(c.config, workload)
        except KvcargoError as exc:
            c.status, c.error = "does not fit", str(exc)
            counts["do_not_fit"] += 1
            continue
        c.bound, c.bound_by = ceil.bound, ceil.bound_by
        c.ceilings = ({"colocated": ceil.colocated} if ceil.mode == "colocated" else
                      {"prefill": ceil.prefill, "decode": ceil.decode, "link": ceil.link})
        alive.append(c)
    if not alive:
        raise KvcargoError(f"impossible budget ({budget.describe()}): the model does not fit any configuration "
                           f"it allows ({cands[0].error})")
    alive.sort(key=lambda c: (-c.bound / c.cost(cost), -c.bound, c.cost(cost), c.label))
    done: list[Candidate] = []
    total, finished = len(alive), 0
    factors = dict.fromkeys(("prefill", "decode", "link", "colocated"), OPTIMISM)
    used: dict[str, float] = {}

    def reachable(c: Candidate) -> float:
        return min(factors[r] * v for r, v in c.ceilings.items())

    def prune(queue: list[Candidate]) -> list[Candidate]:
        nonlocal finished
        keep = []
        # the highest capacity simulated at each cost or below: dominated = it reaches ``reach``
        costs, best = [], []
        for e in sorted((e for e in done if e.capacity is not None), key=lambda e: e.cost(cost)):
            costs.append(e.cost(cost))
            best.append(max(e.capacity, best[-1]) if best else e.capacity)
        for c in queue:
            reach = reachable(c)
            cheaper = bisect.bisect_right(costs, c.cost(cost))
            if target_rate is not None and reach < target_rate:
                c.status = "pruned: below target"
            elif cheaper and best[cheaper - 1] >= reach:
                c.status = "pruned: dominated"
            else:
                keep.append(c)
                continue
            c.optimistic = reach
            counts["below_target" if c.status.endswith("target") else "dominated"] += 1
            for r in c.ceilings:
                used[r] = min(used.get(r, math.inf), factors[r])
            finished += 1
            if progress is not None:
                progress(finished, total)
        return keep

    queue = prune(alive)
    while queue:
        batch, queue = queue[:wave], queue[wave:]
        # a plan keeps only each search's answer: failing probes may stop once decided
        payloads = [{"config": c.config.model_dump(), "target": target, "rtol": rtol, "steady": steady,
                     "decide": True} for c in batch]
        for j, res in backend.map(capacity_task, payloads):
            c = batch[j]
            if isinstance(res, TaskError):
                c.status, c.error = "failed", res.message
                counts["failed"] += 1
            else:
                s = res["search"]
                c.capacity, c.simulations, c.status = s["rate"], s["simulations"], "simulated"
                c.steady = s["steady"]
                if res["config"]["requests"] != c.config.requests:
                    c.config = c.config.replace(requests=res["config"]["requests"])
                counts["simulated"] += 1
                done.append(c)
            finished += 1
            if progress is not None:
                progress(finished, total)
        seen = observed(done)
        if seen:
            factors.update({r: max(GROWTH, SAFETY * x) for r, x in seen.items()})
        queue = prune(queue)
    if not done and counts["failed"]:
        first = next(c for c in alive if c.status == "failed")
        raise KvcargoError(f"every simulated candidate failed; the first ({first.label}): {first.error}")
    notes = []
    for r, x in observed(done).items():
        if r in used and x > used[r]:
            notes.append(f"a candidate sustained {x:.2f}x its {r} ceiling, more than the {used[r]:.2f}x assumed "
                         "when pruning: a pruned candidate might have reached the front")
    transient = [c for c in done if not c.steady]
    if transient:
        notes.append(f"{len(transient)} capacities come from runs shorter than {STEADY_LIFETIMES:g} request "
                     "lifetimes: they measure a transient" + ("" if steady else "; drop --no-steady or raise "
                                                              "--requests for steady-state numbers"))
    longer = sum(1 for c in done if c.config.requests != base.requests)
    if longer:
        notes.append(f"{count(longer, 'candidate')} {'was' if longer == 1 else 'were'} searched with more than {base.requests} requests to reach a "
                     "steady state (their commands say how many)")
    front = pareto_front(done, cost)
    for c in front:
        c.front = True
    feasible = [c for c in done if c.capacity]
    best = None
    if target_rate is not None:
        meeting = [c for c in feasible if c.capacity >= target_rate]
        if meeting:
            best = min(meeting, key=lambda c: (c.cost(cost), -c.capacity, c.label))
        else:
            top = max(feasible, key=lambda c: c.capacity, default=None)
            notes.append(f"no configuration within the budget sustains {target_rate:g} req/s"
                         + (f"; the highest is {top.capacity:.4g} req/s ({top.label})" if top else ""))
    elif feasible:
        best = min(feasible, key=lambda c: (-c.capacity, c.cost(cost), c.label))
    efficient = min(feasible, key=lambda c: (-c.capacity / c.cost(cost), c.cost(cost), c.label), default=None)
    sims = sum(c.simulations for c in done)
    return PlanResult(base, budget, cost, target_rate, target, rtol, cands, front, best, efficient, counts,
                      sims, time.perf_counter() - t0, getattr(backend, "name", "?"), notes, dict(factors))


def shared_workload(config: SimConfig) -> Workload | None:
    """The request stream every candidate simulates (they differ in hardware, never in the
    workload): drawn or read once for all their ceilings. None where it cannot be built (each
    candidate then reports why)."""
    try:
        return load_workload(config)
    except KvcargoError:
        return None


def observed(done: list[Candidate]) -> dict[str, float]:
    """Per resource, the largest simulated capacity / ceiling ratio so far."""
    out: dict[str, float] = {}
    for c in done:
        if c.capacity:
            for r, v in c.ceilings.items():
                if v > 0 and math.isfinite(v):
                    out[r] = max(out.get(r, 0.0), c.capacity / v)
    return out


def pareto_front(cands: list[Candidate], cost: CostKind) -> list[Candidate]:
    """Candidates no other beats on both cost (lower) and capacity (higher); cheapest first."""
    front: list[Candidate] = []
    best = 0.0
    for c in sorted(cands, key=lambda c: (c.cost(cost), -(c.capacity or 0.0), c.label)):
        if c.capacity and c.capacity > best:
            front.append(c)
            best = c.capacity
    return front
