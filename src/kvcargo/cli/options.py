"""Command-line options generated from :class:`~kvcargo.config.SimConfig`, so the flags of
``simulate``, ``sweep``, ``capacity`` and ``plan`` are the configuration's fields, one place."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import click

from kvcargo.config import SimConfig
from kvcargo.limits import RANGES, number


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """(click type, is_flag) for a SimConfig field annotation."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _click_type(inner[0])
    if origin is typing.Annotated:
        return _click_type(args[0])
    if origin is typing.Literal:
        return click.Choice([str(a) for a in args]), False
    if annotation is bool:
        return bool, True
    return {int: int, float: float, str: str}.get(annotation, str), False


def _type_bounds(annotation: Any, metadata: list[Any]) -> dict[str, Any]:
    """The bounds a field's type puts on it, as ``{"gt"|"ge"|"lt"|"le": value}``."""
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Annotated:
            return _type_bounds(arg, [m for a in typing.get_args(arg)[1:] for m in getattr(a, "metadata", [a])])
    return {attr: getattr(m, attr) for m in metadata for attr in ("gt", "ge", "lt", "le")
            if getattr(m, attr, None) is not None}


def range_help(name: str) -> str:
    """`` [range: ...]`` for a numeric SimConfig field (empty for the others): its type's bounds
    tightened by :data:`~kvcargo.limits.RANGES`."""
    field = SimConfig.model_fields[name]
    b = _type_bounds(field.annotation, list(field.metadata))
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


def plain(text: str | None) -> str:
    """A docstring as help text: without reStructuredText literal markup."""
    return (text or "").replace("``", "")


def field_options(*names: str) -> Callable[[Callable], Callable]:
    """Add an option for each named SimConfig field: help from its docstring, defaults left to
    SimConfig (an unset flag is omitted)."""

    def add(fn: Callable) -> Callable:
        for name in reversed(names):
            field = SimConfig.model_fields[name]
            flag = "--" + name.replace("_", "-")
            if name == "catalog":
                fn = click.option(flag, "catalog", multiple=True, type=click.Path(dir_okay=False),
                                  help=plain(field.description))(fn)
                continue
            ctype, is_flag = _click_type(field.annotation)
            default = field.default
            shown = f" [default: {default}]" if default not in (None, False) else ""
            kind = {"is_flag": True} if is_flag else {"type": ctype}
            help_text = plain(field.description) + range_help(name) + shown
            fn = click.option(flag, name, default=None, help=help_text, **kind)(fn)
        return fn

    return add


sim_options = field_options(*SimConfig.model_fields)
"""One option per SimConfig field (``simulate``, ``sweep``, ``capacity``, ``plan``)."""


def given_params(params: dict[str, Any]) -> dict[str, Any]:
    """The SimConfig options a command was given (an unset flag is None; no --catalog is ())."""
    return {k: v for k, v in params.items() if k in SimConfig.model_fields and v not in (None, ())}


def config_from(params: dict[str, Any]) -> SimConfig:
    """A validated SimConfig from the options that were given."""
    return SimConfig.build(**given_params(params))
