"""Reading a user's measurement CSVs (``kvcargo calibrate``): every malformed file, row or cell is
a one-line :class:`KvcargoError` naming the file, the line and the cell, never a traceback or a
fit to garbage (a non-finite or non-positive time would fit constants of nan or 0)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from kvcargo.errors import KvcargoError, shown

Row = tuple[int, dict[str, str | None]]
"""(line number, the row's cells by column; a missing cell is None)."""


def read(path: str | Path) -> tuple[list[str], list[Row]]:
    """The header and the rows of a UTF-8 CSV with a header line."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            rows = [(reader.line_num, r) for r in reader]
            return list(reader.fieldnames or []), rows
    except OSError as exc:
        raise KvcargoError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise KvcargoError(f"{path}: not UTF-8 text (a CSV file is expected)") from None
    except csv.Error as exc:
        raise KvcargoError(f"{path}: not a CSV file ({exc})") from None


def count(path: str | Path, line: int, row: dict[str, str | None], column: str) -> int:
    """An integer cell that must be >= 1 (a batch, a TP degree, a token count)."""
    cell = row.get(column)
    try:
        value = int(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise KvcargoError(f"{path}, line {line}: {column} must be an integer >= 1, got {_cell(cell)}")
    return value


def positive(path: str | Path, line: int, row: dict[str, str | None], column: str) -> float:
    """A finite number > 0 (a time, a size)."""
    cell = row.get(column)
    try:
        value = float(cell)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise KvcargoError(f"{path}, line {line}: {column} must be a finite number > 0, got {_cell(cell)}")
    return value


def _cell(cell: str | None) -> str:
    return "nothing (the row is short)" if cell is None else shown(cell)
