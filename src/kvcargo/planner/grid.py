"""The grid of a sweep: named axes over :class:`~kvcargo.config.SimConfig` fields.

An axis comes from ``--vary NAME=V1,V2,...`` (``NAME`` is a simulate flag without the dashes,
``rate`` or ``kv-compress``; ``START:STOP:STEP`` expands to an inclusive range; ``default``
leaves the field at its default) or from a TOML sweep file::

    [base]                     # fixed values (any simulate flag)
    model = "llama3-8b"
    [vary]                     # one list per axis
    rate = [8, 10, 12, 14]
    link = ["ib-ndr", "eth-25g"]

Every value is validated against the field's type when the grid is built (one line naming the
flag on bad input). Whether a *combination* is valid (a codec in colocated mode, a model that
does not fit) is the run's business: such a run is recorded as a failure row.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from kvcargo.config import SimConfig
from kvcargo.errors import KvcargoError, shown
from kvcargo.limits import check_ranges

FIELDS: tuple[str, ...] = tuple(SimConfig.model_fields)
"""Every configuration field, in SimConfig order (the config columns of a row)."""
NOT_SWEEPABLE = frozenset({"catalog"})
DEFAULT = "default"
"""A --vary value that leaves the field at its default (``kv-compress=default,fp8``)."""
MAX_POINTS = 1_000_000


def field_name(name: str, where: str = "--vary") -> str:
    """The SimConfig field for a user-given name (``kv-compress`` or ``kv_compress``)."""
    key = name.strip().removeprefix("--").replace("-", "_")
    if key in FIELDS and key not in NOT_SWEEPABLE:
        return key
    flags = [f.replace("_", "-") for f in FIELDS if f not in NOT_SWEEPABLE]
    close = difflib.get_close_matches(key.replace("_", "-"), flags, n=1)
    if key in NOT_SWEEPABLE:
        raise KvcargoError(f"{name!r} cannot be varied in {where} (give it as a fixed option)")
    hint = f"did you mean {close[0]}?" if close else f"valid: {', '.join(flags)}"
    raise KvcargoError(f"unknown parameter {name!r} in {where}; {hint} (the names are kvcargo simulate's flags)")


@cache
def _adapter(name: str) -> TypeAdapter:
    info = SimConfig.model_fields[name]
    ann = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(ann)


def coerce(name: str, value: Any, where: str = "--vary") -> Any:
    """A value validated (and converted: ``"8"`` → 8.0) for field ``name``."""
    if isinstance(value, str) and value.strip().lower() == DEFAULT:
        return SimConfig.model_fields[name].default
    if isinstance(value, str):
        value = value.strip()
    flag = name.replace("_", "-")
    try:
        value = _adapter(name).validate_python(value)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        raise KvcargoError(f"invalid value {shown(value)} for {flag} ({where}): {msg}") from None
    try:
        check_ranges({name: value})
    except KvcargoError as exc:
        raise KvcargoError(f"{exc} ({where})") from None
    return value


def _expand_range(text: str) -> list[str]:
    """``8:14:2`` → 8, 10, 12, 14 (inclusive; decimal arithmetic, so 0.1 steps stay exact)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise KvcargoError(f"bad range {text!r}: use START:STOP or START:STOP:STEP")
    try:
        start, stop = Decimal(parts[0]), Decimal(parts[1])
        step = Decimal(parts[2]) if len(parts) == 3 else Decimal(1)
    except InvalidOperation:
        raise KvcargoError(f"bad range {text!r}: START, STOP and STEP must be numbers") from None
    if step <= 0 or stop < start:
        raise KvcargoError(f"bad range {text!r}: needs START <= STOP and STEP > 0")
    count = int((stop - start) / step) + 1
    if count > MAX_POINTS:
        raise KvcargoError(f"range {text!r} has {count:,} values")
    return [str(start + i * step) for i in range(count)]


def parse_vary(spec: str) -> tuple[str, list[Any]]:
    """``rate=8,10,12`` → ("rate", [8.0, 10.0, 12.0]); errors name what is wrong."""
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip():
        raise KvcargoError(f"bad --vary {spec!r}: use NAME=V1,V2,... (for example rate=8,10,12)")
    key = field_name(name)
    raw = [v.strip() for v in rest.split(",")]
    if not rest.strip() or any(v == "" for v in raw):
        raise KvcargoError(f"--vary {name.strip()} has an empty value (got {rest!r}): list at least one")
    values: list[Any] = []
    for v in raw:
        if ":" in v and key not in ("workload_file",) and _looks_numeric_range(v):
            values.extend(coerce(key, x) for x in _expand_range(v))
        else:
            values.append(coerce(key, v))
    return key, values


def _looks_numeric_range(v: str) -> bool:
    return all(p.strip().replace(".", "", 1).replace("-", "", 1).isdigit() for p in v.split(":"))


@dataclass(frozen=True)
class Grid:
    """Fixed values plus axes; :meth:`points` is their cartesian product (first axis slowest)."""

    base: dict[str, Any] = field(default_factory=dict)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @property
    def varied(self) -> list[str]:
        return [name for name, _ in self.axes]

    def __len__(self) -> int:
        return math.prod(len(v) for _, v in self.axes) if self.axes else 0

    def points(self) -> list[dict[str, Any]]:
        """One dict of every field's value per run (fixed values, then the axes' values)."""
        fixed = config_values(self.base)
        out = []
        for combo in itertools.product(*(values for _, values in self.axes)):
            point = dict(fixed)
            point.update(zip(self.varied, combo))
            out.append(point)
        return out


def config_values(values: dict[str, Any]) -> dict[str, Any]:
    """Every SimConfig field: the given values, defaults for the rest (SimConfig order)."""
    return {name: values.get(name, info.default) for name, info in SimConfig.model_fields.items()}


def point_key(point: dict[str, Any]) -> str:
    """A stable id of a run: a hash of the configuration values that differ from the defaults
    (the same on every machine, and unchanged when a release adds a field with a default)."""
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in config_values(point).items()
            if v != SimConfig.model_fields[k].default}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def build(base: dict[str, Any] | None = None, vary: list[str] | tuple[str, ...] = (),
          file: str | Path | None = None) -> Grid:
    """A grid from fixed values (given flags), ``--vary`` specs and an optional TOML file."""
    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    if file is not None:
        f_base, f_axes = read_sweep_file(file)
        fixed.update(f_base)
        axes.update(f_axes)
    for name, value in (base or {}).items():
        fixed[name] = value
    for spec in vary:
        name, values = parse_vary(spec)
        if name in axes:
            raise KvcargoError(f"{name.replace('_', '-')} is varied twice")
        axes[name] = values
    if not axes:
        raise KvcargoError("empty grid: nothing to sweep (give --vary NAME=V1,V2,... or a sweep file with [vary])")
    for name, values in axes.items():
        flag = name.replace("_", "-")
        if name in fixed:
            raise KvcargoError(f"--{flag} is both fixed and varied; drop one")
        if not values:
            raise KvcargoError(f"empty grid: {flag} has no values")
        seen = set()
        for v in values:
            if v in seen:
                raise KvcargoError(f"{flag} lists {v!r} twice")
            seen.add(v)
    grid = Grid(fixed, tuple((k, tuple(v)) for k, v in axes.items()))
    if len(grid) > MAX_POINTS:
        raise KvcargoError(f"the grid has {len(grid):,} runs (more than {MAX_POINTS:,}); narrow it")
    return grid


def read_sweep_file(path: str | Path) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``[base]`` and ``[vary]`` of a TOML sweep file, validated."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvcargoError(f"sweep file {str(p)!r} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise KvcargoError(f"sweep file {str(p)!r}: {exc}") from None
    except RecursionError:
        raise KvcargoError(f"sweep file {str(p)!r}: not valid TOML (nested too deeply)") from None
    where = f"sweep file {p.name}"
    extra = set(data) - {"base", "vary"}
    if extra:
        raise KvcargoError(f"{where}: unknown table(s) {', '.join(sorted(extra))} (expected [base] and [vary])")
    base_raw, vary_raw = data.get("base", {}), data.get("vary", {})
    if not isinstance(base_raw, dict) or not isinstance(vary_raw, dict):
        raise KvcargoError(f"{where}: [base] and [vary] must be tables")
    base: dict[str, Any] = {}
    for name, value in base_raw.items():
        key = field_name(name, f"{where} [base]") if name.replace("-", "_") != "catalog" else "catalog"
        base[key] = tuple(value) if key == "catalog" else coerce(key, value, f"{where} [base]")
    axes: dict[str, list[Any]] = {}
    for name, values in vary_raw.items():
        key = field_name(name, f"{where} [vary]")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise KvcargoError(f"empty grid: {name} in {where} [vary] has no values")
        axes[key] = [coerce(key, v, f"{where} [vary]") for v in values]
    return base, axes
