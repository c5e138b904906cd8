"""The command line that rebuilds a configuration (the planner's suggested commands)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from kvcargo.config import SimConfig
from kvcargo.params import flag


def command_line(config: SimConfig, exclude: Iterable[str] = ()) -> str:
    """The flags that rebuild ``config`` (only those that differ from the defaults)."""
    skip = set(exclude)
    parts: list[str] = []
    for name, info in SimConfig.model_fields.items():
        v = getattr(config, name)
        if name in skip or v == info.default:
            continue
        option = flag(name)
        if isinstance(v, bool):
            parts.append(option)
        elif isinstance(v, tuple):
            for x in v:
                parts += [option, shlex.quote(str(x))]
        elif isinstance(v, float):
            parts += [option, str(int(v)) if v.is_integer() else repr(v)]
        else:
            parts += [option, shlex.quote(str(v))]
    return " ".join(parts)
