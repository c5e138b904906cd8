"""Run a grid: one plain row per run, written to CSV (and Parquet), resumable.

A row is a flat dict: ``key`` (a hash of the run's whole configuration, see
:func:`~kvcargo.planner.grid.point_key`), ``status`` (``ok`` or ``error``), ``error`` (the one-line
message of a failed run), every configuration field, then every scalar of the run's summary (SI
units; the per-instance list is left out; a summary key that is also a configuration field gets a
``sim_`` prefix). Rows come back in grid order whatever ran them, so the same sweep gives equal
rows on every backend.

The CSV is rewritten atomically (sorted, complete) every few seconds and at the end, so an
interrupted sweep leaves a valid file; running the same sweep again skips the rows already in it
(failed rows too, unless ``retry_failed``). Rows of other grids already in the file are kept.
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcargo.errors import KvcargoError
from kvcargo.outputs import atomic_path
from kvcargo.planner.backends import Backend, InlineBackend, TaskError
from kvcargo.planner.grid import FIELDS, Grid, coerce, point_key

HEAD = ("key", "status", "error")
CHECKPOINT_S = 2.0


def _plain(v: Any) -> Any:
    """Python scalars only (numpy numbers → float/int; tuples → ``;``-joined text)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, tuple | list):
        return ";".join(str(x) for x in v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    try:  # numpy scalars
        return v.item()
    except AttributeError:
        return str(v)


def config_columns(point: dict[str, Any]) -> dict[str, Any]:
    return {name: _plain(point.get(name)) for name in FIELDS}


def summary_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """The scalars of a summary, renamed ``sim_<key>`` where they clash with a config field."""
    out = {}
    for k, v in summary.items():
        if isinstance(v, dict | list | tuple):
            continue
        out[f"sim_{k}" if k in FIELDS or k in HEAD else k] = _plain(v)
    return out


def make_row(point: dict[str, Any], summary: dict[str, Any] | None = None, error: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"key": point_key(point), "status": "error" if error else "ok", "error": error or ""}
    row.update(config_columns(point))
    if summary is not None:
        row.update(summary_columns(summary))
    return row


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Simulate one grid point; a failure becomes a row carrying its error."""
    from kvcargo.config import SimConfig
    from kvcargo.planner.backends import describe_exception
    from kvcargo.simulation import simulate

    try:
        config = SimConfig.build(**{k: v for k, v in point.items() if k in FIELDS})
        summary = simulate(config).summary
    except Exception as exc:  # noqa: BLE001 - the sweep goes on
        return make_row(point, error=describe_exception(exc))
    return make_row(point, summary)


# ---------------------------------------------------------------------------------- CSV I/O


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _parse_cell(column: str, text: str) -> Any:
    """A CSV cell typed back: the head as text, config fields by their type, the rest by shape.

    Kept rather than a pyarrow CSV reader: pyarrow types a column by what its cells look like
    (a float field whose cells read ``8`` comes back int64), while a resumed sweep's cells must
    equal fresh rows field by field; SimConfig's own field types (:func:`coerce`) are the schema,
    and pyarrow stays optional (Parquet output only)."""
    if column in HEAD or column == "catalog":
        return text
    if text == "":
        return None
    if column in FIELDS:
        try:
            return coerce(column, text)
        except KvcargoError:
            return _parse(text)
    return _parse(text)


def _parse(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every column, in first-seen order (head, config fields, then summary keys)."""
    cols: dict[str, None] = dict.fromkeys(HEAD)
    cols.update(dict.fromkeys(FIELDS))
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """All rows, atomically (write a temporary file, then rename it over ``path``)."""
    cols = columns_of(rows)
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in cols])


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a sweep CSV (typed back: numbers, booleans, empty → None)."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or "key" not in reader.fieldnames:
                raise KvcargoError(f"{path} is not a kvcargo sweep file (no 'key' column); "
                                   "use another --out or delete it")
            return [{k: _parse_cell(k, v) for k, v in r.items()} for r in reader]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise KvcargoError(f"cannot read {path}: {exc}") from None


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> bool:
    """Write rows as Parquet when pyarrow is installed; False when it is not."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    cols = columns_of(rows)
    data = {}
    for c in cols:
        values = [r.get(c) for r in rows]
        kinds = {type(v) for v in values if v is not None}
        if kinds <= {int, float} and float in kinds:
            values = [None if v is None else float(v) for v in values]
        elif len(kinds) > 1:
            values = [None if v is None else str(v) for v in values]
        data[c] = values
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(data), str(tmp))
    return True


def output_paths(out: str | Path) -> tuple[Path, Path]:
    """(CSV, Parquet) paths for ``--out``: ``x.csv`` → x.csv + x.parquet (and the other way)."""
    p = Path(out)
    if p.suffix == ".parquet":
        return p.with_suffix(".csv"), p
    return p, p.with_suffix(".parquet") if p.suffix == ".csv" else p.with_name(p.name + ".parquet")


# ------------------------------------------------------------------------------------ runs


@dataclass
class SweepResult:
    """Rows in grid order (then rows of earlier grids found in the file), and what happened."""

    rows: list[dict[str, Any]]
    grid: Grid
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    """Rows of this grid that failed (this time or in an earlier run)."""
    kept: int = 0
    """Rows of other grids found in the output file and kept."""
    wall_s: float = 0.0
    csv_path: Path | None = None
    parquet_path: Path | None = None

    @property
    def grid_rows(self) -> list[dict[str, Any]]:
        return self.rows[: len(self.rows) - self.kept]


def run_sweep(grid: Grid, backend: Backend | None = None, out: str | Path | None = None, *,
              resume: bool = True, retry_failed: bool = False, progress: bool = False,
              fn: Callable[[dict[str, Any]], dict[str, Any]] = run_point) -> SweepResult:
    """Run every point of ``grid`` not already in ``out``; return all rows in grid order."""
    t0 = time.perf_counter()
    backend = backend or InlineBackend()
    points = grid.points()
    keys = [point_key(p) for p in points]
    csv_path, parquet_path = output_paths(out) if out is not None else (None, None)
    previous: dict[str, dict[str, Any]] = {}
    if csv_path is not None and csv_path.exists():
        if resume:
            previous = {r["key"]: r for r in read_csv(csv_path)}
        else:
            csv_path.unlink()
    done: dict[str, dict[str, Any]] = {}
    for k in keys:
        r = previous.get(k)
        if r is not None and (r.get("status") == "ok" or not retry_failed):
            done[k] = r
    todo = [i for i, k in enumerate(keys) if k not in done]
    skipped = len(done)
    wanted = set(keys)
    extra = [r for k, r in previous.items() if k not in wanted]  # rows of an earlier, other grid

    def ordered() -> list[dict[str, Any]]:
        return [done[k] for k in dict.fromkeys(keys) if k in done] + extra

    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="run", desc="sweep", file=sys.stderr, dynamic_ncols=True,
                   smoothing=0.05)
    last = time.monotonic()
    failed = 0
    try:
        for j, result in backend.map(fn, [points[i] for i in todo]):
            i = todo[j]
            if isinstance(result, TaskError):
                result = make_row(points[i], error=result.message)
            if result["status"] != "ok":
                failed += 1
            done[keys[i]] = result
            if bar is not None:
                bar.update(1)
                if failed:
                    bar.set_postfix_str(f"{failed} failed", refresh=False)
            if csv_path is not None and time.monotonic() - last > CHECKPOINT_S:
                write_csv(ordered(), csv_path)
                last = time.monotonic()
    finally:
        if bar is not None:
            bar.close()
        if csv_path is not None and (todo or not csv_path.exists()):
            write_csv(ordered(), csv_path)
    rows = ordered()
    failed = sum(1 for k in dict.fromkeys(keys) if done[k].get("status") != "ok")
    wrote_parquet = None
    if parquet_path is not None and rows and write_parquet(rows, parquet_path):
        wrote_parquet = parquet_path
    return SweepResult(rows, grid, ran=len(todo), skipped=skipped, failed=failed, kept=len(extra),
                       wall_s=time.perf_counter() - t0, csv_path=csv_path, parquet_path=wrote_parquet)
