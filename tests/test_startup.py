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
    # every export takes the arguments each engine and summary passes it (none falls back to plain Python)
    runs = [["simulate", "--requests", "300", *extra] for extra in (
        ["--json"], ["--summary-only"], ["--batch-policy", "chunked", "--kv-policy", "paged", "--json"],
        ["--batch-policy", "chunked", "--kv-policy", "paged", "--summary-only"])]
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("KVCARGO_JIT", None)
    p = subprocess.run([sys.executable, "-c", FITS_PROBE.format(runs=runs)], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
    assert p.stderr.strip().splitlines()[-1] == "[]"


FITS_PROBE = """
import io, sys, contextlib
from kvcargo.engine import aot
misses, fits = [], aot.fits
aot.fits = lambda args, spec: fits(args, spec) or misses.append(str(spec)) or False
from kvcargo.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    for args in {runs!r}:
        main(args)
print(aot.in_use() and misses, file=sys.stderr)
"""


WATCHED = ("numpy", "numpy.random", "pydantic", "pydantic.plugin._loader", "kvcargo.config", "kvcargo.cli.simulate")
"""Modules whose loading a light command must not pay for (``pydantic.plugin._loader`` is imported
when pydantic builds a model's validator)."""
MODULES_PROBE = """
import sys
from kvcargo.cli import main
try:
    main({args!r})
except SystemExit:
    pass
print(" ".join(m for m in {watched!r} if m in sys.modules), file=sys.stderr)
"""


def watched_after(args: list[str], cache: Path) -> tuple[str, set[str]]:
    """stdout of ``kvcargo ARGS`` and which of :data:`WATCHED` the process had loaded."""
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", MODULES_PROBE.format(args=args, watched=WATCHED)], capture_output=True,
                       text=True, env=env, timeout=600, check=True)
    return p.stdout, set(p.stderr.strip().splitlines()[-1].split()) if p.stderr.strip() else set()


def test_help_lists_the_commands_without_loading_them(tmp_path: Path) -> None:
    first, _ = watched_after(["--help"], tmp_path)  # an empty cache: every command is imported once
    later, mods = watched_after(["--help"], tmp_path)
    assert later == first and "simulate" in later and "handoff" in later
    assert mods == set()


@pytest.mark.parametrize("args", [["handoff", "--json"], ["handoff", "--links"],
                                  ["handoff", "--send", "layerwise", "--link-model", "measured", "--kv-compress",
                                   "kivi-2bit", "--json"]])
def test_the_calculator_builds_no_validator_and_never_imports_numpy(tmp_path: Path, args: list[str]) -> None:
    first, _ = watched_after(args, tmp_path)
    later, mods = watched_after(args, tmp_path)
    assert later == first
    assert "268.4 MB" in later if "--links" in args else json.loads(later)["kv_bytes"] == 268_435_456
    assert mods == {"pydantic"}


def test_a_repeated_simulation_takes_its_validated_configuration_from_the_cache(tmp_path: Path) -> None:
    args = ["simulate", "--requests", "300", "--link", "eth-25g", "--json"]
    first, mods = watched_after(args, tmp_path)
    assert "pydantic.plugin._loader" in mods  # validated: pydantic built SimConfig's validator
    later, mods = watched_after(args, tmp_path)
    assert later == first and json.loads(later)["config"]["link"] == "eth-25g"
    assert "pydantic.plugin._loader" not in mods and "numpy.random" not in mods  # a short stream: random.Random
    other, _ = watched_after(["simulate", "--requests", "300", "--json"], tmp_path)
    assert json.loads(other)["config"]["link"] == "ib-ndr" and other != first


def test_bad_options_are_refused_every_time(tmp_path: Path) -> None:
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(tmp_path)}
    for _ in range(2):
        p = subprocess.run([sys.executable, "-m", "kvcargo", "simulate", "--rate", "0"], capture_output=True,
                           text=True, env=env, timeout=600)
        assert p.returncode == 2 and p.stderr == "kvcargo: error: invalid --rate (got 0.0): Input should be greater than 0\n"


def test_a_configurations_values_are_its_model_dump() -> None:
    from kvcargo.config import SimConfig

    for values in ({}, {"mode": "colocated", "instances": 3}, {"catalog": ("a.toml",), "kv_compress": "fp8",
                                                                  "send": "layerwise", "rate": 3.5}):
        c = SimConfig.build(**values)
        assert c.values() == c.model_dump() and list(c.values()) == list(c.model_dump())


def test_one_hand_off_in_plain_numbers_is_the_engine_s_array_element() -> None:
    """The calculator's numbers (no numpy) equal, bit for bit, what the engine's arrays hold."""
    import numpy as np

    from kvcargo.catalog import load
    from kvcargo.cost import Pool, coefficient_values, model_coefficients, prefill_work, roofline
    from kvcargo.linkmodel import link_transfers
    from kvcargo.transfer import Compression

    cat = load()
    for m in cat.models.values():
        mi, mf = model_coefficients(m, "last")
        assert (mi.tolist(), mf.tolist()) == tuple(map(list, coefficient_values(m, "last")))
        for d in cat.devices.values():
            pool = Pool(d, 8, power_cap_w=d.idle_w + 100)
            assert pool.coefficients().tolist() == list(pool.coefficient_values())
            work = prefill_work(*coefficient_values(m), 3000, 3000 * 3001, 1)
            assert work == tuple(float(v) if isinstance(v, float) else int(v)
                                 for v in prefill_work(*model_coefficients(m), 3000, 3000 * 3001, 1))
            assert roofline(pool.coefficient_values(), *work) == roofline(pool.coefficients(), *work)
    codecs = [None, Compression(cat.codec("fp8")), Compression(cat.codec("kivi-2bit"), "endpoint"),
              Compression(cat.codec("freq-keep-k"), keep=0.3)]
    for link_model in ("line-rate", "measured"):
        for link in cat.links.values():
            for codec in codecs:
                for prompt, groups in ((100, 1), (5000, 32)):
                    kv = prompt * 131072.0
                    one = link_transfers(link_model, link, codec, kv, 2.0, prompt, groups)
                    arr = link_transfers(link_model, link, codec, np.array([kv]), 2.0, np.array([prompt]), groups)
                    for f in ("duration", "wire_bytes", "link_j", "transit_j", "transit_bound", "slice_time",
                              "last_extra"):
                        assert getattr(one, f) == getattr(arr, f)[0] and type(getattr(one, f)) in (float, bool), f


def test_uniforms_drawn_either_way_are_those_of_python_s_random() -> None:
    import random

    from kvcargo.workload.draws import PYTHON_UNIFORMS_MAX, uniforms

    for k in (1, 5000, PYTHON_UNIFORMS_MAX, PYTHON_UNIFORMS_MAX + 1):
        ours, ref = random.Random(7), random.Random(7)
        u = uniforms(ours, k)
        assert u.dtype == "float64" and u.tolist() == [ref.random() for _ in range(k)]
        assert ours.getstate() == ref.getstate()


def test_the_compiled_entry_takes_only_arguments_of_the_types_it_was_built_for() -> None:
    import numpy as np

    from kvcargo.engine import aot

    spec = aot.parse_spec(["<f8:2:C", "<i8:1:A", "i", "f"])
    grid, ids = np.zeros((3, 4)), np.arange(5)
    assert aot.fits((grid, ids, 3, 0.5), spec) and aot.fits((grid, ids[::2], np.int64(3), np.float64(1)), spec)
    for bad in [(grid.T, ids, 3, 0.5),  # not C contiguous
                (grid.astype(np.float32), ids, 3, 0.5), (grid[0], ids, 3, 0.5),  # dtype, dimensions
                (grid, ids, True, 0.5), (grid, ids, 3, 1), (grid, 7, 3, 0.5), (grid, ids, ids, 0.5),
                (grid, ids, 3)]:
        assert not aot.fits(bad, spec)
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    kept, copied = aot.writable((ids, frozen))  # type: ignore[arg-type]
    assert kept is ids and copied is not frozen and copied.flags.writeable and (copied == frozen).all()


def test_the_command_leaves_at_once_with_its_output_whole(tmp_path: Path) -> None:
    """``python -m kvcargo`` ends without the interpreter's tear-down: stdout, the files it wrote
    and the exit handlers a library registered are all there; errors still exit 2."""
    args = ["simulate", "--requests", "400", "--json", "--requests-csv"]
    p = subprocess.run([sys.executable, "-m", "kvcargo", *args, str(tmp_path / "fast.csv")], capture_output=True,
                       text=True, timeout=600, check=True)
    ordinary, _ = loaded([*args, str(tmp_path / "ordinary.csv")], tmp_path)  # main() in an interpreter that tears down
    assert p.stdout == ordinary and json.loads(p.stdout)["summary"]["completed"] == 400
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "ordinary.csv").read_bytes()
    handler = (f"import atexit, sys; atexit.register(lambda: open({str(tmp_path / 'bye')!r}, 'w').write('ran')); "
               "sys.argv = ['kvcargo', 'handoff', '--json']; from kvcargo.cli import run; run()")
    p = subprocess.run([sys.executable, "-c", handler], capture_output=True, text=True, timeout=600, check=True)
    assert json.loads(p.stdout)["kv_bytes"] == 268_435_456 and (tmp_path / "bye").read_text() == "ran"
    p = subprocess.run([sys.executable, "-m", "kvcargo", "simulate", "--model", "nope"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nope" in p.stderr


GC_PROBE = """
import gc, io, contextlib
from kvcargo.cli import cli, main
cli.pause_collector = {pause!r}
with contextlib.redirect_stdout(io.StringIO()):
    main(["handoff"])
print(gc.isenabled(), gc.get_freeze_count() > 0)
"""


@pytest.mark.parametrize("pause", [True, False])
def test_the_console_script_freezes_what_its_command_s_import_built(pause: bool) -> None:
    """With the console script's setting, importing the command leaves the collector on and the
    import's objects frozen (never scanned again); an in-process caller's objects are left alone."""
    p = subprocess.run([sys.executable, "-c", GC_PROBE.format(pause=pause)], capture_output=True, text=True,
                       timeout=600, check=True)
    assert p.stdout.split() == ["True", str(pause)]


BUILDING_PROBE = """
import io, sys, contextlib
from kvcargo import _jit
from kvcargo.engine import aot
_jit.COMPILE_COST_S = 0.0  # any job would pay for compiling
aot._lock().parent.mkdir(parents=True)
aot._lock().write_text("0")  # another process is building the module
from kvcargo.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main({scheduled!r})
    main({default!r})
print("numba" in sys.modules, aot.building(), aot.in_use(), file=sys.stderr)
"""


def test_runs_stay_plain_python_while_the_engine_is_built_in_the_background(tmp_path: Path) -> None:
    """Neither engine compiles just in time while a build is under way: on a fresh install a cold
    compile of the scheduled loop beside the build took minutes of a first ``kvcargo reproduce``."""
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    env.pop("KVCARGO_JIT", None)
    runs = {"scheduled": ["simulate", "--requests", "300", "--batch-policy", "chunked", "--kv-policy", "paged"],
            "default": ["simulate", "--requests", "300"]}
    p = subprocess.run([sys.executable, "-c", BUILDING_PROBE.format(**runs)], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
    assert p.stderr.strip().splitlines()[-1] == "False True False"
