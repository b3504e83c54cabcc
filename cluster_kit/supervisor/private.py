"""Folders and files the supervisor trusts: made by the job's user, writable by nobody else
(stdlib only, Python 3.8+).

The record folder sits beside the job's output, often in a shared log folder (mode
1777) where any local user may create entries first. So a folder is made with
mkdir's exclusive semantics, and one that already exists is used only when it is a
real folder (not a symbolic link), owned by this user and not writable by group or
others; a file is read only through a descriptor opened without following a link,
with the same checks on what was opened. Anything else stops the job with an
`Untrusted` error that names the path and the fix; nothing of it is read or run.
"""
from __future__ import annotations

import hashlib
import os

from cluster_kit.trainer.trust import problem

FIX = ("remove it (or have its owner remove it), or set `output:` to a folder only you can write, "
       "and submit again")


class Untrusted(RuntimeError):
    """A path the supervisor will not use; the message names it and the fix."""


def check(path: str, st: os.stat_result, kind: str) -> None:
    """Raise Untrusted unless `st` (an lstat/fstat of `path`) is a `kind` ("folder" or
    "file") of this user that group and others cannot write."""
    why = problem(st, kind)
    if why:
        raise Untrusted(f"{path} {why}: the supervisor uses only {kind}s of the job's own user that nobody "
                        f"else can write; {FIX}")


def folder(path: str) -> bool:
    """Make `path` a 0700 folder (its parent must exist), or trust the one that is there;
    True when it was made now."""
    try:
        os.mkdir(path, 0o700)
        made = True
    except FileExistsError:
        made = False
    check(path, os.lstat(path), "folder")
    return made


def read(path: str, limit: int = 64 << 20) -> bytes | None:
    """The bytes of a trusted file; None when there is none. Untrusted otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            check(path, os.lstat(path), "file")
        raise Untrusted(f"{path} cannot be read: {exc.strerror}; {FIX}")
    with os.fdopen(fd, "rb") as f:
        check(path, os.fstat(fd), "file")
        return f.read(limit)


def write(path: str, data: bytes) -> str:
    """Write `data` whole into a 0600 file in a trusted folder: a new temporary file
    (never an existing one), then a rename over `path`."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
    return path


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
