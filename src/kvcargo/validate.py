"""Published checks (``kvcargo validate``): numbers measured or published for real systems beside
kvcargo's value for the same thing, with the relative difference.

The checks are data (``data/validate.toml``). Each names what kvcargo computes (``kind``) and the
published value with its unit; kvcargo's value is shown in that unit and to the same digits.
Where kvcargo's illustrative model is compared with a measurement (``expect = "gap"``) the
difference is reported as a gap, never hidden and never a failure; a check that kvcargo should
reproduce (KV sizes, parameter counts, trace statistics) fails when it does not.

Trace statistics read the trace files from ``trace_dir``, ``$KVCARGO_TRACE_DIR``,
``shared/data/traces`` or ``data/traces`` under the current directory and its parent, else the
traces shipped with kvcargo. A file missing from a given directory makes its check "skipped",
with the reason.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvcargo import data
from kvcargo.errors import KvcargoError

UNITS = {"KiB": 1024.0, "MiB": 1024.0**2, "B": 1.0, "GB/s": 1e9, "ms": 1e-3, "s": 1.0, "billion": 1e9,
         "tokens": 1.0, "requests": 1.0}
"""Units a published value may carry, in SI units (bytes, seconds, B/s, counts)."""

TRACE_DIRS = ("shared/data/traces", "../shared/data/traces", "data/traces")
"""Where the trace files are looked for, relative to the current directory."""

EXTRA_LINKS = {
    "ib-hdr": {"name": "InfiniBand HDR 200G", "bandwidth": 25e9, "latency": 10e-6, "pj_per_bit": 15.0,
               "message_overhead_s": 29.0e-6, "efficiency": 0.311},  # Vidur a100_dgx send/recv fit
}
"""Links the checks need that the catalog does not have."""


@dataclass(frozen=True)
class Result:
    """One check: published beside kvcargo; ``rel_diff`` = kvcargo / published − 1."""

    group: str
    what: str
    source: str
    published: str
    kvcargo: str
    value: float | None
    rel_diff: float | None
    status: str
    """ok, gap (kvcargo's model differs from a measurement: reported), FAIL, or skipped."""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def groups() -> dict[str, str]:
    """Group name → title."""
    return data.groups("validate.toml")


def checks() -> list[dict[str, Any]]:
    """The checks as data."""
    return [dict(c) for c in data.load("validate.toml")["check"]]


def parse(published: str) -> tuple[float, str, int]:
    """``"2.25 MiB"`` → (2.25, "MiB", 2 decimals)."""
    text, _, unit = published.strip().partition(" ")
    if unit not in UNITS:
        raise KvcargoError(f"published value {published!r}: unknown unit {unit!r}")
    number = text.replace(",", "")
    digits = len(number.split(".")[1]) if "." in number else 0
    return float(number), unit, digits


def shown(value: float, unit: str, digits: int) -> str:
    """A value in a published unit, to the published digits (thousands separated); more digits
    when those would leave fewer than two significant ones (0.133 ms, not 0 ms)."""
    x = value / UNITS[unit]
    if x != 0 and abs(x) < 10 ** (1 - digits):
        digits = max(digits, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{digits}f} {unit}"


def find_trace_dir(trace_dir: str | Path | None = None) -> Path | None:
    """The first existing trace directory: the argument, ``$KVCARGO_TRACE_DIR``,
    :data:`TRACE_DIRS` under the current directory, then the built-in traces."""
    from kvcargo.workload.builtin import trace_dir as builtin_dir

    candidates = [trace_dir, os.environ.get("KVCARGO_TRACE_DIR"), *TRACE_DIRS]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return builtin_dir()


# ------------------------------------------------------------------------- what kvcargo computes


def _model(key: str):
    from kvcargo import catalog

    return catalog.builtin().model(key)


def _link(key: str):
    from kvcargo import catalog
    from kvcargo.catalog import Link

    if key in EXTRA_LINKS:
        return Link(key=key, **EXTRA_LINKS[key])
    return catalog.builtin().link(key)


@cache
def _trace_stats(path: str) -> dict[str, Any]:
    from kvcargo.workload.stats import trace_stats
    from kvcargo.workload.traces import read_trace

    return trace_stats(read_trace(path))


def compute(check: dict[str, Any], trace_dir: Path | None) -> tuple[float | None, str]:
    """kvcargo's value for a check in SI units, or (None, why it was skipped)."""
    from kvcargo.cost import shape

    kind = check["kind"]
    if check.get("link_model") == "measured":
        from kvcargo.validate_calibrated import measured_value

        return measured_value(check), ""
    if kind == "kv_per_token":
        return float(shape(_model(check["model"])).kv_per_token), ""
    if kind == "params_total":
        return float(shape(_model(check["model"])).p_total), ""
    if kind == "params_active":
        return float(shape(_model(check["model"])).p_active), ""
    if kind == "layerwise_exposed":
        from kvcargo import catalog
        from kvcargo.cost import Pool
        from kvcargo.handoff import calculate

        pool = Pool(catalog.builtin().device(check["device"]), check["devices"])
        r = calculate(_model(check["model"]), check["prompt"], _link(check["link"]), pool, send="layerwise")
        return r.exposed_s, ""
    if kind == "link_bandwidth":
        nbytes, n = check["bytes"], check["channels"]
        return nbytes / (check["latency"] + nbytes / (n * check["bandwidth"])), ""
    if kind == "trace_stat":
        if trace_dir is None:
            return None, "trace files not found (give --trace-dir or set KVCARGO_TRACE_DIR)"
        path = trace_dir / check["file"]
        if not path.is_file():
            return None, f"trace file not available: {path}"
        st = _trace_stats(str(path))
        for part in check["stat"].split("."):
            st = st[part]
        return float(st), ""
    raise KvcargoError(f"validate check {check['what']!r}: unknown kind {kind!r}")


def run(only: Iterable[str] | None = None, trace_dir: str | Path | None = None) -> list[Result]:
    """Every check of the given groups (all by default)."""
    wanted = data.chosen_groups("validate.toml", only)
    if trace_dir is not None and not Path(trace_dir).is_dir():
        raise KvcargoError(f"--trace-dir {trace_dir}: not a directory")
    tdir = find_trace_dir(trace_dir)
    out = []
    for c in checks():
        if c["group"] not in wanted:
            continue
        pub, unit, digits = parse(c["published"])
        value, why = compute(c, tdir)
        note = c.get("note", "")
        if value is None:
            out.append(Result(c["group"], c["what"], c["source"], c["published"], "—", None, None, "skipped", why))
            continue
        text = shown(value, unit, digits)
        rel = value / (pub * UNITS[unit]) - 1.0
        same = f"{value / UNITS[unit]:.{digits}f}" == f"{pub:.{digits}f}"
        ok = same or abs(rel) <= c.get("tolerance", 0.0)
        status = "ok" if ok else ("gap" if c.get("expect", "match") == "gap" else "FAIL")
        out.append(Result(c["group"], c["what"], c["source"], c["published"], text, value, rel, status, note))
    if "calibrated" in wanted:
        from kvcargo.validate_calibrated import results as calibrated_results

        out += calibrated_results()
    return out


def _pct(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "—"
    if abs(x) < 0.0005:
        return "0.0%"
    return f"{100 * x:+.1f}%"


def render(results: list[Result], sources: bool = True) -> str:
    """Published beside kvcargo with the relative difference, grouped; notes below each group."""
    from kvcargo.report.text import table

    titles = groups()
    blocks = []
    for g in dict.fromkeys(r.group for r in results):
        rs = [r for r in results if r.group == g]
        rows = [[r.what, r.published, r.kvcargo, _pct(r.rel_diff), r.status] for r in rs]
        block = f"{titles[g]}\n" + table(["check", "published", "kvcargo", "diff", "status"], rows, "lrrrl")
        if sources:
            notes = [f"  - {r.what}: {r.note} (published: {r.source})" for r in rs
                     if r.note and r.status != "skipped"]
            notes += [f"  - skipped: {why}" for why in dict.fromkeys(r.note for r in rs if r.status == "skipped")]
            if notes:
                block += "\n" + "\n".join(notes)
        blocks.append(block)
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "gap", "FAIL", "skipped")}
    blocks.append(f"{len(results)} checks: {counts['ok']} ok, {counts['gap']} gaps reported, "
                  f"{counts['FAIL']} failed, {counts['skipped']} skipped")
    return "\n\n".join(blocks)
