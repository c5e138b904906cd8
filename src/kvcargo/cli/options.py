"""Command-line options generated from :class:`~kvcargo.config.SimConfig`, so the flags of
``simulate``, ``sweep``, ``capacity`` and ``plan`` are the configuration's fields, one place."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import click

from kvcargo.config import SimConfig


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


def field_options(*names: str) -> Callable[[Callable], Callable]:
    """Add an option for each named SimConfig field: help from its docstring, defaults left to
    SimConfig (an unset flag is omitted)."""

    def add(fn: Callable) -> Callable:
        for name in reversed(names):
            field = SimConfig.model_fields[name]
            flag = "--" + name.replace("_", "-")
            if name == "catalog":
                fn = click.option(flag, "catalog", multiple=True, type=click.Path(dir_okay=False),
                                  help=field.description)(fn)
                continue
            ctype, is_flag = _click_type(field.annotation)
            default = field.default
            shown = f" [default: {default}]" if default not in (None, False) else ""
            kind = {"is_flag": True} if is_flag else {"type": ctype}
            fn = click.option(flag, name, default=None, help=(field.description or "") + shown, **kind)(fn)
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
