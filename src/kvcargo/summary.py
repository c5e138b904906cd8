"""The run summary grouped by what it measures — latency, SLO, link, energy, instances, cost —
as typed structures, with today's flat keys as the stable view for JSON and CSV.

:func:`kvcargo.metrics.summarize` computes the flat dictionary (its keys are a published
interface: ``kvcargo simulate --json``, the web API, sweep CSVs). :meth:`Summary.of` groups it and
:meth:`Summary.flat` gives the very same dictionary back, keys in the same order; a key no group
claims (throughput, stage times, the levers' and families' figures) stays in ``other``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

LATENCIES = ("ttft", "tpot", "itl", "e2e", "handoff", "exposed")
"""The latency distributions of a run (``exposed`` only with layer-wise streaming)."""


@dataclass(frozen=True)
class Distribution:
    """Mean, percentiles and maximum of one latency, seconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class Group:
    """A group of summary figures: each field is the flat key ``KEYS[field]`` (or the field's name)."""

    KEYS: ClassVar[dict[str, str]] = {}

    @classmethod
    def key(cls, name: str) -> str:
        return cls.KEYS.get(name, name)

    @classmethod
    def claims(cls) -> dict[str, str]:
        """Flat key → field name, for every field of the group."""
        return {cls.key(f.name): f.name for f in fields(cls)}


@dataclass(frozen=True)
class Slo(Group):
    KEYS: ClassVar[dict[str, str]] = {"met": "slo_met", "attainment": "slo_attainment"}
    met: int
    attainment: float
    goodput_rps: float


@dataclass(frozen=True)
class LinkFigures(Group):
    KEYS: ClassVar[dict[str, str]] = {"busy": "link_busy", "bytes": "link_bytes", "gbps": "link_gbps",
                                      "mean_wait_s": "link_mean_wait_s", "j": "link_j",
                                      "j_per_request": "link_j_per_request"}
    transfers: int
    busy: float
    bytes: float
    gbps: float
    mean_wait_s: float
    j: float
    transit_j: float
    j_per_request: float
    transit_bound_share: float


@dataclass(frozen=True)
class Energy(Group):
    KEYS: ClassVar[dict[str, str]] = {"total_j": "energy_j", "static_j": "energy_static_j",
                                      "compute_j": "energy_compute_j", "memory_j": "energy_memory_j",
                                      "link_j": "energy_link_j", "transit_j": "energy_transit_j"}
    total_j: float
    static_j: float
    compute_j: float
    memory_j: float
    link_j: float
    transit_j: float
    j_per_token: float
    tokens_per_j: float
    avg_power_w: float


@dataclass(frozen=True)
class Instances(Group):
    KEYS: ClassVar[dict[str, str]] = {"rows": "instances"}
    rows: list[dict[str, Any]]
    """Per instance: name, device, devices, steps, busy, MFU, MBU, mean batch, power."""
    hotspot_stage: str
    hotspot_pool: str
    hotspot: str
    kv_cap_prefill: int
    kv_cap_decode: int


@dataclass(frozen=True)
class Cost(Group):
    silicon_usd: float | None
    tok_per_s_per_kusd: float | None
    silicon_mm2: float | None


GROUPS: dict[str, type[Group]] = {"slo": Slo, "link": LinkFigures, "energy": Energy, "instances": Instances,
                                  "cost": Cost}


@dataclass(frozen=True)
class Summary:
    """A run's summary, grouped; :meth:`flat` is the JSON/CSV view."""

    latency: dict[str, Distribution]
    slo: Slo
    link: LinkFigures
    energy: Energy
    instances: Instances
    cost: Cost
    other: dict[str, Any]
    """Figures no group claims, by their flat key."""
    order: tuple[str, ...]
    """The flat keys in the order :func:`~kvcargo.metrics.summarize` gives them."""

    @classmethod
    def of(cls, flat: dict[str, Any]) -> Summary:
        """Group a flat summary (every group's keys must be present; the cost ones may be None)."""
        claimed: set[str] = set()
        latency = {}
        for name in LATENCIES:
            keys = {f.name: f"{name}_{f.name}" for f in fields(Distribution)}
            if all(k in flat for k in keys.values()):
                latency[name] = Distribution(**{f: flat[k] for f, k in keys.items()})
                claimed |= set(keys.values())
        groups = {}
        for name, group in GROUPS.items():
            keys = group.claims()
            groups[name] = group(**{field: flat.get(key) for key, field in keys.items()})
            claimed |= set(keys)
        other = {k: v for k, v in flat.items() if k not in claimed}
        return cls(latency=latency, other=other, order=tuple(flat), **groups)

    def flat(self) -> dict[str, Any]:
        """The flat summary, keys and order as :func:`~kvcargo.metrics.summarize` gives them."""
        values = dict(self.other)
        for name, d in self.latency.items():
            values |= {f"{name}_{f.name}": getattr(d, f.name) for f in fields(Distribution)}
        for name, group in GROUPS.items():
            g = getattr(self, name)
            values |= {key: getattr(g, field) for key, field in group.claims().items()}
        return {k: values[k] for k in self.order}
