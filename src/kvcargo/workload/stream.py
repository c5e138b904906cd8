"""A request stream as parallel arrays (no per-request Python objects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kvcargo.errors import KvcargoError

if TYPE_CHECKING:
    from kvcargo.workload.sessions import Sessions

BLOCK_TOKENS = 512
"""Tokens per prompt block of a Mooncake trace's ``hash_ids``."""


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order: arrival time (s), prompt and output lengths (tokens).

    ``hash_ids`` (optional) holds, per request, the ids of its 512-token prompt blocks as a
    flat array with offsets (Mooncake traces); equal ids mean a shared prefix.
    """

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    source: str = "generated"
    block_ids: np.ndarray | None = field(default=None, repr=False)
    block_offsets: np.ndarray | None = field(default=None, repr=False)
    clipped_prompts: int = 0
    """Generated prompt lengths the generator's bounds clipped (a trace's are never clipped)."""
    clipped_outputs: int = 0
    """Generated output lengths the generator's bounds clipped."""
    sessions: Sessions | None = field(default=None, repr=False)
    """Multi-turn sessions (prefix chains, closed-loop turns); later turns' arrivals are
    placeholders set during the run."""

    def __post_init__(self) -> None:
        n = len(self.arrival)
        if n == 0:
            raise KvcargoError(f"workload {self.source}: no requests")
        if len(self.prompt) != n or len(self.output) != n:
            raise KvcargoError(f"workload {self.source}: arrival, prompt and output differ in length")
        if not np.all(np.isfinite(self.arrival)) or np.any(self.arrival < 0):
            raise KvcargoError(f"workload {self.source}: arrival times must be finite and >= 0")
        roots = self.arrival if self.sessions is None else self.arrival[self.sessions.predecessor < 0]
        if np.any(np.diff(roots) < 0):
            raise KvcargoError(f"workload {self.source}: arrival times must not decrease")
        if np.any(self.prompt < 1) or np.any(self.output < 1):
            raise KvcargoError(f"workload {self.source}: prompt and output lengths must be >= 1 token")

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def total_prompt_tokens(self) -> int:
        return int(self.prompt.sum())

    @property
    def total_output_tokens(self) -> int:
        return int(self.output.sum())
