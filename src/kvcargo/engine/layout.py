"""A table of the engine declared once: its columns' names in order, their dtype and the value a
fresh row holds.

Everything else follows from the declaration: the column numbers the kernels index with (published
as plain module-level integers, which numba freezes into the machine code as constants, exactly as
hand-written ones), the table's width, and fresh arrays (``new``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Table:
    """Columns ``NAME=fresh value`` in order, of one dtype (``Table(np.int64, HEAD=-1, N=0)``)."""

    def __init__(self, dtype: Any, **columns: float) -> None:
        self.dtype = np.dtype(dtype)
        self.names = tuple(columns)
        self.fresh = np.array(list(columns.values()), dtype=self.dtype)

    @property
    def width(self) -> int:
        return len(self.names)

    @property
    def numbers(self) -> tuple[int, ...]:
        """The column numbers in order (``A, B = Table(..., A=0, B=0).numbers``)."""
        return tuple(range(self.width))

    @property
    def index(self) -> dict[str, int]:
        """Column name → column number."""
        return {name: i for i, name in enumerate(self.names)}

    def __getitem__(self, name: str) -> int:
        """The number of column ``name``."""
        return self.names.index(name)

    def new(self, *rows: int, order: str = "C") -> np.ndarray:
        """A table of ``rows`` (none: one row as a vector) with every row fresh; ``order="F"``
        stores it column by column (each column a contiguous array)."""
        if not self.fresh.any() or order == "F":  # zeros: pages are only committed once written
            out = np.zeros((*rows, self.width), dtype=self.dtype, order=order)
            for c in np.flatnonzero(self.fresh):  # column by column: a zero column stays unwritten
                out[..., c] = self.fresh[c]
            return out
        out = np.empty((*rows, self.width), dtype=self.dtype)
        out[...] = self.fresh
        return out

    def span(self, first: str, last: str) -> slice:
        """The columns from ``first`` to ``last``, both included."""
        return slice(self.names.index(first), self.names.index(last) + 1)


def publish(namespace: dict[str, Any], *tables: Table) -> None:
    """Bind every column number of ``tables`` as a module-level integer of ``namespace`` (the
    engine's kernels import them by name); a name declared twice is an error."""
    for table in tables:
        for name, i in table.index.items():
            if name in namespace:
                raise ValueError(f"engine column {name} is declared twice")
            namespace[name] = i
