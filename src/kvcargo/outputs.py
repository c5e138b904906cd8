"""Output files: checked before any work starts, written atomically.

A run that would fail to write its result must fail at once, not after the simulation: every
output path is checked when the command starts (:func:`check_output`). Writes go to a temporary
file in the same directory that is renamed over the target only when complete
(:func:`atomic_path`), so an interrupted run never leaves a half-written file that a resumed
sweep would trust.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kvcargo.errors import KvcargoError


def check_output(path: str | Path, flag: str, suffixes: Sequence[str] = ()) -> Path:
    """``path`` as a writable output file: its directory exists and is writable, it is not a
    directory, and (when ``suffixes`` are given) it has one of them."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise KvcargoError(f"{flag} {str(p)!r}: use a file ending in {', '.join(suffixes)}")
    if p.is_dir():
        raise KvcargoError(f"{flag} {str(p)!r} is a directory: give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise KvcargoError(f"{flag} {str(p)!r}: directory {str(parent)!r} does not exist")
    try:  # the one sure test: create a file there
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise KvcargoError(f"{flag} {str(p)!r}: cannot write in {str(parent)!r} ({exc.strerror})") from None
    if p.exists() and not os.access(p, os.W_OK):
        raise KvcargoError(f"{flag} {str(p)!r}: not writable")
    return p


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix) to write; renamed over ``path`` when the
    block ends without an error, removed otherwise."""
    target = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent or ".")
    os.close(fd)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
