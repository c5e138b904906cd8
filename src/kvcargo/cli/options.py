"""Command-line options generated from :class:`~kvcargo.config.SimConfig`, so the flags of
``simulate``, ``sweep``, ``capacity`` and ``plan`` are the configuration's fields, one place."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import click

from kvcargo.config import SimConfig

HELP = {
    "model": "model key (kvcargo catalog models)",
    "device": "accelerator of every instance (kvcargo catalog devices)",
    "devices_per_instance": "devices per instance (tensor parallelism as one big device)",
    "prefill_device": "accelerator of the prefill pool (default: --device)",
    "decode_device": "accelerator of the decode pool (default: --device)",
    "mode": "disaggregated prefill/decode pools, or the colocated baseline on the same GPUs",
    "prefill": "prefill instances",
    "decode": "decode instances",
    "instances": "colocated instances (default: prefill + decode)",
    "link": "KV link between the pools (kvcargo catalog links)",
    "link_channels": "parallel channels of the KV link (default: the catalog's)",
    "rate": "Poisson arrival rate, req/s [default: 8]; with --workload-file: rescale the trace to this mean rate",
    "requests": "number of requests",
    "prompt": "mean prompt length, tokens",
    "prompt_cv": "coefficient of variation of prompt lengths (0: fixed)",
    "output": "mean output length, tokens",
    "output_cv": "coefficient of variation of output lengths (0: fixed)",
    "seed": "random seed of the workload",
    "ttft_slo": "time-to-first-token SLO, seconds",
    "tpot_slo": "time-per-output-token SLO, seconds",
    "kv_compress": "compress the hand-off with a codec (kvcargo catalog codecs)",
    "kv_compress_at": "where the codec runs: in the link (transit) or on the prefill GPU (endpoint)",
    "kv_keep": "fraction of coefficients kept by freq-keep-k",
    "power_cap": "per-device power cap, W (both pools)",
    "prefill_power_cap": "per-device power cap of the prefill pool, W",
    "decode_power_cap": "per-device power cap of the decode pool, W",
    "dvfs": "lower the compute clock on memory-bound steps",
    "workload_file": "replay a trace (CSV, JSON rows, Mooncake JSONL, Azure 2023 CSV)",
    "time_scale": "trace replay: multiply arrival times (0.5 replays twice as fast)",
    "limit": "trace replay: only the first N requests (after --window)",
    "window": "trace replay: only requests arriving in START:END seconds (600:1200, 600:, :300)",
    "arrival_col": "trace column (CSV header or JSON key) with arrival times",
    "prompt_col": "trace column with prompt lengths (tokens)",
    "output_col": "trace column with output lengths (tokens)",
    "time_unit": "unit of numeric arrival times in the trace [default: s; Mooncake: ms]",
    "lm_head": "LM head over every prompt token (reference) or the last one only",
    "token_budget": "prefill batch token budget",
    "max_batch": "maximum decode batch",
    "catalog": "extra catalog TOML file (repeatable)",
}


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
                              help=HELP[name])(fn)
            continue
        ctype, is_flag = _click_type(field.annotation)
        default = field.default
        shown = f" [default: {default}]" if default not in (None, False) else ""
        if is_flag:
            fn = click.option(flag, name, is_flag=True, default=None, help=HELP.get(name, "") + shown)(fn)
        else:
            fn = click.option(flag, name, type=ctype, default=None, help=HELP.get(name, "") + shown)(fn)
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
