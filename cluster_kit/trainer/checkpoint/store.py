"""The checkpoint folder on disk: written whole, verified on reading (stdlib only).

Layout under the checkpoint folder (docs/architecture.md, "Checkpoints")::

    fence                      the newest attempt that has started (fence.py)
    latest                     "step-800\\n": the newest committed checkpoint
    step-800/manifest.json     step, attempt, world size, time, contents, sha256 of every file
    step-800/<name>.pt         one file per saved object (rank 0)
    step-800/rng-rank-<R>.pt   each rank's random number generators
    step-800/dcp/              a sharded state (torch.distributed.checkpoint), when saved so
    .partial-step-1200.<chain>.<attempt>/   a save in progress
    step-400.corrupt/          a checkpoint that failed verification, with set-aside.json

A save writes into its ``.partial-`` folder, fsyncs every file and the folder, renames
it to ``step-<N>`` (the commit: a reader sees all of it or none), fsyncs the parent and
replaces ``latest``. Files are 0600 and folders 0700, as they may sit on shared
storage; nothing here follows a symbolic link it did not make, and a folder owned by
another user, or writable by others, is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

FORMAT = "clusterkit.checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
SET_ASIDE = "set-aside.json"
PARTIAL = ".partial-"
STEP_NAME = re.compile(r"step-(\d+)\Z")
# A file a manifest may name: a plain name, or one level below (dcp/...).
# DCP names its index ".metadata"; "." and ".." are refused apart.
FILE_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)?\Z")
CHUNK = 8 << 20
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class CheckpointError(Exception):
    """A checkpoint folder that cannot be used as it is; the message says what to do."""


class UnsafePath(CheckpointError):
    """A path that is a symbolic link, not this user's, or writable by others."""


# --- folders and files ---------------------------------------------------------------
def check_folder(path: str) -> None:
    """Refuse ``path`` unless it is a real folder of this user that no one else can write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path} is a symbolic link; name the folder it points to")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a folder")
    if st.st_uid != os.getuid():
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
                         "use a checkpoint folder of your own")
    if st.st_mode & 0o022:
        raise UnsafePath(f"{path} can be written by others (mode {stat.S_IMODE(st.st_mode):o}); "
                         f"chmod go-w {path}")


def make_folder(path: str) -> None:
    """``path`` as a 0700 folder (parents made too), then :func:`check_folder`."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_folder(path)


class DigestWriter:
    """A file object over a descriptor that hashes what it writes (torch.save writes to it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        written = len(view)
        while view:
            view = view[os.write(self.fd, view):]
        self.size += written
        return written

    def flush(self) -> None:
        """Nothing is buffered here; :func:`write_file` fsyncs at the end."""


def write_file(folder: str, name: str, fill: Callable[[DigestWriter], object]) -> dict[str, Any]:
    """Write ``folder/name`` (0600, fsynced) with ``fill``; its manifest entry.

    A file of that name left by an earlier try of the same save is replaced.
    """
    path = os.path.join(folder, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
    try:
        writer = DigestWriter(fd)
        fill(writer)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"sha256": writer.digest.hexdigest(), "bytes": writer.size}


def write_bytes(folder: str, name: str, data: bytes) -> dict[str, Any]:
    """:func:`write_file` of a bytes object."""
    return write_file(folder, name, lambda f: f.write(data))


def file_entry(path: str) -> dict[str, Any]:
    """The manifest entry of a file written by someone else (another rank, DCP): read back."""
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path} is not a plain file")
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return {"sha256": digest.hexdigest(), "bytes": size}


def fsync_folder(path: str) -> None:
    """Make the names in ``path`` (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(folder: str, name: str, data: bytes) -> None:
    """Replace ``folder/name`` whole: a fsynced temporary file renamed over it."""
    partial = f".{name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.new"
    write_bytes(folder, partial, data)
    os.replace(os.path.join(folder, partial), os.path.join(folder, name))
    fsync_folder(folder)


def read_small(path: str, limit: int = 1 << 20) -> bytes:
    """A small file's bytes, without following a symbolic link."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


# --- saving ----------------------------------------------------------------------------
def partial_name(step: int, chain: str, attempt: int) -> str:
    """The folder a save of ``step`` by this attempt is written into before its commit."""
    return f"{PARTIAL}step-{step}{partial_suffix(chain, attempt)}"


def partial_suffix(chain: str, attempt: int) -> str:
    """How the names of one attempt's unfinished saves end."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", chain)[:64] or "-"
    return f".{safe}.{attempt}"


def make_partial(root: str, name: str) -> str:
    """The save's folder (made by whichever rank comes first), checked to be a real one."""
    path = os.path.join(root, name)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_folder(path)
    return path


def build_manifest(step: int, *, attempt: int, chain: str, world_size: int, host: str,
                   files: dict[str, dict[str, Any]], contents: dict[str, str],
                   measured: dict[str, float | None]) -> dict[str, Any]:
    """What ``manifest.json`` holds (docs/architecture.md, "Checkpoints")."""
    return {"format": FORMAT, "step": step, "attempt": attempt, "chain": chain,
            "world_size": world_size, "time": round(time.time(), 3), "host": host,
            "contents": contents, "files": files, "measured": measured}


def commit(root: str, partial: str, manifest: dict[str, Any],
           before_rename: Callable[[], None]) -> str:
    """Write the manifest, make the save durable, rename it into place; its folder name.

    ``before_rename`` (the fence check) runs last of all before the rename and stops
    the commit by raising. A ``step-<N>`` already there from an older attempt (a late
    write that got past its own check) is set aside as superseded first.
    """
    write_bytes(partial, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    for sub in sorted({n.split("/")[0] for n in manifest["files"] if "/" in n}):
        fsync_folder(os.path.join(partial, sub))
    fsync_folder(partial)
    name = f"step-{manifest['step']}"
    target = os.path.join(root, name)
    before_rename()
    if os.path.lexists(target):
        set_aside(root, name, f"superseded by attempt {manifest['attempt']}'s save of the same step",
                  suffix="superseded")
    os.rename(partial, target)
    fsync_folder(root)
    replace_file(root, LATEST, f"{name}\n".encode())
    return name


# --- reading ---------------------------------------------------------------------------
def committed(root: str) -> list[tuple[int, str]]:
    """``(step, name)`` of every committed checkpoint folder, newest first."""
    found = []
    for entry in os.scandir(root):
        match = STEP_NAME.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            found.append((int(match.group(1)), entry.name))
    return sorted(found, reverse=True)


def read_latest(root: str) -> str | None:
    """The name ``latest`` points to, when it is there and names a checkpoint."""
    try:
        name = read_small(os.path.join(root, LATEST), 256).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return name if STEP_NAME.match(name) else None


def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of a checkpoint folder, its shape checked; CheckpointError when bad."""
    try:
        manifest = json.loads(read_small(os.path.join(folder, MANIFEST)))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{MANIFEST} is not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("step"), int):
        raise CheckpointError(f"{MANIFEST} has no step or no files")
    for name, entry in files.items():
        if not FILE_NAME.match(name) or {".", ".."} & set(name.split("/")):
            raise CheckpointError(f"{MANIFEST} names {name!r}, not a file of the checkpoint")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise CheckpointError(f"{MANIFEST} has no sha256 for {name}")
    return manifest


def verify(root: str, name: str) -> str | None:
    """None when ``root/name`` is whole (its manifest's digests match), else what is wrong."""
    folder = os.path.join(root, name)
    try:
        check_folder(folder)
        manifest = read_manifest(folder)
    except CheckpointError as exc:
        return str(exc)
    if f"step-{manifest['step']}" != name:
        return f"{MANIFEST} says step {manifest['step']}"
    for file, expected in sorted(manifest["files"].items()):
        try:
            found = file_entry(os.path.join(folder, file))
        except (OSError, CheckpointError) as exc:
            return f"{file}: {exc}"
        if found["sha256"] != expected["sha256"]:
            return f"{file}: sha256 {found['sha256'][:12]} where the manifest has {expected['sha256'][:12]}"
    return None


# --- housekeeping ----------------------------------------------------------------------
def set_aside(root: str, name: str, why: str, suffix: str = "corrupt") -> str:
    """Rename ``root/name`` to ``name.<suffix>`` (``-2``, ... when taken) with set-aside.json in it."""
    target, n = f"{name}.{suffix}", 1
    while os.path.lexists(os.path.join(root, target)):
        n += 1
        target = f"{name}.{suffix}-{n}"
    os.rename(os.path.join(root, name), os.path.join(root, target))
    fsync_folder(root)
    note = {"name": name, "why": why, "time": round(time.time(), 3)}
    try:
        write_bytes(os.path.join(root, target), SET_ASIDE, json.dumps(note).encode())
    except OSError:
        pass  # the rename is what matters; the note is for people
    return target


def prune(root: str, keep: int) -> list[str]:
    """Remove all but the ``keep`` newest committed checkpoints; the names removed."""
    removed = []
    for _, name in committed(root)[keep:]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def remove_partials(root: str, keep_suffix: str = "") -> list[str]:
    """Remove the folders of saves that never committed, but those ending with ``keep_suffix``."""
    removed = []
    for entry in os.scandir(root):
        if entry.name.startswith(PARTIAL) and entry.is_dir(follow_symlinks=False):
            if keep_suffix and entry.name.endswith(keep_suffix):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed
