"""Small derived values kept on disk in kvcargo's cache directory between processes.

A value is stored with a key: the stamp (:func:`stamp`: path, modification time and size of every
file it was derived from, the test Python applies to its own ``.pyc`` files) and the versions of
what it depends on. It is served only while that key is unchanged: an edited, added or removed
source derives it again. A missing, unreadable or unwritable cache only costs the derivation.
"""

from __future__ import annotations

import os
import pickle
import sys
import zlib
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
INSTALL = f"{zlib.crc32(str(Path(__file__).resolve().parent).encode()):08x}"
"""Names this installation's files: installations side by side keep theirs apart."""


def cache_dir() -> Path:
    """``KVCARGO_CACHE_DIR``, else ``~/.cache/kvcargo``."""
    return Path(os.environ.get("KVCARGO_CACHE_DIR") or Path.home() / ".cache" / "kvcargo")


def stamp(paths: Iterable[str | Path]) -> tuple[tuple[str, int, int], ...]:
    """Path, modification time (ns) and size of each file, in order (a missing file: -1, -1)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((str(p), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(p), -1, -1))
    return tuple(out)


def cached(name: str, key: Hashable, derive: Callable[[], T]) -> T:
    """The value stored under ``name`` if it was derived by this Python under ``key`` (the
    :func:`stamp` of its sources, and versions of what it depends on), else ``derive()``, stored
    for the next process."""
    key = (sys.version, key)
    path = cache_dir() / f"{name}-{INSTALL}.pickle"
    try:
        with open(path, "rb") as f:
            stored_key, value = pickle.load(f)
        if stored_key == key:
            return value  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - absent, truncated or written by another version: derive it again
        pass
    value = derive()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)  # concurrent processes never read a partial file
    except OSError:
        pass  # a read-only home: derived every time
    return value
