"""The decode step log folded while the engine writes it, for a run that keeps only its summary.

The summary reads of the log only each instance's step ends in order (the token gaps) and its
number of steps and sum of batch sizes. The engine pauses whenever its log is full
(``cluster.run``'s ``stop``); each full log is folded here and emptied, so a long run holds its
steps' ends (8 bytes a step) instead of the whole log (24), and no log larger than a chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvcargo._jit import kernel
from kvcargo.engine.state import I_NSTEPS, LOG_BATCH, LOG_END, LOG_INST, LOG_INT, State
from kvcargo.stats import Sample

CHUNK_STEPS = 1 << 20
"""Steps the engine logs between folds (24 MB of log)."""


@kernel
def step_positions(log_inst, n_inst):
    """The logged steps grouped by instance, each in log order (positions → log index), and
    where each instance's group starts: a counting sort, two passes over the log."""
    start = np.zeros(n_inst + 1, dtype=np.int64)
    for g in range(log_inst.shape[0]):
        start[log_inst[g] + 1] += 1
    for i in range(n_inst):
        start[i + 1] += start[i]
    order = np.empty(log_inst.shape[0], dtype=np.int64)
    fill = start[:n_inst].copy()
    for g in range(log_inst.shape[0]):
        order[fill[log_inst[g]]] = g
        fill[log_inst[g]] += 1
    return order, start


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


class GapFold(StepFold):
    """A windowed run's token-gap sample (``kvcargo.metrics.itl_sample``'s, bit for bit), built
    as its requests settle, holding only the steps a request still to be taken may need.

    Per instance it holds the step ends from ordinal ``lo`` and, from ``base`` on, each step's
    change in the number of steady requests past their first step (``delta``). A steady request
    taken (:meth:`spans`) adds its first gap and marks its steps; steps that no request still to
    be taken can reach are added to the sample with their counts as weights (:meth:`flush`).
    Requests that may fall in the warm-up are only known at the end: the steps they reach (the
    ``early`` ends, kept once they are known: :meth:`keep_early`) are added again at the end
    (:meth:`close`) with the counts of those that did not — the same multiset of gaps."""

    def __init__(self, n_inst: int, sample: Sample) -> None:
        super().__init__(n_inst)
        self.sample = sample
        self.ends = [np.zeros(0) for _ in range(self.n_inst)]
        self.delta = [np.zeros(1, dtype=np.int64) for _ in range(self.n_inst)]
        self.lo = np.zeros(self.n_inst, dtype=np.int64)
        self.base = np.zeros(self.n_inst, dtype=np.int64)
        self.level = np.zeros(self.n_inst, dtype=np.int64)
        self.early: list[np.ndarray] | None = None

    def take(self, logf: np.ndarray, logi: np.ndarray) -> None:
        before = self.rows.copy()
        super().take(logf, logi)
        for i in range(self.n_inst):
            if self.rows[i] > before[i]:
                new = np.concatenate(self.pieces[i])
                self.pieces[i] = []
                self.ends[i] = np.concatenate([self.ends[i], new])
                self.delta[i] = np.concatenate([self.delta[i], np.zeros(len(new), dtype=np.int64)])

    def spans(self, inst: np.ndarray, first: np.ndarray, output: np.ndarray, first_token: np.ndarray) -> None:
        """Steady requests with token gaps (their decode instance, first step ordinal, output,
        first token; every one of their steps folded and not flushed)."""
        for i in np.unique(inst).tolist():
            sel = inst == i
            k, out = first[sel], output[sel]
            self.sample.add(self.ends[i][k - self.lo[i]] - first_token[sel], np.ones(len(k), dtype=np.int64))
            d = self.delta[i]  # ordinals from base; one past the last folded step
            np.add.at(d, k + 1 - self.base[i], 1)  # from its second step ...
            np.add.at(d, k + out - 1 - self.base[i], -1)  # ... to its last

    def flush(self, below: np.ndarray) -> None:
        """Add to the sample every step of instance i below ordinal ``below[i]`` (no request
        still to be taken has a step before it), and let go of what no one needs any more."""
        for i in range(self.n_inst):
            stop = min(int(below[i]), int(self.rows[i]))
            m = stop - int(self.base[i])
            if m <= 0:
                continue
            b = int(self.base[i]) - int(self.lo[i])
            ends, d = self.ends[i], self.delta[i]
            weights = self.level[i] + np.cumsum(d[:m])
            if b == 0 and self.lo[i] == 0:  # an instance's first step has no gap (no weight either)
                self.sample.add(ends[1:m] - ends[:m - 1], weights[1:])
            else:
                self.sample.add(ends[b:b + m] - ends[b - 1:b + m - 1], weights)
            self.level[i] = weights[-1]
            self.delta[i] = d[m:].copy()
            self.base[i] = stop
            if self.early is not None:  # keep the last end flushed (the next gap's start)
                cut = stop - 1 - int(self.lo[i])
                if cut > len(ends) // 2:
                    self.ends[i] = ends[cut:].copy()
                    self.lo[i] += cut

    def keep_early(self, inst: np.ndarray, first: np.ndarray, output: np.ndarray) -> None:
        """Keep the ends of the steps that requests which may fall in the warm-up reach (their
        columns as :meth:`spans`); every one of them has been folded."""
        self.early = []
        for i in range(self.n_inst):
            sel = inst == i
            last = int((first[sel] + output[sel] - 1).max()) if sel.any() else 0
            assert self.lo[i] == 0
            self.early.append(self.ends[i][:last].copy())

    def steps(self) -> FoldedSteps:
        """The steps' counts and batch sums (their ends went into the sample: ``ends`` is empty)."""
        return FoldedSteps(np.zeros(0), self.rows.copy(), self.batch.copy())

    def close(self, inst: np.ndarray, first: np.ndarray, output: np.ndarray, first_token: np.ndarray) -> None:
        """The end: flush every step, then add the gaps of the requests past the warm-up among
        those held (their columns as :meth:`spans`)."""
        self.flush(self.rows)
        if self.early is None:
            self.keep_early(inst, first, output)
        for i in range(self.n_inst):
            sel = inst == i
            if not sel.any():
                continue
            k, out, ends = first[sel], output[sel], self.early[i]
            self.sample.add(ends[k] - first_token[sel], np.ones(len(k), dtype=np.int64))
            level = np.cumsum(np.bincount(k + 1, minlength=len(ends) + 1)[:len(ends)]
                              - np.bincount(k + out - 1, minlength=len(ends) + 1)[:len(ends)])
            self.sample.add(ends[1:] - ends[:-1], level[1:])
        self.early = None
