"""The built-in traces: real request streams shipped with the package, named by key.

The files live in ``kvcargo/data/traces`` with their licences (see the README there); a key such
as ``mooncake-conversation`` can be given wherever a trace file is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class BuiltinTrace:
    key: str
    file: str
    source: str
    licence: str


TRACES = {t.key: t for t in (
    BuiltinTrace("mooncake-conversation", "mooncake_conversation.jsonl",
                 "Mooncake FAST'25 release (kvcache-ai/Mooncake), conversation trace", "Apache-2.0"),
    BuiltinTrace("mooncake-synthetic", "mooncake_synthetic.jsonl",
                 "Mooncake FAST'25 release (kvcache-ai/Mooncake), synthetic trace", "Apache-2.0"),
    BuiltinTrace("azure-code-2023", "azure2023_code.csv",
                 "Azure LLM inference trace 2023 (Azure/AzurePublicDataset), coding", "CC-BY-4.0"),
    BuiltinTrace("azure-conv-2023", "azure2023_conv.csv",
                 "Azure LLM inference trace 2023 (Azure/AzurePublicDataset), conversation", "CC-BY-4.0"),
)}
"""Built-in traces by key."""


def trace_dir() -> Path:
    return Path(str(resources.files("kvcargo").joinpath("data", "traces")))


def resolve_trace(name: str | Path) -> Path:
    """The file of a built-in trace key, or ``name`` itself as a path (a file of that name wins)."""
    p = Path(name)
    if str(name) in TRACES and not p.exists():
        return trace_dir() / TRACES[str(name)].file
    return p
