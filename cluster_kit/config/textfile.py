"""Reading a file the user named as text, refusing what could hang or swamp the tool.

`read_text_file(path)` is how profiles, job files, templates and baselines are
read. It refuses, with `FILE:LINE` where a line exists and the fix:

- anything but a regular file (a directory, a FIFO, a device, a socket): the
  file is looked at with `stat` before it is opened, and opened with
  `O_NONBLOCK`, so a FIFO never blocks the command;
- a file over the size limit (`MAX_BYTES`, 1 MiB, unless the caller gives
  another), before reading it;
- bytes that are not UTF-8, naming the line of the first bad byte;
- control characters (those YAML does not allow either; tab, CR and LF are fine);
- lines longer than `MAX_LINE_CHARS` characters.

Only the standard library and the error family are used, so any reader can
share it without pulling in YAML or Jinja.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from cluster_kit.errors import InputError

MAX_BYTES = 1024 * 1024
MAX_LINE_CHARS = 10_000

# The complement of YAML 1.1's printable set (PyYAML's Reader.NON_PRINTABLE).
_CONTROL = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# What YAML counts as a line break, so that lines here agree with the parser's.
_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")

_KINDS = (
    (stat.S_ISDIR, "a directory", "name a file inside it"),
    (stat.S_ISFIFO, "a named pipe (FIFO)", "save the content to a regular file and name that"),
    (stat.S_ISCHR, "a character device", "name a regular file"),
    (stat.S_ISBLK, "a block device", "name a regular file"),
    (stat.S_ISSOCK, "a socket", "name a regular file"),
)


class TextFileError(InputError):
    """A file that cannot be read as text; knows its file and line (1 when none applies)."""

    def __init__(self, path: Path, line: int, problem: str, fix: str) -> None:
        super().__init__(f"{path}:{line}: {problem}", fix=fix)
        self.path = path
        self.line = line
        self.problem = problem


def read_text_file(path: str | Path, max_bytes: int = MAX_BYTES,
                   max_line_chars: int | None = MAX_LINE_CHARS,
                   what: str = "profile and job files") -> str:
    """The text of the regular file `path`, or TextFileError naming what is wrong.

    `what` names the kind of file in the size-limit message
    (e.g. "profile and job files are limited to 1 MiB").
    """
    path = Path(path)
    try:
        info: os.stat_result | None = os.stat(path)
    except OSError:
        info = None  # the open below says why
    except ValueError:  # a NUL or a lone surrogate: no file has that name
        raise TextFileError(path, 1, "no such file (the name holds a character no file name can)",
                            fix="check the path") from None
    _check_kind(path, info, max_bytes, what)
    data = _read_bytes(path, max_bytes, what)
    text = _decode(path, data)
    _check_characters(path, text)
    if max_line_chars is not None:
        _check_line_lengths(path, text, max_line_chars)
    return text


def size_text(size: int) -> str:
    """`1 MiB`, `64 KiB`, `25.3 MiB`: a byte count as the messages and README state it."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def _check_kind(path: Path, info: os.stat_result | None, max_bytes: int, what: str) -> None:
    if info is None:
        return
    for is_kind, kind, fix in _KINDS:
        if is_kind(info.st_mode):
            raise TextFileError(path, 1, f"is {kind}, not a regular file", fix=fix)
    if not stat.S_ISREG(info.st_mode):
        raise TextFileError(path, 1, "is not a regular file", fix="name a regular file")
    if info.st_size > max_bytes:
        raise _too_large(path, f"is {size_text(info.st_size)} ({info.st_size:,} bytes)", max_bytes, what)


def _too_large(path: Path, size: str, max_bytes: int, what: str) -> TextFileError:
    return TextFileError(path, 1, f"{size}; {what} are limited to {size_text(max_bytes)}",
                         fix="split it, or remove what clusterkit does not read")


def _read_bytes(path: Path, max_bytes: int, what: str) -> bytes:
    """At most `max_bytes` bytes of a regular file; opening never blocks."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _open_error(path, exc) from None
    try:
        info = os.fstat(fd)  # the file may have been swapped since the stat above
        _check_kind(path, info, max_bytes, what)
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise _open_error(path, exc) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while being read, or stat reports no size (/proc)
        raise _too_large(path, "is larger than the limit", max_bytes, what)
    return data


def _open_error(path: Path, exc: OSError) -> TextFileError:
    if exc.errno == errno.ENOENT:
        return TextFileError(path, 1, "no such file", fix="check the path")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return TextFileError(path, 1, "cannot read: permission denied",
                             fix=f"make it readable for this user (ls -l {path})")
    reason = exc.strerror or str(exc)
    return TextFileError(path, 1, f"cannot read: {reason}", fix="check the path and its permissions")


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = _BREAK.subn("", data[:exc.start].decode("utf-8", "replace"))[1] + 1
        raise TextFileError(path, line, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                            f"offset {exc.start}: {exc.reason})",
                            fix="save the file as UTF-8 text") from None


def _check_characters(path: Path, text: str) -> None:
    bad = _CONTROL.search(text)
    if bad is None:
        return
    line, column = line_and_column(text, bad.start())
    raise TextFileError(path, line, f"control character U+{ord(bad.group()):04X} in column {column}",
                        fix="remove it (binary content, or a paste that carried terminal codes?)")


def _check_line_lengths(path: Path, text: str, limit: int) -> None:
    start = 0
    for number, match in enumerate(_BREAK.finditer(text + "\n"), 1):
        if match.start() - start > limit:
            raise TextFileError(path, number, f"line is {match.start() - start:,} characters long; "
                                f"lines are limited to {limit:,}",
                                fix="break the value over several lines, or shorten it")
        start = match.end()


def line_and_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of `offset` in `text`, counting YAML's line breaks."""
    breaks = list(_BREAK.finditer(text, 0, offset))
    start = breaks[-1].end() if breaks else 0
    return len(breaks) + 1, offset - start + 1
