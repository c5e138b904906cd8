"""Request streams: the seeded generator of the reference and readers for real traces."""

from kvcargo.workload.generator import LengthDist, generate
from kvcargo.workload.stream import Workload

__all__ = ["LengthDist", "Workload", "generate"]
