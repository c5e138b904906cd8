"""``kvcargo calibrate``: fit the calibrated models' free constants to a user's measurements and
write them as a catalog overlay (``--catalog FILE`` applies it).

* step times or per-request TTFT/TPOT (``--steps CSV``): per (device, TP) the framework constants of
  :mod:`kvcargo.calibration_fit`, written into the device's ``framework`` field;
* a send/recv curve (``--send-recv CSV --link KEY``): the link's ``message_overhead_s`` and
  ``efficiency`` (:mod:`kvcargo.linkmodel`).

A catalog entry in an overlay replaces the built-in one, so the overlay repeats every field of
the entries it changes. The report gives the fit's error on the rows it was fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcargo import catalog as catalog_mod
from kvcargo.calibrated import KNEE_TOKENS
from kvcargo.calibration_fit import Framework, fit, kernel_time, predict, read_steps
from kvcargo.catalog import Catalog
from kvcargo.errors import KvcargoError
from kvcargo.linkmodel import fit_send_recv, message_s, read_send_recv


@dataclass(frozen=True)
class FitReport:
    """One fitted group: what, how many rows, median and p90 of |fit / measured − 1|."""

    what: str
    rows: int
    median: float
    p90: float


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + " }"
    return repr(v)


def overlay(entries: dict[str, dict[str, dict]]) -> str:
    """Catalog entries (kind → key → fields) as TOML."""
    lines = ["# kvcargo catalog overlay written by kvcargo calibrate (apply with --catalog)", ""]
    for kind, table in entries.items():
        for key, fields in table.items():
            lines.append(f'[{kind}."{key}"]')
            lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items() if v is not None and v != {}]
            lines.append("")
    return "\n".join(lines)


def _stats(errors: list[float]) -> tuple[float, float]:
    a = np.abs(np.array(errors))
    return float(np.median(a)), float(np.percentile(a, 90))


def calibrate_steps(path: str | Path, cat: Catalog, catalog_files: tuple[str, ...] = ()) -> tuple[dict, list[FitReport]]:
    """Framework constants fitted to a step-time CSV: overlay device entries and the fit report."""
    rows = read_steps(path)
    unknown = sorted({r.model for r in rows if r.model not in cat.models})
    rows = [r for r in rows if r.model in cat.models]
    if not rows:
        raise KvcargoError(f"{path}: no step rows of a catalog model (found {', '.join(unknown) or 'none'})")
    table = fit(rows, catalog_files)
    reports = [FitReport(f"skipped: {m} (not in the catalog)", 0, float("nan"), float("nan")) for m in unknown]
    for (dev, tp) in sorted(table):
        for phase in ("prefill", "decode"):
            errs = [predict(r, table, catalog_files) / r.measured_s - 1 for r in rows
                    if r.device == dev and r.tp == tp and r.phase == phase]
            if errs:
                reports.append(FitReport(f"{dev} TP{tp} {phase}", len(errs), *_stats(errs)))
    reports += _large_step_reports(rows, table, catalog_files)
    devices: dict[str, dict] = {}
    for (dev, tp), f in table.items():
        base = cat.device(dev)
        entry = devices.setdefault(dev, base.model_dump(exclude={"key", "framework"}))
        entry.setdefault("framework", {})[f"tp{tp}"] = dict(vars(f))
    return {"devices": devices}, reports


def _large_step_reports(rows: list, table: dict, catalog_files: tuple[str, ...]) -> list[FitReport]:
    """Per device with prefill rows: the large-step factor and the fit on the steps past the knee
    at TP > 2 it was fitted to, or why it is 0 (no such step: nothing says the engine jumps there)."""
    out = []
    for dev in sorted({r.device for r in rows if r.phase == "prefill"}):
        past = [r for r in rows if r.device == dev and r.phase == "prefill"
                and kernel_time(r, catalog_files).past_knee > 0]
        large = next(f.large_step for (d, _), f in table.items() if d == dev)
        if past:
            errs = [predict(r, table, catalog_files) / r.measured_s - 1 for r in past]
            out.append(FitReport(f"{dev}: large_step {large:.3g} (fitted to the prefill steps past "
                                 f"{KNEE_TOKENS:,.0f} tokens at TP > 2)", len(past), *_stats(errs)))
        else:
            out.append(FitReport(f"{dev}: large_step 0 (no prefill step past {KNEE_TOKENS:,.0f} tokens "
                                 "at TP > 2 to fit it)", 0, float("nan"), float("nan")))
    return out


def calibrate_link(path: str | Path, link_key: str, cat: Catalog, within_node: bool = False) -> tuple[dict, list[FitReport]]:
    """A link's measured constants fitted to a send/recv curve."""
    link = cat.link(link_key)
    sizes, times = read_send_recv(path, across_nodes=not within_node)
    fitted = fit_send_recv(sizes, times, link.bandwidth)
    if fitted["efficiency"] > 1:
        raise KvcargoError(f"{path}: the curve reaches {fitted['efficiency']:.2f}× the line rate of {link_key} "
                           f"({link.bandwidth:g} B/s): wrong link, or --within-node")
    new = link.model_copy(update=fitted)
    errs = (message_s(new, sizes) / times - 1).tolist()
    entry = new.model_dump(exclude={"key"})
    return {"links": {link_key: entry}}, [FitReport(f"{link_key} send/recv", len(errs), *_stats(errs))]


def import_tables(system: str, device: str, tables: str, cat: Catalog, data_root: str | None = None) -> dict:
    """Convert an aiconfigurator system's tables to ``tables`` (.npz) and point ``device`` at them."""
    from kvcargo.aiconfigurator_import import import_system

    base = cat.device(device)
    import_system(system, tables, data_root)
    return {"devices": {device: {**base.model_dump(exclude={"key"}), "kernel_tables": str(Path(tables).resolve())}}}


def calibrate(steps: str | None = None, send_recv: str | None = None, link: str | None = None,
              within_node: bool = False, catalog_files: tuple[str, ...] = (), import_system: str | None = None,
              device: str | None = None, tables: str | None = None,
              data_root: str | None = None) -> tuple[str, list[FitReport]]:
    """The overlay TOML and the fit report for the measurements (or kernel tables) given."""
    if steps is None and send_recv is None and import_system is None:
        raise KvcargoError("give --steps CSV (step times), --send-recv CSV --link KEY (a send/recv curve) "
                           "or --import-aiconfigurator SYSTEM --device KEY --tables FILE.npz")
    if (import_system is None) != (device is None) or (import_system is None) != (tables is None):
        raise KvcargoError("--import-aiconfigurator, --device and --tables go together (the system, the catalog "
                           "device it measures, the .npz to write)")
    if (send_recv is None) != (link is None):
        raise KvcargoError("--send-recv and --link go together (the curve, and the catalog link it measures)")
    cat = catalog_mod.load(catalog_files)
    entries: dict[str, dict] = {}
    reports: list[FitReport] = []
    if import_system is not None and device is not None and tables is not None:
        entries.update(import_tables(import_system, device, tables, cat, data_root))
    if steps is not None:
        e, r = calibrate_steps(steps, cat, catalog_files)
        entries.update(e)
        reports += r
    if send_recv is not None and link is not None:
        e, r = calibrate_link(send_recv, link, cat, within_node)
        entries.update(e)
        reports += r
    return overlay(entries), reports


__all__ = ["FitReport", "Framework", "calibrate", "overlay"]
