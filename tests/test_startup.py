"""What a process loads: commands that only compute a few numbers never load the simulator or
numba; small runs stay plain Python; the engine compiled ahead of time gives the plain results.

Each check runs in a fresh interpreter (imports are per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from kvcargo.cli import main
try:
    main({args!r})
except SystemExit:
    pass
seen = {{"numba": "numba" in sys.modules, "engine": "kvcargo.engine.loop" in sys.modules}}
if seen["engine"]:
    from kvcargo.engine import aot
    seen["aot"] = aot.in_use()
print(json.dumps(seen), file=sys.stderr)
"""


def loaded(args: list[str], tmp_path: Path, jit: str | None = None) -> tuple[str, dict]:
    """stdout of ``kvcargo ARGS`` and what the process had loaded at the end."""
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("KVCARGO_JIT", None)
    if jit is not None:
        env["KVCARGO_JIT"] = jit
    p = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
    return p.stdout, json.loads(p.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["handoff"], ["--help"], ["catalog", "links"], ["handoff", "--links", "--json"]])
def test_the_calculator_and_the_catalog_never_load_the_engine(tmp_path: Path, args: list[str]) -> None:
    out, mods = loaded(args, tmp_path)
    assert out and mods == {"numba": False, "engine": False}


def test_a_small_run_stays_plain_python_with_the_plain_results(tmp_path: Path) -> None:
    auto, mods = loaded(["simulate", "--requests", "300", "--json"], tmp_path)
    plain, _ = loaded(["simulate", "--requests", "300", "--json"], tmp_path, jit="0")
    assert mods == {"numba": False, "engine": True, "aot": False}
    assert auto == plain and not list((tmp_path / "cache").glob("engine-*"))  # no engine was built for it


def test_the_engine_compiled_ahead_of_time_serves_later_processes_without_numba(tmp_path: Path) -> None:
    flags = ["simulate", "--requests", "300", "--link", "eth-25g", "--send", "layerwise", "--json"]
    forced, mods = loaded(flags, tmp_path, jit="1")  # builds the module
    assert mods["aot"] and list((tmp_path / "cache").glob("engine-*/kvcargo_engine_aot*.types"))
    later, mods = loaded(flags, tmp_path)
    assert mods == {"numba": False, "engine": True, "aot": True}
    plain, _ = loaded(flags, tmp_path, jit="0")
    jitted, mods = loaded(flags, tmp_path, jit="jit")
    assert mods == {"numba": True, "engine": True, "aot": False}
    assert forced == later == plain == jitted
