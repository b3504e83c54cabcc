"""The rank's own files in the control folder: 0700 folders, 0600 files, one warning per problem."""
from __future__ import annotations

import logging
import os

LOG = logging.getLogger("cluster_kit.ddp")
_LOGGED: set[str] = set()


def log_once(message: str) -> None:
    """Warn once per distinct message: a file that cannot be written must not flood the log."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        LOG.warning(message)


def make_dir(path: str) -> None:
    """A folder of this user only (0700), parents included."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def open_private(path: str, truncate: bool = True) -> int:
    """An fd for writing a 0600 file (created when missing)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier attempt keeps no wider mode
    return fd


def write_private(path: str, data: bytes) -> None:
    """Write a whole 0600 file."""
    fd = open_private(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_note(path: str, text: str) -> None:
    """A note file (``stopped``/``finished``) in its folder; a failure is warned of, never raised."""
    try:
        make_dir(os.path.dirname(path))
        write_private(path, text.encode())
    except OSError as exc:
        log_once(f"cannot write {path}: {exc}")
