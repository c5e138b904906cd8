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


def sim_options(fn: Callable) -> Callable:
    """Add one option per SimConfig field; defaults stay in SimConfig (unset flags are omitted)."""
    for name, field in reversed(list(SimConfig.model_fields.items())):
        flag = "--" + name.replace("_", "-")
        if name == "catalog":
            fn = click.option(flag, "catalog", multiple=True, type=click.Path(dir_okay=False),
                              help=field.description)(fn)
            continue
        ctype, is_flag = _click_type(field.annotation)
        default = field.default
        shown = f" [default: {default}]" if default not in (None, False) else ""
        if is_flag:
            fn = click.option(flag, name, is_flag=True, default=None, help=(field.description or "") + shown)(fn)
        else:
            fn = click.option(flag, name, type=ctype, default=None, help=(field.description or "") + shown)(fn)
    return fn


def config_from(params: dict[str, Any]) -> SimConfig:
    """A validated SimConfig from the options that were given."""
    given = {k: v for k, v in params.items() if k in SimConfig.model_fields and v not in (None, ())}
    if "catalog" in given:
        given["catalog"] = tuple(given["catalog"])
    return SimConfig.build(**given)


def pop_sim_params(params: dict[str, Any]) -> dict[str, Any]:
    """Split a command's parameters into the SimConfig ones (removed from ``params``)."""
    return {k: params.pop(k) for k in list(params) if k in SimConfig.model_fields}
