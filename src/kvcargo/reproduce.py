"""Every published figure, recomputed: the chapter's and the reference's tables (``kvcargo reproduce``).

The figures are data (``data/published.toml``): a configuration, a metric and the value as it
was printed. A printed value is matched to its own digits and unit ("353.6 ms" → kvcargo's
TTFT p99 rounded to 0.1 ms); a full-precision value is matched bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from kvcargo import data

UNITS = {" ms": 1e-3, " s": 1.0, "%": 0.01, " MB": 1e6, " GB": 1e9, " W": 1.0}


@dataclass(frozen=True)
class Check:
    """One figure: where it comes from, what was published, what kvcargo computes."""

    group: str
    what: str
    metric: str
    published: str
    kvcargo: str
    value: Any
    ok: bool
    exact: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def groups() -> dict[str, str]:
    """Group name → title."""
    return data.groups("published.toml")


def compare(published: str, value: Any, exact: Any = None) -> tuple[bool, str]:
    """(matches, kvcargo's value shown like the published one)."""
    if exact is not None:
        return value == exact, repr(value)
    if isinstance(value, str):
        return value == published, value
    text = published.replace(",", "").replace("$", "")
    scale, unit = 1.0, ""
    for suffix, factor in UNITS.items():
        if text.endswith(suffix):
            text, scale, unit = text[: -len(suffix)], factor, suffix
            break
    digits = len(text.split(".")[1]) if "." in text else 0
    shown = f"{value / scale:.{digits}f}"
    return shown == text, shown + unit


def metric_of(summary: dict[str, Any], metric: str) -> Any:
    """A summary value; ``instances.NAME.FIELD`` reaches into the per-instance rows."""
    if metric.startswith("instances."):
        _, name, field = metric.split(".", 2)
        row = next(r for r in summary["instances"] if r["name"] == name)
        return row[field]
    return summary[metric]


def run(only: Iterable[str] | None = None) -> list[Check]:
    """Recompute the checks of the given groups (all by default)."""
    from kvcargo import catalog
    from kvcargo.handoff import calculate_config
    from kvcargo.params import HandoffConfig
    from kvcargo.simulation import simulate

    wanted = data.chosen_groups("published.toml", only)
    checks = [c for c in data.load("published.toml")["check"] if c["group"] in wanted]
    summaries: dict[str, dict[str, Any]] = {}
    cat = catalog.builtin()
    out = []
    for c in checks:
        if "handoff" in c:
            h = {"model": "llama3-8b", "prompt": 2048, **c["handoff"]}
            value = getattr(calculate_config(HandoffConfig.build(**h), cat)[0], c["metric"])
        else:
            key = json.dumps(c["config"], sort_keys=True)
            if key not in summaries:
                summaries[key] = simulate(**c["config"]).summary
            value = metric_of(summaries[key], c["metric"])
        ok, shown = compare(c["published"], value, c.get("exact"))
        out.append(Check(c["group"], c["what"], c["metric"], c["published"], shown, value, ok, "exact" in c))
    return out


def render(checks: list[Check]) -> str:
    """Published beside kvcargo, grouped; mismatches flagged."""
    from kvcargo.report.text import table

    titles = groups()
    blocks = []
    for g in dict.fromkeys(c.group for c in checks):
        rows = [[c.what, c.published, c.kvcargo, "ok" if c.ok else "MISMATCH"] for c in checks if c.group == g]
        blocks.append(f"{titles[g]}\n" + table(["figure", "published", "kvcargo", ""], rows, "lrrl"))
    bad = sum(not c.ok for c in checks)
    blocks.append(f"{len(checks)} figures, {len(checks) - bad} reproduced, {bad} mismatched"
                  + ("" if bad else " (every published value matches)"))
    return "\n\n".join(blocks)

