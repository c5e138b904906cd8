"""Parameter models beneath every face: the calculator's :class:`HandoffConfig` (the simulator's
:class:`~kvcargo.config.SimConfig` stands beside it) and what the faces derive from a model's
fields — CLI flags (:mod:`kvcargo.cli.options`), web parameters (:mod:`kvcargo.web.service`) and
the bounds both show and enforce.

A field's name is its flag with dashes turned into underscores, its docstring is its help, its
type carries its bounds. This module stays light (pydantic only): ``kvcargo handoff`` starts here.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvcargo import cachefiles
from kvcargo.errors import KvcargoError, shown
from kvcargo.limits import RANGES, number

M = TypeVar("M", bound=type[BaseModel])

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
NumberFormat = Literal["bf16", "fp8", "int8", "int4", "fp4"]
CostModel = Literal["roofline", "calibrated"]
"""Step-cost models (``--cost-model``): a new one is named here once."""
LinkModel = Literal["line-rate", "measured"]
"""Link models (``--link-model``)."""


def attribute_docstrings(model: M) -> M:
    """Class decorator: each field's description is the docstring under it, as pydantic's
    ``use_attribute_docstrings`` gives it, but read from the module's source once per version of
    the file (kept in kvcargo's cache) instead of pydantic's search of the call stack, which costs
    every process about 10 ms per model. The model defers building its validator
    (``defer_build=True``), so the validator and the JSON schema are built with the descriptions."""
    path = sys.modules[model.__module__].__file__ or ""
    docs = cachefiles.cached(f"docstrings-{model.__module__}.{model.__qualname__}", cachefiles.stamp([path]),
                             lambda: _field_docstrings(path, model.__qualname__))
    for name, field in model.model_fields.items():
        if field.description is None and name in docs:
            field.description = docs[name]
    return model


def _field_docstrings(path: str, qualname: str) -> dict[str, str]:
    """``{field: docstring}`` of the module-level class ``qualname`` in the source file ``path``: a
    string statement right after an annotated name (cleaned as :func:`inspect.cleandoc` does)."""
    import ast
    import inspect

    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    body = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == qualname)
    return {a.target.id: inspect.cleandoc(b.value.value) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


MAX_PROMPT = 10_000_000
"""Largest prompt the calculator accepts (tokens); a model's own limit is usually lower."""
MAX_DEVICES = 1024
"""Most devices per prefill instance the calculator accepts."""


@attribute_docstrings
class HandoffConfig(BaseModel):
    """One hand-off for the calculator (``kvcargo handoff``, ``GET /api/handoff``,
    :func:`kvcargo.handoff.calculate_config`). Every field that changes the answer is here, under
    the simulator's name for it, so a one-request simulation with the same values hands off in the
    same time."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    model: str = "llama3-8b"
    """Model key (kvcargo catalog models)."""
    prompt: Annotated[int, Field(ge=1, le=MAX_PROMPT)] = 2048
    """Prompt tokens (at most the model's limit, where one prefill step's FLOP count still fits a
    64-bit integer: 5,903,082 for llama3-8b)."""
    link: str = "eth-25g"
    """Link key (kvcargo catalog links)."""
    link_channels: Count | None = None
    """Parallel channels of the link (default: the catalog's); layer-wise slices may share them."""
    device: str = "h100"
    """Prefill device (sets the prefill time)."""
    devices_per_instance: Annotated[int, Field(ge=1, le=MAX_DEVICES)] = 1
    """Devices per prefill instance."""
    kv_compress: str | None = None
    """Codec applied to the hand-off (kvcargo catalog codecs)."""
    kv_compress_at: Literal["transit", "endpoint"] = "transit"
    """Where the codec runs: in the link (transit) or on the prefill GPU (endpoint: its encode pass
    lengthens the prefill)."""
    kv_keep: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction kept by freq-keep-k (needs --kv-compress freq-keep-k)."""
    kv_ratio: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    """Wire ratio of the ratio codec (needs --kv-compress ratio)."""
    transit_ops_per_byte: Positive | None = None
    """In-transit codec compute budget per line byte (default 1.6; needs --kv-compress in transit)."""
    send: Literal["whole", "layerwise"] = "whole"
    """Send the cache after the prefill, or stream it layer by layer."""
    layer_groups: Count | None = None
    """Layer-wise streaming in this many slices (default: one per layer; needs --send layerwise)."""
    weight_format: NumberFormat | None = None
    """Weight storage format (default bf16)."""
    kv_format: NumberFormat | None = None
    """KV-cache storage format: the hand-off crosses the link in it (default bf16)."""
    compute_format: NumberFormat | None = None
    """Matmul input format: bf16 (weight-only quantisation) or the weight format (default bf16)."""
    speculative: str | None = None
    """Speculative decoding with this draft ('mtp' or a model key): its prompt KV crosses too and
    its prefill follows the target's."""
    lm_head: Literal["all", "last"] = "all"
    """LM head over every prompt token (reference) or the last one only."""
    cost_model: CostModel = "roofline"
    """Prefill time from the reference roofline, or from measured kernels (see docs/accuracy.md)."""
    link_model: LinkModel = "line-rate"
    """Links at line rate plus a latency (reference), or the measured per-message overhead,
    efficiency, per-channel ceiling and per-layer cost of each catalog link."""
    catalog: tuple[str, ...] = ()
    """Extra catalog TOML files, in order."""

    @classmethod
    def build(cls, **values: Any) -> HandoffConfig:
        """Validate ``values``; bad input raises :class:`KvcargoError` with one line naming it."""
        return build(cls, values)


def transit_option_error(config: Any) -> str | None:
    """The in-transit codec stage's own options (a simulator or calculator configuration) given
    without a codec in transit: the error, else None."""
    given = [f for f in ("transit_ops_per_byte", "transit_pj_per_bit") if getattr(config, f, None) is not None]
    if given and (config.kv_compress is None or config.kv_compress_at != "transit"):
        return f"--{given[0].replace('_', '-')} applies only to --kv-compress in transit"
    return None


def layer_groups_error(config: Any) -> str | None:
    """``layer_groups`` given without layer-wise sending: the error, else None."""
    if config.layer_groups is not None and config.send != "layerwise":
        return "--layer-groups applies only to --send layerwise"
    return None


SERVER_ONLY = ("catalog", "workload_file")
"""Fields that name files on the server: not accepted from a web client."""


def build(model: type[BaseModel], values: dict[str, Any], strict: bool | None = None) -> Any:
    """``model`` validated from ``values``; bad input raises :class:`KvcargoError` (one line)."""
    try:
        return model.model_validate(values, strict=strict)
    except ValidationError as exc:
        raise KvcargoError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line naming the first invalid field (as a CLI flag) and what is wrong."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not isinstance(p, int)]
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:
        return msg
    flag = "--" + loc[0].replace("_", "-")
    if err["type"] == "extra_forbidden":
        return f"unknown parameter {flag}"
    value = err.get("input")
    got = f" (got {shown(value)})" if value is not None and not isinstance(value, dict) else ""
    return f"invalid {flag}{got}: {msg}"


def flag(name: str) -> str:
    """A field's command-line flag."""
    return "--" + name.replace("_", "-")


def type_bounds(annotation: Any, metadata: list[Any]) -> dict[str, Any]:
    """The bounds a field's type puts on it, as ``{"gt"|"ge"|"lt"|"le": value}``."""
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Annotated:
            return type_bounds(arg, [m for a in typing.get_args(arg)[1:] for m in getattr(a, "metadata", [a])])
    return {attr: getattr(m, attr) for m in metadata for attr in ("gt", "ge", "lt", "le")
            if getattr(m, attr, None) is not None}


def range_help(model: type[BaseModel], name: str) -> str:
    """`` [range: ...]`` for a numeric field (empty for the others): its type's bounds tightened
    by :data:`~kvcargo.limits.RANGES`."""
    field = model.model_fields[name]
    b = type_bounds(field.annotation, list(field.metadata))
    bound = RANGES.get(name)
    if bound is not None and bound.lo is not None:
        b = {k: v for k, v in b.items() if k not in ("gt", "ge")} | {"ge": bound.lo}
    if bound is not None and bound.hi is not None:
        b = {k: v for k, v in b.items() if k not in ("lt", "le")} | {"le": bound.hi}
    if not b:
        return ""
    if "ge" in b and "le" in b:
        return f" [range: {number(b['ge'])} to {number(b['le'])}]"
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    return " [range: " + ", ".join(f"{signs[k]} {number(v)}" for k, v in b.items()) + "]"


def help_text(model: type[BaseModel], name: str) -> str:
    """A field's help: its docstring without reStructuredText literal markup, and its range."""
    return (model.model_fields[name].description or "").replace("``", "") + range_help(model, name)
