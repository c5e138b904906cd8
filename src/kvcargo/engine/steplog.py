"""The decode step log folded while the engine writes it, for a run that keeps only its summary.

The summary reads of the log only each instance's step ends in order (the token gaps) and its
number of steps and sum of batch sizes. The engine pauses whenever its log is full
(``cluster.run``'s ``stop``); each full log is folded here and emptied, so a long run holds its
steps' ends (8 bytes a step) instead of the whole log (24), and no log larger than a chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcargo.engine.state import I_NSTEPS, LOG_BATCH, LOG_END, LOG_INST, LOG_INT, State

CHUNK_STEPS = 1 << 20
"""Steps the engine logs between folds (24 MB of log)."""


class FoldedSteps(NamedTuple):
    """A run's decode steps, per decode (or colocated) instance."""

    ends: np.ndarray
    """Every step's end, grouped by instance (instance 0's steps first), each instance's in order."""
    rows: np.ndarray
    """Per instance: its number of steps."""
    batch: np.ndarray
    """Per instance: the sum of its steps' batch sizes."""

    def instances(self) -> np.ndarray:
        """Per step of :attr:`ends`, its instance (as the log's column)."""
        return np.repeat(np.arange(len(self.rows), dtype=LOG_INT), self.rows)


class StepFold:
    """Folds step logs of ``n_inst`` instances (:meth:`take`), then the whole (:meth:`steps`)."""

    def __init__(self, n_inst: int) -> None:
        self.n_inst = max(1, n_inst)
        self.pieces: list[list[np.ndarray]] = [[] for _ in range(self.n_inst)]
        self.rows = np.zeros(self.n_inst, dtype=np.int64)
        self.batch = np.zeros(self.n_inst, dtype=np.int64)

    def take(self, logf: np.ndarray, logi: np.ndarray) -> None:
        """Fold logged steps (columns as ``State.logf``, ``State.logi``) that follow those taken."""
        inst = logi[:, LOG_INST]
        # a stable sort keeps each instance's steps in order (radix sort on 16-bit keys)
        order = np.argsort(inst.astype(np.int16 if self.n_inst < 1 << 15 else np.int32), kind="stable")
        ends = logf[order, LOG_END]
        rows = np.bincount(inst, minlength=self.n_inst)
        self.batch += np.bincount(inst, weights=logi[:, LOG_BATCH], minlength=self.n_inst).astype(np.int64)
        for i, part in enumerate(np.split(ends, np.cumsum(rows)[:-1])):
            if len(part):
                self.pieces[i].append(part)
        self.rows += rows

    def stop(self, st: State) -> bool:
        """``cluster.run``'s ``stop``: fold the full log and go on (the run then empties it)."""
        k = int(st.i[I_NSTEPS])
        self.take(st.logf[:k], st.logi[:k])
        return False

    def steps(self) -> FoldedSteps:
        """Every step folded, the ends in one array (each piece freed once copied into it)."""
        ends = np.empty(int(self.rows.sum()))  # pages committed as the pieces are copied in
        at = 0
        for pieces in self.pieces:
            while pieces:
                part = pieces.pop(0)
                ends[at:at + len(part)] = part
                at += len(part)
        return FoldedSteps(ends, self.rows.copy(), self.batch.copy())
