"""Request streams: the seeded generator of the reference and readers for real traces."""

from kvcargo.workload.stream import Workload
from kvcargo.workload.generator import LengthDist, generate

__all__ = ["Workload", "LengthDist", "generate"]
