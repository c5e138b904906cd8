"""``simulate --compare`` and ``--sweep-rate``: the companion's colocated-vs-disaggregated runs."""

from __future__ import annotations

from typing import Any

import click

from kvcargo.config import SimConfig, colocated_twin
from kvcargo.errors import KvcargoError


class GreedyFloats(click.Option):
    """An option taking one or more numbers after a single flag (``--sweep-rate 1 2 4``), as the
    companion's command line does; repeating the flag adds more."""

    def add_to_parser(self, parser, ctx):  # type: ignore[no-untyped-def]
        super().add_to_parser(parser, ctx)
        opt = parser._long_opt.get(self.opts[0])
        if opt is None:
            return
        store = opt.process

        def process(value: Any, state: Any) -> None:
            values = [value]
            while state.rargs and not state.rargs[0].startswith("--"):
                values.append(state.rargs.pop(0))
            for v in values:
                store(v, state)

        opt.process = process


def compare_configs(config: SimConfig) -> list[SimConfig]:
    """The colocated run on the same GPUs (prefill + decode instances, no hand-off options), then the
    disaggregated one."""
    return [colocated_twin(config), config.replace(mode="disagg")]


def ignored_flags(params: dict[str, Any], compare: bool, sweep: tuple[float, ...], as_json: bool) -> list[str]:
    """Flags the comparison or the sweep ignore, one note each (the companion accepts and ignores
    them: levers-serving §8); rates that are not positive are refused."""
    if sweep and any(not r > 0 for r in sweep):
        raise KvcargoError("--sweep-rate takes positive rates (requests or sessions per second)")
    notes = []
    if compare and params.get("mode") is not None:
        notes.append("--mode has no effect with --compare, which runs both modes")
    if sweep and params.get("rate") is not None:
        notes.append("--rate has no effect with --sweep-rate, which sets the rates")
    if sweep and as_json:
        notes.append("--json has no effect with --sweep-rate, which prints a table")
    return notes


def sweep_rates(config: SimConfig, rates: tuple[float, ...], compare: bool) -> str:
    """One row per mode and rate (modes outer, rates in the order given)."""
    from kvcargo.report.serving import SWEEP_HEADER, sweep_row
    from kvcargo.simulation import simulate

    lines = [SWEEP_HEADER]
    for c in compare_configs(config) if compare else [config]:
        for rate in rates:
            lines.append(sweep_row(c.mode, rate, simulate(c.replace(rate=rate)).summary))
    return "\n".join(lines)
