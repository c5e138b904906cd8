"""Resolve the parallelism, number-format and speculative-decoding levers of a configuration.

The companion simulator's rules (levers-parallel §1–§3, §6, §10): which layout each pool runs
(a pool's own ``--prefill-tp/-pp`` do not fall back to ``--tp/--pp``), the storage formats
applied to the model, the draft, each pool's KV capacity checked GPU by GPU, and the rejected
combinations — each a one-line error naming the pool where the companion names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvcargo.catalog import Catalog, Link, Model
from kvcargo.cost import Pool, require_fit
from kvcargo.errors import KvcargoError
from kvcargo.formats import is_default, with_formats
from kvcargo.parallel import Layout, layout_coefficients, stage_capacity, stage_coefficients
from kvcargo.speculative import Draft, make_draft

PARALLEL_LEVERS = ("tp", "pp", "ep", "microbatches", "expert_imbalance", "scale_up_link", "prefill_tp", "prefill_pp",
                   "decode_tp", "decode_pp", "weight_format", "kv_format", "compute_format", "speculative")
"""The parallelism, number-format and speculative-decoding fields (what other engines and model
families refuse)."""

if TYPE_CHECKING:
    from kvcargo.config import SimConfig


@dataclass(frozen=True)
class PoolLevers:
    """One pool's layout (or none), its scale-up link and the KV capacity of an instance."""

    layout: Layout | None
    scale_up: Link | None
    kv_capacity: int


@dataclass(frozen=True)
class Levers:
    """What the levers resolve to: per pool (prefill, decode; colocated: the same twice), the draft."""

    prefill: PoolLevers
    decode: PoolLevers
    draft: Draft | None

    @property
    def has_layout(self) -> bool:
        return self.prefill.layout is not None or self.decode.layout is not None

    def layout_arrays(self, model: Model, prefill_pool: Pool, decode_pool: Pool) -> tuple[np.ndarray, np.ndarray]:
        """Per pool (row 0 prefill, row 1 decode): packed layout coefficients and the stage device's."""
        rows = [(self.prefill, prefill_pool), (self.decode, decode_pool)]
        lf = np.stack([layout_coefficients(p.layout, model, p.scale_up) for p, _ in rows])
        hs = np.stack([stage_coefficients(pool, p.layout.tp if p.layout else pool.n) for p, pool in rows])
        return lf, hs

    def draft_arrays(self, prefill_pool: Pool, decode_pool: Pool) -> np.ndarray:
        """Per pool: the draft's roofline coefficients (the pool's devices as one, no overhead)."""
        return np.stack([stage_coefficients(pool, pool.n) for pool in (prefill_pool, decode_pool)])


def lever_model(config: SimConfig, model: Model) -> Model:
    """The model in its storage formats (unchanged when every format is BF16)."""
    c = config
    if is_default(c.weight_format, c.kv_format, c.compute_format):
        return model
    return with_formats(model, c.weight_format, c.kv_format)


def layout_of(config: SimConfig, role: str, cat: Catalog) -> Layout | None:
    """The layout a pool runs: its own (``--<role>-tp/-pp``), else the global one, else none."""
    c = config
    link = cat.link(c.scale_up_link) if c.scale_up_link is not None else None
    shared = {"ep": c.ep or 1, "microbatches": c.microbatches, "imbalance": c.expert_imbalance or 1.0, "link": link}
    if role in ("prefill", "decode"):
        tp, pp = getattr(c, f"{role}_tp"), getattr(c, f"{role}_pp")
        if tp is not None or pp is not None:
            return Layout(tp=tp or 1, pp=pp or 1, **shared)
    if any(v is not None for v in (c.tp, c.pp, c.ep, c.microbatches)):
        return Layout(tp=c.tp or 1, pp=c.pp or 1, **shared)
    return None


def resolve_levers(config: SimConfig, cat: Catalog, model: Model, pools: dict[str, Pool]) -> Levers:
    """Check the levers and compute each pool's capacity (``pools``: role → pool, prefill first;
    one entry, ``colocated``, in colocated mode). ``model`` is already in its storage formats and
    the pools' devices have units for the compute format (:func:`kvcargo.formats.require_units`)."""
    c = config
    layouts = {role: layout_of(c, role, cat) for role in pools}
    _check_combinations(c, model, layouts)
    draft = None
    if c.speculative is not None:
        draft = make_draft(model, c.speculative, cat, c.gamma, c.alpha, c.spec_seed)
    resolved: dict[str, PoolLevers] = {}
    for role, pool in pools.items():
        layout = layouts[role]
        if layout is not None:
            layout.check(model, pool, role)
        if layout is None and draft is None:
            cap = require_fit(model, pool, role)
        else:
            tp, pp = (layout.tp, layout.pp) if layout else (pool.n, 1)
            extra = (draft.resident_bytes, draft.kv_per_token) if draft else (0.0, 0.0)
            cap = stage_capacity(model, pool.device, tp, pp, role, *extra)
        link = None
        if layout is not None:
            link = layout.link or cat.link(pool.device.scale_up)
        resolved[role] = PoolLevers(layout, link, cap)
    first = next(iter(resolved.values()))
    return Levers(resolved.get("prefill", first), resolved.get("decode", first), draft)


def _check_combinations(c: SimConfig, model: Model, layouts: dict[str, Layout | None]) -> None:
    """The companion's lever rules that name no pool (levers-parallel §9, §10)."""
    lever = (any(layouts.values()) or not is_default(c.weight_format, c.kv_format, c.compute_format)
             or c.speculative is not None or bool(model.experts))
    if c.expert_imbalance is not None and not (model.experts and (c.ep or 1) > 1):
        raise KvcargoError("--expert-imbalance applies only to a mixture-of-experts model with --ep > 1")
    if c.expert_imbalance is not None and c.expert_imbalance > (c.ep or 1):
        raise KvcargoError(f"--expert-imbalance {c.expert_imbalance:g} is above --ep {c.ep}: the busiest of {c.ep} GPUs "
                           "holds at most all the routed-expert work, ep times the mean")
    if c.fast and c.mode == "disagg" and lever:
        raise KvcargoError("--fast is the plain decode instance's fast path: not with parallelism, quantisation, "
                           "speculative decoding or mixture-of-experts models")
    if c.speculative is None:
        return
    if any(lay is not None and lay.pp > 1 for lay in layouts.values()):
        raise KvcargoError("--speculative with pipeline parallelism (pp > 1) is not modelled")
    if c.kv_compress is not None:
        raise KvcargoError("--speculative with --kv-compress: the draft's KV would cross uncompressed")

