"""Request traces: readers detected by content, and the transforms users apply to a replay.

Formats (the first non-blank character and the header or keys decide; the file name does not):

* **kvcargo CSV** — header ``arrival,prompt_len,output_len`` (optional ``rid``; other columns,
  e.g. those of ``simulate --requests-csv``, are ignored). Arrival in seconds, as given.
* **JSON rows** — ``[[arrival, prompt, output], ...]`` (an optional 4th element, the reference's
  session, is ignored). Arrival in seconds, as given (the reference's replay format).
* **Mooncake JSONL** — one object per line with ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids`` (ids of 512-token prompt blocks; kept on the workload).
* **Azure LLM inference 2023 CSV** — ``TIMESTAMP`` (wall clock, ``2023-11-16 18:17:03.9799600``),
  ``ContextTokens``, ``GeneratedTokens``.
* **Generic CSV / JSON Lines / JSON array of objects** — any other header or keys, with the
  columns named by ``arrival_col``, ``prompt_col``, ``output_col`` and numeric arrivals in
  ``time_unit`` (or wall-clock timestamps).

Production traces (Mooncake, Azure, generic) are re-based so the first request arrives at 0; the
two kvcargo formats keep their times, so a run written with ``--requests-csv`` or a reference JSON
replay is reproduced exactly. Requests are sorted by arrival (stable). Every problem is one
:class:`~kvcargo.errors.KvcargoError` line naming the file and, for a row, its line number.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvcargo.errors import KvcargoError
from kvcargo.limits import INT64_MAX
from kvcargo.workload.builtin import resolve_trace
from kvcargo.workload.stream import Workload

TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
"""Units of numeric arrival times: how many make a second (times are divided, exactly rounded)."""



@dataclass(frozen=True)
class Layout:
    """Where a format keeps arrival, prompt and output, and how arrival times read."""

    name: str
    arrival: str | int
    prompt: str | int
    output: str | int
    unit: str = "s"
    rebase: bool = True
    """Arrival times relative to the first request (production traces)."""
    unit_given: bool = False
    """The user named the time unit (so wall-clock timestamps in the column are an error)."""


KVCARGO_CSV = Layout("kvcargo CSV", "arrival", "prompt_len", "output_len", rebase=False)
JSON_ROWS = Layout("JSON rows", 0, 1, 2, rebase=False)
MOONCAKE = Layout("Mooncake JSONL", "timestamp", "input_length", "output_length", unit="ms")
AZURE = Layout("Azure 2023 CSV", "TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_JSON = Layout("generic JSON", "arrival", "prompt_len", "output_len")

MAPPING_HINT = "name the columns with --arrival-col, --prompt-col and --output-col"


class _RowError(Exception):
    """A problem with one row; the reader adds the file and line."""


# ----------------------------------------------------------------------------- the reader


def read_trace(path: str | Path, *, arrival_col: str | None = None, prompt_col: str | None = None,
               output_col: str | None = None, time_unit: str | None = None) -> Workload:
    """Read a trace file of any supported format (detected by content) into a :class:`Workload`.

    The ``*_col`` arguments name the columns (CSV header names or JSON keys; positions for JSON
    rows) where they differ from the detected format's; ``time_unit`` is the unit of numeric
    arrival times (``s``, ``ms``, ``us``, ``ns``; default: the format's, seconds for generic files).
    """
    path = resolve_trace(path)
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise KvcargoError(f"unknown time unit {time_unit!r}; valid choices: {', '.join(TIME_UNITS)}")
    mapping = (arrival_col, prompt_col, output_col)
    layout, rows = _parse(path, mapping)
    if any(c is not None for c in mapping) or time_unit is not None:
        layout = _mapped(layout, mapping, time_unit, str(path))
    return _build(rows, layout, str(path), path.name)


def detect(path: str | Path) -> str:
    """The name of a trace file's format (``kvcargo CSV``, ``JSON rows``, ``Mooncake JSONL``,
    ``Azure 2023 CSV``, ``generic CSV`` or ``generic JSON``), from its content."""
    return _parse(resolve_trace(path), strict=False)[0].name


def _parse(path: Path, mapping: tuple[str | None, ...] = (None, None, None),
           strict: bool = True) -> tuple[Layout, list[Row]]:
    """The file's layout and rows; the first non-blank character picks JSON array, JSON Lines or CSV."""
    text = _read_text(path)
    where = str(path)
    body = text.lstrip()
    if not body:
        raise KvcargoError(f"{where}: empty file (no requests)")
    if body[0] == "[":
        return _json_array(text, where)
    if body[0] == "{":
        return _json_lines(text, where)
    return _csv(text, where, mapping, strict)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KvcargoError(f"trace file {path}: cannot read ({exc.strerror})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise KvcargoError(f"{path}: line {line}: not UTF-8 text") from None


Row = tuple[int, Any]
"""(line number, the row: a dict or a list)."""


def _json_array(text: str, where: str) -> tuple[Layout, list[Row]]:
    """A JSON array, element by element so every row keeps its line number."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    rows: list[Row] = []
    n = len(text)
    line, seen = 1, 0  # the line number at text[seen], advanced as rows are read (not recounted)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == "]" and not rows:
            i += 1
            break
        try:
            value, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise KvcargoError(f"{where}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise _too_deep(where, line + text.count("\n", seen, i)) from None
        line += text.count("\n", seen, i)
        seen = i
        rows.append((line, value))
        i = j
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == ",":
            i += 1
            continue
        if i < n and text[i] == "]":
            i += 1
            break
        line += text.count("\n", seen, i)
        raise KvcargoError(f"{where}: line {line}: not valid JSON (expected ',' or ']' after a row)")
    if text[i:].strip():
        line += text.count("\n", seen, i)
        raise KvcargoError(f"{where}: line {line}: not valid JSON (extra data after the array)")
    if not rows:
        raise KvcargoError(f"{where}: empty JSON array (no requests)")
    if all(isinstance(v, dict) for _, v in rows):
        return GENERIC_JSON, rows
    return JSON_ROWS, rows


def _too_deep(where: str, line: int) -> KvcargoError:
    """The error for JSON nested deeper than Python's parser recurses (a row is flat)."""
    return KvcargoError(f"{where}: line {line}: not valid JSON (nested too deeply; a row is an object or a list of numbers)")


def _json_lines(text: str, where: str) -> tuple[Layout, list[Row]]:
    rows: list[Row] = []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise KvcargoError(f"{where}: line {k}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise _too_deep(where, k) from None
        if not isinstance(value, dict):
            raise KvcargoError(f"{where}: line {k}: expected a JSON object per line")
        rows.append((k, value))
    first = rows[0][1]
    if {"timestamp", "input_length", "output_length"} <= first.keys():
        return MOONCAKE, rows
    return GENERIC_JSON, rows


def _csv(text: str, where: str, mapping: tuple[str | None, ...], strict: bool = True) -> tuple[Layout, list[Row]]:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for row in reader:
        if any(c.strip() for c in row):
            header = [c.strip() for c in row]
            break
    if header is None:
        raise KvcargoError(f"{where}: empty file (no requests)")
    head_line = reader.line_num
    names = set(header)
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= names:
        layout = AZURE
    elif {"arrival", "prompt_len", "output_len"} <= names:
        layout = KVCARGO_CSV
    elif any(c is not None for c in mapping) or not strict:
        layout = Layout("generic CSV", "arrival", "prompt_len", "output_len")
    else:
        shown = ",".join(header)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise KvcargoError(
            f"{where}: line {head_line}: unrecognised trace header {shown!r}; expected "
            "arrival,prompt_len,output_len, the Azure 2023 columns TIMESTAMP,ContextTokens,"
            f"GeneratedTokens, Mooncake JSONL or JSON rows; or {MAPPING_HINT}"
        )
    rows: list[Row] = []
    width = len(header)
    for row in reader:
        if not any(c.strip() for c in row):
            continue
        if len(row) != width:
            raise KvcargoError(f"{where}: line {reader.line_num}: {len(row)} fields, the header has {width}")
        rows.append((reader.line_num, dict(zip(header, row))))
    return layout, rows


def _mapped(layout: Layout, mapping: tuple[str | None, ...], unit: str | None, where: str) -> Layout:
    """The detected layout with user-named columns and time unit."""
    cols: list[str | int] = []
    for given, default in zip(mapping, (layout.arrival, layout.prompt, layout.output)):
        if given is None:
            cols.append(default)
        elif isinstance(default, int):  # JSON rows: positions
            try:
                cols.append(int(given))
            except ValueError:
                raise KvcargoError(f"{where}: JSON rows have no named columns; give positions (0, 1, 2), "
                                   f"not {given!r}") from None
        else:
            cols.append(given)
    return Layout(layout.name, cols[0], cols[1], cols[2], unit or layout.unit, layout.rebase, unit is not None)


# -------------------------------------------------------------------------- row conversion


def _field(row: Any, col: str | int, what: str) -> Any:
    if isinstance(row, dict):
        if col not in row:
            raise _RowError(f"no {what} column {col!r}; {MAPPING_HINT}")
        return row[col]
    if isinstance(row, list):
        if not isinstance(col, int) or not -len(row) <= col < len(row):
            raise _RowError(f"expected [arrival, prompt, output] with an optional 4th element, got {_short(row)}")
        return row[col]
    raise _RowError(f"expected a row [arrival, prompt, output], got {_short(row)}")


def _short(x: Any) -> str:
    s = json.dumps(x) if not isinstance(x, str) else repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def _tokens(value: Any, what: str) -> int:
    """A token count: a whole number >= 1 (``12``, ``"12"``, ``12.0``)."""
    if isinstance(value, bool):
        raise _RowError(f"{what} must be a whole number of tokens >= 1, got {_short(value)}")
    if isinstance(value, str):
        s = value.strip()
        try:
            value = int(s)
        except ValueError:
            try:
                value = float(s)
            except ValueError:
                raise _RowError(f"{what} must be a whole number of tokens >= 1, got {_short(value)}") from None
    if isinstance(value, float):
        if not (math.isfinite(value) and value == int(value)):
            raise _RowError(f"{what} must be a whole number of tokens >= 1, got {_short(value)}")
        value = int(value)
    if not isinstance(value, int) or value < 1:
        raise _RowError(f"{what} must be a whole number of tokens >= 1, got {_short(value)}")
    if value > INT64_MAX:
        raise _RowError(f"{what} of {value:,} tokens does not fit a 64-bit integer (at most {INT64_MAX:,})")
    return value


_DATETIME = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?\s*$")


def _wallclock_ns(text: str) -> int | None:
    """Nanoseconds since 1970 of a wall-clock timestamp (exact; up to 9 fractional digits).

    Kept rather than ``numpy.datetime64``: numpy refuses a leap second (:60, read here as the next
    second's start), its nanosecond stamps wrap outside 1678–2262 (year 0 reads as 1753) and it
    deprecates UTC offsets, so the same trace would read differently."""
    m = _DATETIME.match(text)
    if m is None:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    try:
        days = dt.date(y, mo, d).toordinal() - dt.date(1970, 1, 1).toordinal()
    except ValueError:
        return None
    if h > 23 or mi > 59 or s > 60:
        return None
    frac = (m.group(7) or "").ljust(9, "0")
    ns = ((days * 24 + h) * 60 + mi) * 60 + s
    ns = ns * 1_000_000_000 + int(frac or 0)
    tz = m.group(8)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        ns -= sign * (hh * 60 + mm) * 60 * 1_000_000_000
    return ns


def _arrivals(values: list[Any], lines: list[int], layout: Layout, where: str) -> np.ndarray:
    """Arrival times in seconds: numbers in the layout's unit, or wall-clock timestamps."""
    first = values[0]
    wallclock = isinstance(first, str) and _number(first) is None and _wallclock_ns(first) is not None
    if wallclock:
        if layout.unit_given:
            raise KvcargoError(f"{where}: line {lines[0]}: --time-unit applies to numeric arrival times; "
                               f"this column holds wall-clock timestamps ({_short(first)})")
        ns = np.empty(len(values), dtype=np.int64)
        for k, (v, line) in enumerate(zip(values, lines)):
            t = _wallclock_ns(v) if isinstance(v, str) else None
            if t is None:
                raise KvcargoError(f"{where}: line {line}: arrival {_short(v)} is not a timestamp like "
                                   "2023-11-16 18:17:03.9799600")
            ns[k] = t
        return (ns - ns.min()) / 1e9
    scale = TIME_UNITS[layout.unit]
    out = np.empty(len(values), dtype=np.float64)
    for k, (v, line) in enumerate(zip(values, lines)):
        x = _number(v)
        if x is None or not math.isfinite(x):
            raise KvcargoError(f"{where}: line {line}: arrival must be a number ({layout.unit}), got {_short(v)}")
        if x < 0 and not layout.rebase:
            raise KvcargoError(f"{where}: line {line}: arrival must be >= 0 seconds, got {_short(v)}")
        out[k] = x
    if layout.rebase:
        out -= out.min()
    return out / scale if scale != 1 else out


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _build(rows: list[Row], layout: Layout, where: str, name: str) -> Workload:
    n = len(rows)
    if n == 0:
        raise KvcargoError(f"{where}: no requests (a header but no rows)")
    lines = [line for line, _ in rows]
    raw_t: list[Any] = []
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    first = rows[0][1]
    blocks: list[list[int]] | None = [] if isinstance(first, dict) and "hash_ids" in first else None
    for k, (line, row) in enumerate(rows):
        try:
            raw_t.append(_field(row, layout.arrival, "arrival"))
            prompt[k] = _tokens(_field(row, layout.prompt, "prompt"), "prompt length")
            output[k] = _tokens(_field(row, layout.output, "output"), "output length")
            if blocks is not None:
                blocks.append(_hash_ids(row.get("hash_ids", [])))
        except _RowError as exc:
            raise KvcargoError(f"{where}: line {line}: {exc}") from None
    arrival = _arrivals(raw_t, lines, layout, where)
    block_ids = block_offsets = None
    if blocks is not None and any(blocks):
        block_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blocks], out=block_offsets[1:])
        block_ids = np.fromiter((i for b in blocks for i in b), dtype=np.int64, count=int(block_offsets[-1]))
    order = np.argsort(arrival, kind="stable")
    if np.any(order != np.arange(n)):
        arrival, prompt, output = arrival[order], prompt[order], output[order]
        if block_ids is not None:
            block_ids, block_offsets = _reorder_blocks(block_ids, block_offsets, order)
    return Workload(arrival, prompt, output, source=f"{layout.name} {name}",
                    block_ids=block_ids, block_offsets=block_offsets)


def _hash_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              and -INT64_MAX - 1 <= i <= INT64_MAX for i in value):
        raise _RowError(f"hash_ids must be a list of whole numbers that fit a 64-bit integer, got {_short(value)}")
    return value


def _reorder_blocks(ids: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat block ids and offsets of requests taken in ``order``."""
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    starts = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths)
    return ids[starts + np.arange(int(new_offsets[-1]))], new_offsets


def _select(w: Workload, idx: np.ndarray, arrival: np.ndarray, source: str) -> Workload:
    """Requests ``idx`` (in order) of a workload, with new arrival times."""
    ids = offs = None
    if w.block_ids is not None:
        ids, offs = _reorder_blocks(w.block_ids, w.block_offsets, idx)
    return replace(w, arrival=arrival, prompt=w.prompt[idx], output=w.output[idx], source=source,
                   block_ids=ids, block_offsets=offs)


# ----------------------------------------------------------------------------- transforms


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds of the trace (either side may be empty) → (start, end)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise KvcargoError(f"invalid --window {text!r}: expected START:END in seconds (e.g. 600:1200, 600:, :300)")
    try:
        start = float(parts[0]) if parts[0].strip() else 0.0
        end = float(parts[1]) if parts[1].strip() else math.inf
    except ValueError:
        raise KvcargoError(f"invalid --window {text!r}: expected START:END in seconds (e.g. 600:1200)") from None
    if not (math.isfinite(start) and start >= 0 and end > start) or math.isnan(end):
        raise KvcargoError(f"invalid --window {text!r}: need 0 <= START < END")
    return start, end


def mean_rate(arrival: np.ndarray) -> float:
    """Mean arrival rate of a trace: (n − 1) / (last − first arrival), req/s."""
    span = float(arrival[-1] - arrival[0]) if len(arrival) else 0.0
    return (len(arrival) - 1) / span if span > 0 else math.nan


def transform(w: Workload, *, time_scale: float | None = None, rate: float | None = None,
              limit: int | None = None, window: str | tuple[float, float] | None = None) -> Workload:
    """Apply, in this order: ``window`` (keep requests arriving in [START, END) and start the
    clock at START), ``limit`` (the first N), then ``time_scale`` (multiply arrival times: 0.5
    replays twice as fast) or ``rate`` (scale arrival times so the mean rate is ``rate`` req/s;
    gaps keep their shape, so the burstiness — CV of inter-arrivals — is unchanged)."""
    if time_scale is not None and rate is not None:
        raise KvcargoError("--time-scale and --rate both set the replay speed: give one")
    notes = []
    arrival = w.arrival
    idx = np.arange(len(w))
    if window is not None:
        start, end = parse_window(window) if isinstance(window, str) else window
        keep = (arrival >= start) & (arrival < end)
        if not keep.any():
            raise KvcargoError(f"window {_fmt_window(start, end)} s holds no requests (the trace spans "
                               f"{arrival[0]:g}–{arrival[-1]:g} s)")
        idx = idx[keep]
        arrival = arrival[keep] - start
        notes.append(f"window {_fmt_window(start, end)}")
    if limit is not None:
        if limit < 1:
            raise KvcargoError(f"--limit must be >= 1, got {limit}")
        idx, arrival = idx[:limit], arrival[:limit]
        notes.append(f"limit {limit}")
    if time_scale is not None:
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise KvcargoError(f"--time-scale must be a positive number, got {time_scale:g}")
        arrival = arrival * time_scale
        notes.append(f"time ×{time_scale:g}")
    if rate is not None:
        if not (rate > 0 and math.isfinite(rate)):
            raise KvcargoError(f"--rate must be a positive number of requests per second, got {rate:g}")
        current = mean_rate(arrival)
        if math.isnan(current):
            raise KvcargoError("--rate needs a trace with at least two distinct arrival times")
        arrival = arrival * (current / rate)
        notes.append(f"rate {rate:g} req/s")
    if not notes:
        return w
    return _select(w, idx, np.ascontiguousarray(arrival, dtype=np.float64), f"{w.source} ({', '.join(notes)})")


def _fmt_window(start: float, end: float) -> str:
    return f"{start:g}:{'' if math.isinf(end) else f'{end:g}'}"
