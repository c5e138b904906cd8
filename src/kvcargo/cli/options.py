"""Command-line options generated from the parameter models (:class:`~kvcargo.config.SimConfig`,
:class:`~kvcargo.params.HandoffConfig`), so the flags of ``simulate``, ``sweep``, ``capacity``,
``plan`` and ``handoff`` are the models' fields, one place."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from pydantic import BaseModel

from kvcargo.params import flag, help_text

if TYPE_CHECKING:
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


def field_options(*names: str, model: type[BaseModel] | None = None) -> Callable[[Callable], Callable]:
    """Add an option for each named field of a parameter model (SimConfig unless ``model`` says
    otherwise): help and range from the field, defaults left to the model (an unset flag is
    omitted)."""

    def add(fn: Callable) -> Callable:
        model_ = _sim_config() if model is None else model
        for name in reversed(names):
            field = model_.model_fields[name]
            if name == "catalog":
                fn = click.option(flag(name), "catalog", multiple=True, type=click.Path(dir_okay=False),
                                  help=help_text(model_, name))(fn)
                continue
            ctype, is_flag = _click_type(field.annotation)
            default = field.default
            shown = f" [default: {default}]" if default not in (None, False) else ""
            kind = {"is_flag": True} if is_flag else {"type": ctype}
            fn = click.option(flag(name), name, default=None, help=help_text(model_, name) + shown, **kind)(fn)
        return fn

    return add


def _sim_config() -> type[SimConfig]:
    """SimConfig, imported when a command needs it: ``kvcargo handoff`` starts without it."""
    from kvcargo.config import SimConfig

    return SimConfig


def sim_options(fn: Callable) -> Callable:
    """One option per SimConfig field (``simulate``, ``sweep``, ``capacity``, ``plan``)."""
    return field_options(*_sim_config().model_fields)(fn)


def given_params(params: dict[str, Any]) -> dict[str, Any]:
    """The SimConfig options a command was given (an unset flag is None; no --catalog is ())."""
    return {k: v for k, v in params.items() if k in _sim_config().model_fields and v not in (None, ())}


def config_from(params: dict[str, Any]) -> SimConfig:
    """A validated SimConfig from the options that were given, kept in kvcargo's cache for the next
    process given the same options while kvcargo's sources and pydantic are unchanged: validating
    first builds pydantic's validator (tens of ms, more than a short run's simulation). Bad
    options are never stored: they fail the same way every time. What the run will ignore or
    clip of the options (:func:`kvcargo.config.notes`) is said on stderr, one note a line."""
    from pydantic.version import VERSION

    from kvcargo import cachefiles
    from kvcargo._jit import source_digest
    from kvcargo.config import notes

    given = given_params(params)
    key = (source_digest(), VERSION, tuple((k, type(v).__name__, v) for k, v in sorted(given.items())))
    config = cachefiles.cached("sim-config", key, lambda: _sim_config().build(**given))
    say(notes(config))
    return config


def say(notes: list[str]) -> None:
    """Each note on stderr as one line, ``kvcargo: note: ...`` (stdout stays the result)."""
    for line in notes:
        click.echo(f"kvcargo: note: {line}", err=True)
