"""Plain-text rendering: human units and aligned tables for the CLI."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def seconds(x: float) -> str:
    """A duration in the unit the chapter uses: µs, ms (one decimal) or s."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x < 1e-3:
        return f"{x * 1e6:.1f} µs"
    if x < 10e-3:
        return f"{x * 1e3:.3g} ms"
    if x < 10:
        return f"{x * 1e3:,.1f} ms"
    return f"{x:,.1f} s"


def ms(x: float, digits: int = 1) -> str:
    """Always in milliseconds (tables)."""
    return "—" if x is None or math.isnan(x) else f"{x * 1e3:,.{digits}f}"


def fixed(x: float, spec: str) -> str:
    """``format(x, spec)``, or "—" for NaN (a run where nothing completed has no rate)."""
    return "—" if x is None or math.isnan(x) else format(x, spec)


def bytes_(x: float) -> str:
    """Decimal units, as the chapter: 268.4 MB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:,.1f} {unit}"
    return f"{x:,.0f} B"


def rate_bps(x: float) -> str:
    """Bytes per second in GB/s, as the catalog gives it: 3.125 GB/s, 450 GB/s."""
    return f"{x / 1e9:g} GB/s"


def pct(x: float, digits: int = 1) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.{digits}f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """An aligned plain-text table; ``align`` has one 'l' or 'r' per column (default: first left)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 run``, ``16 runs``, ``1 candidate``: a number with its noun in the right number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
